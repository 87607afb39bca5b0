"""``make run``: the main job on the embedded default, the way a cluster user runs it.

Starts a local Ray head (dashboard and job API on http://127.0.0.1:8265, metrics on
127.0.0.1:8080, or free ports if those are taken), submits
``python jobs/grpo_alfworld.py --config configs/local.yaml`` through ``ray job submit``'s
Job API, streams the job's logs, and stops the head it started when the job ends (SIGTERM to
``ray start``, then a sweep of its process group). Outputs land in ``runs/<name>/`` under this checkout.

Ray token authentication is on: a fresh token is generated for each head, written to a 0600
file in the head's temp dir (outside the checkout, never committed) and printed, with the
environment a CLI needs to reach the head. ``--no-auth`` (or ``RAY_AUTH_MODE=disabled`` in
the environment, e.g. ``make run RAY_AUTH_MODE=disabled``) turns it off; every listener stays
on 127.0.0.1 either way. See docs/embedded-default.md.

    python scripts/run_local.py [--config configs/local.yaml] [--keep-head] [--no-auth] [-- extra overrides]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memprism_ray.cluster.head import new_auth_token, start_head, submit_and_wait  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/local.yaml", help="job preset")
    p.add_argument("--name", default="", help="run name (default: local-<timestamp>)")
    p.add_argument("--keep-head", action="store_true", help="leave the Ray head running after the job")
    p.add_argument("--dashboard-port", type=int, default=8265, help="preferred dashboard / job API port")
    p.add_argument(
        "--no-auth", action="store_true", help="run the head without Ray token auth (also: RAY_AUTH_MODE=disabled)"
    )
    p.add_argument("overrides", nargs="*", help="extra --section.key VALUE overrides for the job (after --)")
    args = p.parse_args(argv)
    for override in args.overrides:
        key = override.split("=", 1)[0]
        # Both set below from --name: given again, the job would write a run directory other than
        # the one this script names at its end.
        if key.startswith("--") and key[2:].replace("-", "_") in ("run.name", "run.out_dir"):
            p.error(f"{key}: give the run's name with --name; its directory is runs/<name> here")

    name = args.name or time.strftime("local-%Y%m%d-%H%M%S")
    out_dir = ROOT / "runs"
    temp = Path(tempfile.mkdtemp(prefix="memprism-ray-"))
    if args.config == "configs/local.yaml":
        what = "the main job on the embedded default (local Ray head, CPU, offline game corpus)"
    else:
        # Another preset may place GPUs and read another corpus: the job's own output says which.
        what = f"jobs/grpo_alfworld.py --config {args.config} on a local Ray head"
    print(f"memprism-ray: {what}", flush=True)
    print(f"memprism-ray: starting a local Ray head (temp dir {temp})", flush=True)
    auth = not args.no_auth and os.environ.get("RAY_AUTH_MODE", "").lower() != "disabled"
    token = new_auth_token() if auth else None
    head = start_head(temp, dashboard_port=args.dashboard_port, auth_token=token)
    metrics_url = f"http://127.0.0.1:{head.metrics_port}/metrics"
    print(f"memprism-ray: Ray dashboard {head.address} ; metrics {metrics_url}", flush=True)
    if token:
        print(
            f"memprism-ray: Ray token auth on; token {token} (file {head.token_path}, mode 0600)\n"
            f"memprism-ray: CLI access: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={head.token_path} "
            f"ray job list --address {head.address} ; the dashboard asks for the token once",
            flush=True,
        )
    else:
        print("memprism-ray: Ray token auth OFF (--no-auth / RAY_AUTH_MODE=disabled); listeners on 127.0.0.1")
    entry = [
        "python",
        "jobs/grpo_alfworld.py",
        "--config",
        args.config,
        "--run.name",
        name,
        "--run.out_dir",
        str(out_dir),
        *args.overrides,
    ]
    status = "FAILED"
    try:
        status, _ = submit_and_wait(head.address, shlex.join(entry), ROOT, timeout_s=4 * 3600, auth_token=token)
    except RuntimeError as exc:
        print(f"memprism-ray: the job could not be submitted: {exc}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:  # the job is stopped (SIGTERM: it says what it kept in its log)
        status = "STOPPED"
        here = Path.cwd()  # the interpreter and this script as the user can type them from here
        again = [
            str(x.relative_to(here)) if x.is_relative_to(here) else str(x)
            for x in (Path(sys.executable), Path(__file__).resolve())
        ]
        again += ["--config", args.config, "--name", name]
        again += ["--no-auth"] if not auth else []
        again += ["--", *args.overrides, *([] if "--resume" in args.overrides else ["--resume", "auto"])]
        print(f"\nmemprism-ray: stopped (Ctrl-C); continue with: {shlex.join(again)}")  # after a progress bar
    finally:
        if args.keep_head:
            print(f"memprism-ray: head left running at {head.address} (stop it: kill -- -{head.process.pid})")
        else:
            head.stop()
    run_dir = out_dir / name
    print(f"memprism-ray: {ending(status, run_dir)}")
    summary = run_dir / "eval" / "summary.md"
    if summary.exists():
        print(summary.read_text())
    return {"SUCCEEDED": 0, "STOPPED": 130}.get(status, 1)


def ending(status: str, run_dir: Path) -> str:
    """The last line: the job's status and its run directory, or, for a job refused before it
    wrote one (a bad setting: its one line is in the log above), that nothing was written."""
    if run_dir.is_dir():
        return f"job {status}; run directory {run_dir}"
    return f"job {status}; no run directory was written ({run_dir}): the job's own line above says why"


if __name__ == "__main__":
    sys.exit(main())
