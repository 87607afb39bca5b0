"""One run directory per job: config, logs, checkpoints and reports together.

Layout::

    <out_dir>/<name>/
      config.yaml          the resolved config tree
      metrics.jsonl        one JSON line per iteration / stage (appended, never rewritten)
      tb/                  TensorBoard event files
      d1/                  expert data, teacher labels, the D1 checkpoint (reference policy)
      checkpoints/iter_0003/   resumable D2 checkpoints
      eval/                final evaluation reports
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from memprism_ray.config_tree import to_dict

CHECKPOINT_PREFIX = "iter_"


def prepare_run_dir(run_dir: Path, resume: str, config: Any) -> Path | None:
    """Create ``run_dir`` (fresh) or find the checkpoint to resume from.

    ``resume=""`` refuses a run directory that already holds checkpoints (nothing is
    overwritten by accident); ``"auto"`` returns the latest checkpoint (or ``None`` when there
    is none yet); any other value is a checkpoint path.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    latest = latest_checkpoint(run_dir)
    if not resume:
        if latest is not None:
            raise ValueError(
                f"run directory {run_dir} already has checkpoints (latest {latest.name}); "
                "pass --resume auto to continue it or choose another --run.name"
            )
        found = None
    elif resume == "auto":
        found = latest
    else:
        found = Path(resume)
        if not (found / "config.json").exists():
            raise ValueError(f"--resume {resume}: not a checkpoint directory (no config.json)")
    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return found


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{iteration:04d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The highest-iteration complete checkpoint (its config.json written last)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return None
    done = [p for p in root.iterdir() if p.name.startswith(CHECKPOINT_PREFIX) and (p / "config.json").exists()]
    return max(done, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :])) if done else None


def checkpoint_iteration(path: Path) -> int:
    return int(path.name[len(CHECKPOINT_PREFIX) :])


class RunLogger:
    """Appends JSON lines to ``metrics.jsonl`` and scalars to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(run_dir / "tb"))
            except Exception as exc:  # TensorBoard is optional; the JSONL log is not
                print(f"memprism: TensorBoard logging off ({exc})")

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, "time": time.time(), **values}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=float) + "\n")
        if self.writer is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.writer.add_scalar(f"{kind}/{k}", v, step)
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (to ship a checkpoint across nodes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_files(files: dict[str, bytes], root: Path) -> Path:
    """Write :func:`read_files` output under ``root``; ``config.json`` last, so a crash never
    leaves a directory that looks complete (``latest_checkpoint`` keys on it)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "config.json"):
        target = root / name
        if ".." in Path(name).parts:
            raise ValueError(f"refusing to write outside {root}: {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(files[name])
        tmp.replace(target)
    return root
