"""One run directory per job: ``config.yaml``, ``metrics.jsonl``, ``tb/``, ``d1/<key>/``,
``checkpoints/iter_NNNN/`` and ``eval/`` together, and resuming from its checkpoints (the
layout and the rules: docs/architecture.md "Run directories and resume").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memprism_ray.benchmark import Benchmark
from memprism_ray.config import RESUME_FREE_KEYS, ExperimentConfig, check_run_name
from memprism_ray.config_tree import flat_settings, get_path, moved_keys, to_dict
from memprism_ray.io_atomic import LockTimeout, atomic_write_text, file_lock, naming, read_jsonl, seal_jsonl

#: The lock file a job holds in its run directory.
RUN_LOCK = ".lock"
CHECKPOINT_PREFIX = "iter_"
_CHECKPOINT_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")

# RESUME_FREE_KEYS (config.py) may differ between a checkpoint and the run resuming it; "eval"
# only shapes the final evaluation.
RESUME_FREE_SECTIONS = ("eval",)
#: Keys a later version removed whose value a checkpoint's code could not set on its own:
#: ``grpo.max_steps`` had to equal ``agent.max_steps``, ``agent.benchmark`` ``corpus.benchmark``,
#: which are compared (issue 42).
REMOVED_KEYS = frozenset({"grpo.max_steps", "agent.benchmark"})
# The config sections that produce the D1 artifacts (expert data, labels, D1 checkpoint).
D1_SECTIONS = ("corpus", "label", "encoder", "render", "agent", "policy", "router", "sft")


#: The run's metrics log, one JSON object per line (:class:`RunLogger`, :func:`read_metrics`).
METRICS = "metrics.jsonl"


class RunDirError(ValueError):
    """A run directory or ``--resume`` problem, reported as one line."""


def _warn(msg: str) -> None:
    print(f"memprism: warning: {msg}", file=sys.stderr, flush=True)


def resume_relevant_config(config: ExperimentConfig) -> dict[str, Any]:
    """The dotted settings a checkpoint's config hash covers (:data:`RESUME_FREE_KEYS` left out)."""
    flat = flat_settings(to_dict(config))
    return {
        k: v
        for k, v in sorted(flat.items())
        if k not in RESUME_FREE_KEYS and not k.startswith(tuple(s + "." for s in RESUME_FREE_SECTIONS))
    }


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def config_hash(config: ExperimentConfig) -> str:
    """SHA-256 of the settings that decide what a run computes."""
    return _digest(resume_relevant_config(config))


def checkpoint_extra(config: ExperimentConfig) -> dict[str, Any]:
    """What every D2 checkpoint records about its config (``save_checkpoint(extra=...)``)."""
    return {"config_sha256": config_hash(config), "config": resume_relevant_config(config)}


def _d1_parts(config: ExperimentConfig, benchmark: Benchmark) -> dict[str, Any]:
    """What the D1 artifacts are made from: the :data:`D1_SECTIONS`, ``run.seed``, the
    benchmark's :attr:`~memprism_ray.benchmark.Benchmark.d1_keys` and an LLM Phi's section."""
    tree = to_dict(config)
    parts = {s: tree.get(s) for s in D1_SECTIONS}
    parts["run.seed"] = tree.get("run", {}).get("seed")
    # Only the benchmark settings that make its D1 data (Mind2Web: its candidate pool, ALFWorld:
    # its training split), never its evaluation settings.
    for key in benchmark.d1_keys:
        parts[key] = to_dict(get_path(config, key))
    phi = tree.get("phi") or {}
    if phi.get("kind", "rules") != "rules":
        # D1's expert streams are re-extracted by an LLM Phi; the rule Phi keeps the keys of
        # runs made before the `phi` section existed.
        parts["phi"] = phi
    return parts


def d1_dir(run_dir: Path, config: ExperimentConfig, benchmark: Benchmark, *, create: bool = True) -> Path:
    """``run_dir/d1/<key>``, ``<key>`` 12 hex digits of the hash of what produces the D1
    artifacts (:func:`_d1_parts`, recorded in ``key.json``): never reused across configs.
    ``create=False``: the path alone, nothing written."""
    parts = _d1_parts(config, benchmark)
    key = _digest(parts)[:12]
    root = Path(run_dir) / "d1" / key
    if not create:
        return root
    root.mkdir(parents=True, exist_ok=True)
    about = root / "key.json"
    if not about.exists():
        info = {"key": key, **parts}
        atomic_write_text(about, json.dumps(info, indent=2, sort_keys=True, default=str) + "\n", overwrite=True)
    return root


