"""A local Ray started by the project's ``init_ray`` (what ``python jobs/grpo_alfworld.py``
does without a cluster) listens on 127.0.0.1 only: GCS, raylet, object manager, dashboard
and runtime-env agents, workers. Without the fix Ray 2.60 listened on ``*`` and on the
machine's interface address (``ss -ltnp``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from net_listeners import comm, decode, listeners, loopback, tree

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SCRIPT = textwrap.dedent(
    """
    import sys
    import ray  # imported before init_ray, as the job scripts do
    from memprism_ray.cluster.placement import init_ray

    init_ray("local", 1, log_to_driver=False, _temp_dir=sys.argv[1])

    @ray.remote(num_cpus=0.5)
    def pid():
        import os
        return os.getpid()

    @ray.remote(num_cpus=0.1)
    class Probe:
        def ping(self):
            return 1

    probe = Probe.remote()
    ray.get([pid.remote(), probe.ping.remote()], timeout=120)
    print("ready", flush=True)
    sys.stdin.readline()
    ray.shutdown()
    """
)


def test_decode_proc_net_addresses() -> None:
    assert str(decode("0100007F")) == "127.0.0.1"
    assert str(decode("00000000")) == "0.0.0.0"
    assert loopback(str(decode("0000000000000000FFFF00000100007F")))
    assert not loopback(str(decode("00000000000000000000000000000000")))  # "*" (::)


def test_local_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    script = tmp_path / "start_local_ray.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    for k in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(k, None)
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    # Ray's socket paths must stay short: a temp dir of its own under /tmp.
    temp = Path(os.environ.get("TMPDIR", "/tmp")) / f"mpr-l{os.getpid()}"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(temp)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        lines = []
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.strip() == "ready":
                break
        assert proc.poll() is None, "".join(lines)[-3000:]
        found = listeners(tree(proc.pid))
        names = {p: comm(p) for p, *_ in found}
    finally:
        if proc.poll() is None:
            proc.stdin.write("\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
    # GCS and raylet at least, plus the workers' and agents' gRPC servers.
    assert len(found) >= 4, found
    exposed = [(names.get(p, "?"), a, port) for p, a, port in found if not loopback(a)]
    assert not exposed, f"Ray listeners not on 127.0.0.1: {exposed}"
