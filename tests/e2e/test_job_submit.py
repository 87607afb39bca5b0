"""End to end, the way users run it (``make run``): a real local Ray head as a subprocess,
with Ray token auth, ``ray job submit`` through the Job API, a tiny config, SUCCEEDED, then the
run directory and the metrics endpoint. The Job API refuses requests without the token and
accepts them with it; the submitted driver joins the cluster (it inherits the token). The head
shuts itself down on SIGTERM; every listener it opens is on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import stat
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from net_listeners import listeners, loopback, session_pids

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def scrape_metrics(port: int, prefix: str = "ray_memprism_") -> dict[str, float]:
    """Metric samples named ``prefix*`` on the node's Prometheus endpoint (sum over tags)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


def test_ray_job_submit_runs_the_grpo_job(
    memprism_tiny_corpus: Path, actors_reference_ckpt: Path, memprism_tiny_overrides, tmp_path: Path
) -> None:
    from memprism_ray.cluster.head import (
        auth_headers,
        new_auth_token,
        start_head,
        submit_and_wait,
    )

    token = new_auth_token()
    assert len(token) == 64 and token != new_auth_token()
    # Ray's socket paths must stay under 107 bytes: a short temp dir, removed afterwards.
    ray_tmp = Path(tempfile.mkdtemp(prefix="mpr-"))
    head = start_head(ray_tmp, num_cpus=2, dashboard_port=0, metrics_port=0, auth_token=token)
    seen: dict[str, float] = {}

    def poll(_status: str) -> None:
        with contextlib.suppress(OSError):
            seen.update(scrape_metrics(head.metrics_port))

    try:
        assert head.token_path is not None and head.token_path.read_text() == token
        assert stat.S_IMODE(head.token_path.stat().st_mode) == 0o600
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{head.address}/api/jobs/", timeout=10)
        assert refused.value.code == 401
        req = urllib.request.Request(f"{head.address}/api/version", headers=auth_headers(token))
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["ray_version"] == "2.60.0"
        out = tmp_path / "runs"
        overrides = memprism_tiny_overrides(memprism_tiny_corpus, out, "e2e")
        pairs = dict(zip(overrides[::2], overrides[1::2], strict=False))
        pairs.pop("--eval.enabled")
        pairs.pop("--run.tensorboard")
        overrides = [x for kv in pairs.items() for x in kv]
        entry = " ".join(
            [
                "python jobs/grpo_alfworld.py --config configs/local.yaml",
                *overrides,
                f"--init_checkpoint {actors_reference_ckpt}",
                "--run.checkpoint_every 2 --run.tensorboard true",
                "--eval.enabled true --eval.episodes 2 --eval.workers 1 --eval.slots 2",
                "--eval.conditions memprism,freq_random",
            ]
        )
        status, logs = submit_and_wait(
            head.address, entry, ROOT, timeout_s=900, echo=False, on_poll=poll, auth_token=token
        )
        poll("final")
        listening = [address for _, address, _ in listeners(session_pids(head.process.pid))]
        # The README's command keeps run.out_dir relative: in Ray's copy of the working dir.
        relative = entry.replace(f"--run.out_dir {out} --run.name e2e", "--run.out_dir runs --run.name rel")
        assert relative != entry
        rel_status, rel_logs = submit_and_wait(
            head.address, relative, ROOT, timeout_s=300, echo=False, auth_token=token
        )
    finally:
        head.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert status == "SUCCEEDED", logs[-4000:]
    assert rel_status == "FAILED", rel_logs[-3000:]
    assert "[grpo] error: run.out_dir 'runs' is inside Ray's temporary copy" in rel_logs
    assert "/runtime_resources/working_dir_files/_ray_pkg_" in rel_logs
    assert "Traceback" not in rel_logs and not (ROOT / "runs" / "rel").exists()
    assert "'CPU': 2.0" in logs  # the driver joined the head's cluster (with the token it inherited)
    run = out / "e2e"
    assert (run / "checkpoints" / "iter_0002" / "config.json").exists()
    assert (run / "config.yaml").exists() and list((run / "tb").glob("events.out.tfevents.*"))
    grpo = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in grpo if x["kind"] == "grpo"] == [1, 2]
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert [c["condition"] for c in summary["conditions"]] == ["memprism", "freq_random"]
    assert (run / "eval" / "memprism" / "report.md").exists()
    assert (run / "eval" / "final_table.md").read_text().startswith("| condition |")
    assert (run / "eval" / "memprism" / "manifest.json").exists()
    # The dashboard's metrics endpoint exported this project's metrics while the job ran.
    for name in ("ray_memprism_decisions", "ray_memprism_success_rate", "ray_memprism_grpo_kl"):
        assert any(k.startswith(name) for k in seen), f"{name} missing; saw {sorted(seen)[:20]}"
    # Listeners stay on loopback.
    assert listening, "could not list the head's listeners"
    assert all(loopback(address) for address in listening), listening
    assert not head.alive()
    # ray start shut its processes down itself on SIGTERM; it was not killed after a timeout.
    assert head.process.returncode is not None and head.process.returncode != -signal.SIGKILL