def checkpoint_dir(run_dir: Path, iteration: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{iteration:04d}"


def checkpoint_iteration(path: Path) -> int:
    m = _CHECKPOINT_RE.match(Path(path).name)
    if m is None:
        raise ValueError(f"{path}: not a checkpoint directory name ({CHECKPOINT_PREFIX}NNNN)")
    return int(m.group(1))


def _checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints (config.json is written last), newest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if _CHECKPOINT_RE.match(p.name) and (p / "config.json").exists()]
    return sorted(done, key=checkpoint_iteration, reverse=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = _checkpoints(run_dir)
    return found[0] if found else None


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's metadata, after checking that its weights match the recorded SHA-256
    and that its trainer state loads; ``ValueError`` (one line) otherwise."""
    import torch

    from memprism_ray.adapter.checkpoint import STATE_FILE, read_checkpoint_meta, verify_weights

    meta = read_checkpoint_meta(path)
    verify_weights(path, meta)
    if meta.get("has_state"):
        state = Path(path) / STATE_FILE
        if not state.exists():
            raise ValueError(f"{path}: {STATE_FILE} is missing; it cannot resume training")
        try:
            torch.load(state, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
            raise ValueError(f"{state}: cannot be read ({type(exc).__name__})") from None
    return meta


def find_valid_checkpoint(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and the corrupt newer ones with their errors."""
    corrupt: list[tuple[Path, str]] = []
    for path in _checkpoints(run_dir):
        try:
            verify_checkpoint(path)
        except ValueError as exc:
            corrupt.append((path, str(exc)))
            continue
        return path, corrupt
    return None, corrupt


def set_aside_corrupt(corrupt: list[tuple[Path, str]], warn: Callable[[str], None] = _warn) -> None:
    """Rename each corrupt checkpoint ``*.corrupt`` (``.corrupt.N`` when taken), with a warning."""
    for path, error in corrupt:
        n = 0
        while (aside := path.with_name(f"{path.name}.corrupt{'' if n == 0 else '.' + str(n)}")).exists():
            n += 1
        path.rename(aside)
        warn(f"checkpoint {path.name} is corrupt ({error}); moved to {aside.name}, falling back to the previous one")


def check_resume_config(checkpoint: Path, meta: dict[str, Any], config: ExperimentConfig, allow: bool) -> list[str]:
    """The settings (dotted keys) in which ``config`` differs from the checkpoint's; raises
    unless they are none or ``allow``."""
    extra = meta.get("extra") or {}
    recorded = extra.get("config_sha256")
    if recorded == config_hash(config):
        return []
    if recorded is None:
        changed = ["(the checkpoint records no config hash)"]
    else:
        # A key made resume-free later (run.checkpoint_every) is no change either.
        # A key a later version moved to another section (its RENAMED entry) is compared under
        # its new name (e.g. ALFWorld's split names, now its own section's; issue 42).
        moved = moved_keys(ExperimentConfig)
        recorded = {moved.get(k, k): v for k, v in (extra.get("config") or {}).items()}
        old = {k: v for k, v in recorded.items() if k not in RESUME_FREE_KEYS | REMOVED_KEYS}
        new = resume_relevant_config(config)
        # A setting added by a later version of the code, at its default value, computes what the
        # checkpoint's code computed: not a change (e.g. the `phi` section, added at `kind: rules`).
        defaults = resume_relevant_config(type(config)())
        changed = [
            k
            for k in sorted(set(old) | set(new))
            if old.get(k, "<unset>") != new.get(k, "<unset>")
            and not (k not in old and k in defaults and new.get(k) == defaults[k])
        ]
        if not changed:
            return []
    if not allow:
        shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise RunDirError(
            f"--resume {checkpoint}: the config differs from the one the checkpoint was made with ({shown}); "
            "pass --run.allow_config_change true to resume with the new values"
        )
    return changed


def prepare_run_dir(
    run_dir: Path,
    resume: str,
    config: ExperimentConfig,
    *,
    warn: Callable[[str], None] = _warn,
    hold: contextlib.ExitStack | None = None,
) -> Path | None:
    """Create ``run_dir`` (fresh) or find the checkpoint to resume from; with ``hold``, the run
    directory's lock (:data:`RUN_LOCK`) is taken into it before anything is written there, so
    a second job on the same run (a resubmitted job, a second terminal) is refused in one line.

    ``resume=""`` refuses a run directory that already exists and is not empty; ``"auto"``
    returns the latest checkpoint that verifies (or ``None``); any other value is a checkpoint
    path, which must not be older than the run directory's own latest checkpoint (later ones
    would be overwritten). Errors are :class:`RunDirError` with a one-line message; the files the
    run reads besides its data (``init_checkpoint``, ``eval.marginal``) are checked here too,
    before any work (issue 40 item 3).
    """
    try:
        check_run_name(config.run.name)
    except ValueError as exc:
        raise RunDirError(str(exc)) from None
    allow = bool(config.run.allow_config_change)
    if config.init_checkpoint:  # checked now, not when the learner actor first loads it
        _check_checkpoint(Path(config.init_checkpoint), f"init_checkpoint {config.init_checkpoint}")
    if config.eval.enabled and config.eval.marginal:  # read now, not by the final evaluation after training
        from memprism_ray.trainer.evaluate import given_marginal

        given_marginal(config)
    run_dir = Path(run_dir)
    try:
        run_dir.exists()
    except OSError as exc:
        raise RunDirError(
            f"run directory {run_dir} cannot be used: {exc.strerror or exc} (check --run.out_dir)"
        ) from None
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"run directory {run_dir} exists and is not a directory")
    corrupt: list[tuple[Path, str]] = []
    if not resume:
        if run_dir.exists() and any(p.name != RUN_LOCK for p in run_dir.iterdir()):
            latest = latest_checkpoint(run_dir)
            held = f"latest checkpoint {latest.name}" if latest else "no checkpoint yet"
            raise RunDirError(
                f"run directory {run_dir} already exists ({held}); "
                "pass --resume auto to continue it or choose another --run.name"
            )
        found = None
    elif resume == "auto":
        # Found, not yet renamed: a resume refused below (changed config) leaves the run as it was.
        found, corrupt = find_valid_checkpoint(run_dir) if run_dir.is_dir() else (None, [])
    else:
        found = Path(resume)
        _check_checkpoint(found, f"--resume {resume}")
        latest = latest_checkpoint(run_dir) if run_dir.is_dir() else None
        if (
            latest is not None
            and latest.resolve() != found.resolve()
            and _CHECKPOINT_RE.match(found.name)
            and checkpoint_iteration(found) < checkpoint_iteration(latest)
        ):
            raise RunDirError(
                f"--resume {resume}: run directory {run_dir} already has the later checkpoint {latest.name}, "
                "which resuming would overwrite; resume into another --run.name"
            )
    if resume and run_dir.is_dir():
        try:  # a damaged row is refused now, not when the logger reopens the log after Ray started
            read_metrics(run_dir, warn=lambda _: None)  # a torn last row: cut and said by RunLogger
        except ValueError as exc:
            raise RunDirError(f"--resume {resume}: {exc}") from None
    if found is not None:
        from memprism_ray.adapter.checkpoint import read_checkpoint_meta

        changed = check_resume_config(found, read_checkpoint_meta(found), config, allow)
        if changed:
            warn(f"resuming {found} with a changed config (run.allow_config_change): {', '.join(changed)}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if hold is not None:
            try:  # held until the job ends; the kernel drops it when the job's process dies
                hold.enter_context(file_lock(run_dir / RUN_LOCK, 0, what="a job on this run"))
            except LockTimeout as exc:
                raise RunDirError(f"run directory {run_dir} is in use: {exc}, or choose another --run.name") from None
        write_config(run_dir, config)
    except OSError as exc:  # a path through a regular file, a read-only or virtual file system
        raise RunDirError(
            f"run directory {run_dir} cannot be created: {exc.strerror or exc} (check --run.out_dir)"
        ) from None
    set_aside_corrupt(corrupt, warn)
    return found


def _check_checkpoint(path: Path, what: str) -> None:
    """:func:`verify_checkpoint` as a one-line :class:`RunDirError` starting with ``what``."""
    if not path.is_dir():
        raise RunDirError(f"{what}: no such checkpoint directory")
    try:
        verify_checkpoint(path)
    except ValueError as exc:
        raise RunDirError(f"{what}: {exc}") from None


def write_config(run_dir: Path, config: ExperimentConfig) -> Path:
    """``run_dir/config.yaml``, atomically; a different earlier one is kept as ``config.N.yaml``."""
    import yaml

    path = run_dir / "config.yaml"
    text = yaml.safe_dump(to_dict(config), sort_keys=False)
    if path.exists():
        if path.read_text() == text:
            return path
        n = 1
        while (run_dir / f"config.{n}.yaml").exists():
            n += 1
        path.rename(run_dir / f"config.{n}.yaml")
    return atomic_write_text(path, text)


class RunLogger:
    """Appends JSON lines to ``metrics.jsonl`` and scalars to TensorBoard. With ``resume_step``
    the interrupted run's rows past it (and evaluation rows at it) move to
    ``metrics.superseded.jsonl`` and TensorBoard drops its later events: no step is logged twice.
    A row torn by a killed writer is cut off before the first append, kept in
    ``metrics.jsonl.torn`` and reported (:func:`~memprism_ray.io_atomic.seal_jsonl`): the next
    row lands whole. :func:`read_metrics` reads the log back.
    """

    SUPERSEDED = "metrics.superseded.jsonl"

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resume_step: int | None = None,
        *,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self.path = run_dir / METRICS
        self.writer = None
        self.superseded = 0
        self.warn = warn
        self.torn_bytes = seal_jsonl(self.path, "metrics", warn)
        if resume_step is not None:
            self.superseded = self._supersede(run_dir, resume_step, warn)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = {} if resume_step is None else {"purge_step": resume_step + 1}
                self.writer = SummaryWriter(str(run_dir / "tb"), **purge)
            except Exception as exc:  # TensorBoard is optional; the JSONL log is not
                print(f"memprism: TensorBoard logging off ({exc})")

    def rewind(self, step: int) -> None:
        """Back to ``step``, as a resume from it would be: a restarted Learner replays the
        iterations after its checkpoint, so their rows move to ``metrics.superseded.jsonl`` and
        TensorBoard drops their events (no step is logged twice)."""
        run_dir = self.path.parent
        self.superseded += self._supersede(run_dir, step, self.warn)
        if self.writer is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer.close()
            self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=step + 1)

    def _supersede(self, run_dir: Path, step: int, warn: Callable[[str], None]) -> int:
        if not self.path.exists():
            return 0
        keep, drop = [], []
        for row in read_metrics(run_dir, warn):
            s = int(row.get("step", 0))
            later = s > step or (row.get("kind") == "eval" and s >= step)
            (drop if later else keep).append(json.dumps(row, default=float) + "\n")
        if drop:
            superseded = run_dir / self.SUPERSEDED
            seal_jsonl(superseded, "superseded metrics", warn)
            with superseded.open("a") as fh:
                fh.writelines(drop)
            atomic_write_text(self.path, "".join(keep), overwrite=True)
            print(
                f"memprism: resuming at iteration {step}: {len(drop)} metrics rows of the interrupted run past it "
                f"moved to {self.SUPERSEDED}",
                flush=True,
            )
        return len(drop)

    def log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, "time": time.time(), **values}
        with naming(self.path), self.path.open("a") as fh:
            fh.write(json.dumps(record, default=float) + "\n")
        if self.writer is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.writer.add_scalar(f"{kind}/{k}", v, step)
            self.writer.flush()

    def note_checkpoint(self, step: int, checkpoint: Path) -> None:
        """The ``checkpoint`` row of the checkpoint a run resumes from, when the log lacks it: a
        driver killed after the checkpoint was whole and before its row was written (measured:
        the resumed run's log held the checkpoint rows ``[2]`` of ``[1, 2]``)."""
        from memprism_ray.adapter.checkpoint import read_checkpoint_meta

        rows = read_metrics(self.path.parent, self.warn) if self.path.exists() else []
        if not any(r.get("kind") == "checkpoint" and r.get("step") == step for r in rows):
            self.log("checkpoint", step, {"sha256": read_checkpoint_meta(checkpoint)["weights_sha256"]})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path, warn: Callable[[str], None] = _warn) -> list[dict[str, Any]]:
    """Every row of ``run_dir/metrics.jsonl`` (none when it does not exist): a last row torn by a
    killed writer is skipped and said through ``warn``; a damaged row elsewhere is a one-line
    ``ValueError`` naming the file and line (:func:`~memprism_ray.io_atomic.read_jsonl`)."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    rows = read_jsonl(path, "metrics", warn)
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise ValueError(f"metrics {path}: row {bad + 1} is not a JSON object: {str(rows[bad])[:60]}")
    return rows
