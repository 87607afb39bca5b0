"""Start, probe and stop a local Ray head as a child process group (never with ``ray stop``:
every Ray process on the machine), and submit jobs to it through the Job API (``make run``, the
end-to-end test; docs/embedded-default.md). Every listener is bound to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def free_ports(*preferred: int | None) -> list[int]:
    """One free port on 127.0.0.1 per entry, all distinct: ``preferred`` where it is free, else
    any. Every socket stays bound until all are chosen: asked one at a time, the kernel handed
    out the same ephemeral port twice in a row (CI: Ray refused to start, runtime_env_agent and
    metrics_export both on 50031)."""
    held: list[socket.socket] = []
    try:
        for port in preferred:
            s = socket.socket()
            held.append(s)
            try:
                s.bind(("127.0.0.1", port or 0))
            except OSError:
                s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def new_auth_token() -> str:
    """A fresh Ray auth token: 256 random bits, hex (the format ``ray get-auth-token --generate`` writes)."""
    return secrets.token_hex(32)


def ray_bin() -> str:
    """The ``ray`` CLI of this Python's environment (a venv need not be on PATH), else ``ray``."""
    ray = Path(sys.executable).parent / "ray"
    return str(ray) if ray.exists() else "ray"


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies do not count: an orphan's zombie
    waits on whatever reaps for PID 1, which in a container may be nobody. Without ``/proc``
    (not Linux) a signal-0 probe, which counts zombies too."""
    proc_root = Path("/proc")
    if not (proc_root / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat_file in proc_root.glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process exited while we read
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def spawn(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """``cmd`` in a process group of its own (stopped by it: :func:`stop_group`), writing ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, stdin=subprocess.DEVNULL
        )


def kill_group(proc: subprocess.Popen, wait_s: float = 30.0) -> None:
    """SIGKILL the process group ``proc`` leads (``start_new_session=True``), reap ``proc`` and
    wait, at most ``wait_s`` seconds, until no process of the group runs: Ray's children may
    outlive ``ray start`` itself, and SIGKILL is delivered asynchronously, so a caller that
    starts a node on the same ports or directories right after must not find one still dying
    (CI caught a killed child still listed as running the moment ``killpg`` returned)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=wait_s)
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_group(proc: subprocess.Popen, timeout_s: float) -> None:
    """Stop a ``ray start --block`` process group: SIGTERM to ``ray start`` (it drains and stops
    its own processes), at most ``timeout_s`` seconds for it to exit, then :func:`kill_group`
    as a sweep (a ``ray start`` that already exited, crashed say, gets only the sweep, which its
    surviving children still need).

    Only ``ray start`` gets the SIGTERM: with the whole group signalled at once it waited out
    the full 30 s timeout on every run, against about 3 s when it shuts its children down
    itself (measured with Ray 2.60 on 2 cores)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)
    kill_group(proc, timeout_s)


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def head_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for the head and the CLI: explicit Ray settings, this Python first on PATH
    (a job's ``python`` entrypoint is the first on the head's PATH)."""
    from memprism_ray.actors.placement import RAY_ENV

    env = dict(os.environ)
    env.update(
        {
            **RAY_ENV,
            "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled"),
            # Keeps every Ray listener on 127.0.0.1 (measured with Ray 2.60; an internal setting).
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        }
    )
    env.pop("RAY_ADDRESS", None)
    env.update(extra or {})
    return env


@dataclass
class LocalHead:
    """A running local head."""

    process: subprocess.Popen
    dashboard_port: int
    metrics_port: int
    temp_dir: Path
    log_path: Path
    auth_token: str | None = None
    token_path: Path | None = None

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the head (:func:`stop_group`; Ray drains for up to 30 s, so ``timeout`` is longer)."""
        stop_group(self.process, timeout)


def start_head(
    temp_dir: Path,
    *,
    num_cpus: int | None = None,
    dashboard_port: int = 8265,
    metrics_port: int = 8080,
    timeout_s: float = 120.0,
    auth_token: str | None = None,
) -> LocalHead:
    """Start ``ray start --head --block`` in a new process group and wait until the job API
    answers. Ports that are taken are replaced by free ones (the chosen ports are on the
    returned object)."""
    temp_dir = Path(temp_dir).resolve()
    temp_dir.mkdir(parents=True, exist_ok=True)
    auth_env = {"RAY_AUTH_MODE": "disabled"}
    token_path = None
    if auth_token:  # a file only its owner can read (created 0600, never world-readable in between)
        token_path = temp_dir / "auth_token"
        with os.fdopen(os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write(auth_token)
        os.chmod(token_path, 0o600)
        auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    # Every other fixed default port too: a Ray already running on this machine (an in-process
    # one in the same test session, say) holds 52365, 10001, ...
    dash, met, gcs, agent, agent_grpc, runtime_env, client = free_ports(
        dashboard_port, metrics_port, 6379, 52365, None, None, 10001
    )
    cmd = [
        ray_bin(),
        "start",
        "--head",
        "--block",
        f"--port={gcs}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime_env}",
        f"--ray-client-server-port={client}",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--metrics-export-port={met}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=true",
        "--disable-usage-stats",
    ]
    if num_cpus:
        cmd.append(f"--num-cpus={num_cpus}")
    log_path = temp_dir / "head.log"
    proc = spawn(cmd, log_path, head_env(auth_env))
    head = LocalHead(proc, dash, met, temp_dir, log_path, auth_token or None, token_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not head.alive():
            raise RuntimeError(f"the Ray head exited while starting; see {log_path}:\n{log_path.read_text()[-2000:]}")
        try:
            req = urllib.request.Request(f"{head.address}/api/version", headers=auth_headers(head.auth_token))
            with urllib.request.urlopen(req, timeout=2) as r:
                if r.status == 200:
                    return head
        except OSError:
            time.sleep(1.0)
    head.stop()
    raise TimeoutError(f"the Ray head did not answer on {head.address} within {timeout_s:.0f}s; see {log_path}")


def submit_and_wait(
    address: str,
    entrypoint: str,
    working_dir: Path,
    *,
    timeout_s: float = 3600.0,
    echo: bool = True,
    env_vars: dict[str, str] | None = None,
    on_poll: Callable[[str], None] | None = None,
    auth_token: str | None = None,
    agent_wait_s: float = 600.0,
) -> tuple[str, str]:
    """Submit a job through the Job API, stream its logs, wait for a terminal status:
    ``(status, logs)``. ``agent_wait_s``: how long the head's job agent may take to accept it."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from memprism_ray.actors.placement import RAY_ENV

    client = JobSubmissionClient(address, headers=auth_headers(auth_token) or None)
    runtime_env = {
        "working_dir": str(working_dir),
        # The head's own auth mode applies to the job: never the default "disabled".
        "env_vars": {**{k: v for k, v in RAY_ENV.items() if k != "RAY_AUTH_MODE"}, **(env_vars or {})},
        "excludes": [".venv", "runs", ".git", "**/__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"],
    }
    job_id = None
    start = time.monotonic()
    next_note = start + 30.0
    while job_id is None:
        try:
            job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        except RuntimeError as exc:
            if "status code 413" in str(exc):
                # Ray reads .gitignore and the excludes above, not .git/info/exclude: a large
                # untracked folder in the checkout made the upload 726 MiB (measured).
                raise RuntimeError(
                    f"{exc}\nthe job uploads {working_dir} as its working_dir and the upload is too large: "
                    "move large files out of the checkout, or list them in its .gitignore or a .rayignore"
                ) from exc
            # The job API answers before the head's dashboard agent is up: retry that one case.
            # On a loaded 2-core machine the agent took over 120 s to come up (a make run
            # beside the test suite), so the wait is agent_wait_s, with a note every 30 s.
            if "No available agent" not in str(exc):
                raise
            waited = time.monotonic() - start
            if waited > agent_wait_s:
                raise RuntimeError(
                    f"the Ray head at {address} has no job agent after {waited:.0f} s (agent_wait_s="
                    f"{agent_wait_s:.0f}); is the machine overloaded? The head's logs are under its temp dir"
                ) from exc
            if echo and time.monotonic() >= next_note:
                print(f"waiting for the head's job agent ({waited:.0f} s so far)", flush=True)
                next_note += 30.0
            time.sleep(2.0)
    if echo:
        print(f"submitted job {job_id} to {address}; dashboard: {address}/#/jobs/{job_id}", flush=True)
    deadline = time.monotonic() + timeout_s
    shown = 0
    terminal = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    while True:
        logs = client.get_job_logs(job_id)
        if echo and len(logs) > shown:
            sys.stdout.write(logs[shown:])
            sys.stdout.flush()
            shown = len(logs)
        status = client.get_job_status(job_id)
        if on_poll is not None:
            on_poll(str(status))
        if status in terminal:
            break
        if time.monotonic() > deadline:
            client.stop_job(job_id)
            raise TimeoutError(f"job {job_id} did not finish within {timeout_s:.0f}s")
        time.sleep(2.0)
    logs = client.get_job_logs(job_id)
    if echo and len(logs) > shown:
        sys.stdout.write(logs[shown:])
    return str(status.value if hasattr(status, "value") else status), logs
