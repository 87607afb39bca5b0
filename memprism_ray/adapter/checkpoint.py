"""Router checkpoints (paper: appendix A.1 "checkpoint hashes", A.2 "Models, checkpoints",
A.4 "Hardware, software, and checkpoints": "Epoch and GRPO checkpoints store the full model,
encoder, Planner, optimizer state, stage, epoch or iteration, metrics, and configuration;
exported reference or final weight-only checkpoints may omit optimizer state by design").

A checkpoint is a directory: ``model.safetensors``, ``config.json`` (RouterConfig, stage,
metrics, training config, the weights' SHA-256) and, to resume, ``state.pt`` (trainer and RNG
states, read with ``weights_only=True``), each renamed into place. For bit-identical resumption
build the model, then the trainer, then call :func:`resume_trainer` (RNG states restored last).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from memprism_ray.config_tree import check_device
from memprism_ray.io_atomic import sha256_file
from memprism_ray.router.model import RouterConfig, ViewPolicyModel

CHECKPOINT_FORMAT = "memprism-router-checkpoint"
CHECKPOINT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
STATE_FILE = "state.pt"


_C = TypeVar("_C", bound="TableA4Config")


class TableA4Config:
    """What the D1 and D2 settings share: a Table A.4 row as settings (:meth:`from_row`) and the
    optimizer checks."""

    @classmethod
    def from_row(cls: type[_C], name: str, row: Mapping[str, Any], **overrides: Any) -> _C:
        """The settings of Table A.4 row ``name`` (its values ``row``), with optional overrides."""
        return cls(**{"preset_name": name, **row, **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def check_settings(self) -> None:
        """Every number finite (a NaN ``lambda_cost`` or ``beta_kl`` passed the range checks and
        trained 50 epochs to NaN weights), the optimizer's settings, the device."""
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{type(self).__name__}.{f.name} must be a finite number, got {value}")
        if not self.lr > 0 or self.weight_decay < 0 or not self.grad_norm > 0:  # type: ignore[attr-defined]
            raise ValueError(f"{type(self).__name__} needs lr > 0, weight_decay >= 0 and grad_norm > 0")
        check_device(self.device, f"{type(self).__name__}.device", auto=True)  # type: ignore[attr-defined]


class TrainerState:
    """The resumable part of the D1 and D2 trainers: optimizer, schedule, generator, ``COUNTERS``."""

    KIND: ClassVar[str]
    COUNTERS: ClassVar[tuple[str, ...]]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    generator: torch.Generator

    def _prepare(self, model: ViewPolicyModel, config: Any, trained: tuple[str, ...]) -> None:
        """Seed torch and the shuffling generator with ``config.seed`` (construction consumes RNG:
        restore a saved state only afterwards), move the model, train only the ``trained`` groups."""
        self.model, self.config = model, config
        self.device = torch.device(config.device)
        torch.manual_seed(config.seed)
        self.generator = torch.Generator().manual_seed(config.seed)
        model.to(self.device)
        groups = model.parameter_groups()
        for name, params in groups.items():
            for p in params:
                p.requires_grad_(name in trained)
        for p in model.frozen_parameters():
            p.requires_grad_(False)
        self.params = [p for name in trained for p in groups[name]]

    def state_dict(self) -> dict[str, Any]:
        state = {
            "kind": self.KIND,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": self.generator.get_state(),
        }
        return {**state, **{name: copy.deepcopy(getattr(self, name)) for name in self.COUNTERS}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != self.KIND:
            raise ValueError(f"cannot resume a {self.KIND} trainer from a {state.get('kind')!r} trainer state")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.generator.set_state(state["generator"])
        for name in self.COUNTERS:
            setattr(self, name, copy.deepcopy(state[name]))


def capture_rng() -> dict[str, Any]:
    """Global RNG states as tensors, ints and lists only (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": int(py_version), "state": [int(x) for x in py_state], "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npst = state["numpy"]
    np.random.set_state(
        (npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
    )
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def save_checkpoint(
    path: str | Path,
    model: ViewPolicyModel,
    *,
    trainer: TrainerState | None = None,
    stage: str = "init",
    iteration: int | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory, resumable with ``trainer`` (``state.pt``); ``stage``: ``init``,
    ``d1``, ``d2`` or ``export``; ``iteration`` defaults to the trainer's epoch or iteration."""
    from safetensors.torch import save as st_save

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    weights = st_save(tensors, metadata={"format": CHECKPOINT_FORMAT})
    _tmp(out / WEIGHTS_FILE).write_bytes(weights)
    digest = hashlib.sha256(weights).hexdigest()
    if trainer is not None:
        torch.save({"trainer": trainer.state_dict(), "rng": capture_rng()}, _tmp(out / STATE_FILE))
        if iteration is None:
            iteration = int(getattr(trainer, "epoch", getattr(trainer, "iteration", 0)))
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "stage": stage,
        "iteration": int(iteration or 0),
        "router_config": model.config.to_dict(),
        "weights_file": WEIGHTS_FILE,
        "weights_sha256": digest,
        "parameter_counts": model.parameter_counts(),
        "train_config": trainer.config.to_dict() if trainer is not None else None,
        "train_config_type": type(trainer.config).__name__ if trainer is not None else None,
        "has_state": trainer is not None,
        "metrics": dict(metrics or {}),
        "extra": dict(extra or {}),
        "torch_version": torch.__version__,
    }
    _tmp(out / CONFIG_FILE).write_bytes((json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    # Everything is on disk under temporary names; swap it in with renames only.
    os.replace(_tmp(out / WEIGHTS_FILE), out / WEIGHTS_FILE)
    if trainer is not None:
        os.replace(_tmp(out / STATE_FILE), out / STATE_FILE)
    elif (out / STATE_FILE).exists():
        (out / STATE_FILE).unlink()  # weights-only export: a stale state would not match
    os.replace(_tmp(out / CONFIG_FILE), out / CONFIG_FILE)
    return out


def _checkpoints_below(root: Path, depth: int = 3, budget: int = 500) -> list[Path]:
    """Checkpoint directories (holding ``config.json``) at most ``depth`` levels below ``root``,
    sorted, looking into at most ``budget`` folders: a run directory given for one of its
    checkpoints gets them named (``checkpoints/iter_0020``, ``d1/<key>/checkpoint``)."""
    found, level = [], [root]
    for _ in range(depth):
        below = []
        for folder in level:
            try:
                below += sorted(d for d in folder.iterdir() if d.is_dir() and not d.is_symlink())
            except OSError:
                continue
            if len(below) > budget:
                return sorted(found)
        found += [d for d in below if (d / CONFIG_FILE).is_file()]
        level = below
    return sorted(found)


def trained_otherwise(meta: Mapping[str, Any], benchmark: str, encoder: Any, user: str = "this use") -> list[str]:
    """How ``user`` (``"this evaluation"``, ``"this run"``) uses a Router otherwise than it was
    trained, by the config its checkpoint records (D1 and D2 record one; ``meta``: its
    ``config.json``): on another benchmark (a transfer, or the wrong run's checkpoint), or with
    another text encoder model or ``max_length`` (its features are then not those it learned on).
    One phrase each; [] when none differs or nothing is recorded."""
    trained = (meta.get("extra") or {}).get("config") or {}
    out = []
    if trained.get("corpus.benchmark") and benchmark and trained["corpus.benchmark"] != benchmark:
        out.append(f"was trained on {trained['corpus.benchmark']}; {user} is {benchmark}")
    for key in ("model_name_or_path", "max_length"):
        if f"encoder.{key}" in trained and trained[f"encoder.{key}"] != getattr(encoder, key):
            out.append(
                f"was trained with encoder.{key} {trained[f'encoder.{key}']}; {user} encodes with "
                f"{getattr(encoder, key)}: its features differ from its training's"
            )
    return out


def read_checkpoint_meta(path: str | Path) -> dict[str, Any]:
    """``config.json`` of a checkpoint directory, format-checked (no tensors loaded)."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: not a checkpoint directory")
    cfg_path = root / CONFIG_FILE
    if not cfg_path.exists():
        below = _checkpoints_below(root)
        hint = f"; the checkpoints below it: {', '.join(map(str, below[-3:]))}" if below else ""
        more = f" (the last 3 of {len(below)})" if len(below) > 3 else ""
        raise ValueError(f"{root}: no {CONFIG_FILE}; not a memprism Router checkpoint{hint}{more}")
    try:
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cfg_path}: not valid JSON ({exc.msg})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{cfg_path}: not a {CHECKPOINT_FORMAT} file")
    if meta.get("version") != CHECKPOINT_VERSION:
        raise ValueError(f"{cfg_path}: unsupported checkpoint version {meta.get('version')!r}")
    return meta


def router_config_of(path: str | Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's ``router_config`` mapping; ``ValueError`` when it has none."""
    rc = meta.get("router_config")
    if not isinstance(rc, Mapping) or not rc:
        raise ValueError(f"{Path(path) / CONFIG_FILE}: no router_config; not a Router checkpoint (or a damaged one)")
    return dict(rc)


def verify_weights(path: str | Path, meta: Mapping[str, Any] | None = None) -> str:
    """SHA-256 of the weight file; raises if it differs from the recorded hash."""
    root = Path(path)
    meta = meta or read_checkpoint_meta(root)
    weights = root / meta.get("weights_file", WEIGHTS_FILE)
    if not weights.exists():
        raise ValueError(f"{root}: weight file {weights.name} is missing")
    digest = sha256_file(weights)
    if digest != meta.get("weights_sha256"):
        raise ValueError(
            f"{weights}: SHA-256 {digest} does not match the recorded {meta.get('weights_sha256')}; "
            "the weights were modified or the copy is corrupt"
        )
    return digest


@dataclass
class LoadedCheckpoint:
    model: ViewPolicyModel
    meta: dict[str, Any]
    state: dict[str, Any] | None


def load_checkpoint(
    path: str | Path, *, map_location: str | torch.device = "cpu", verify: bool = True, with_state: bool = True
) -> LoadedCheckpoint:
    """Build the model from a checkpoint directory (hash checked), plus its resumable state."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    meta = read_checkpoint_meta(root)
    if verify:
        verify_weights(root, meta)
    config = RouterConfig.from_dict(router_config_of(root, meta))
    model = ViewPolicyModel(config)
    try:
        tensors = load_file(str(root / meta.get("weights_file", WEIGHTS_FILE)), device=str(map_location))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{root}: cannot read the weights ({exc})") from None
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{root}: weights do not fit RouterConfig: missing {missing}, unexpected {unexpected}")
    model.to(map_location)
    state = None
    if with_state and (root / STATE_FILE).exists():
        try:
            state = torch.load(root / STATE_FILE, map_location=map_location, weights_only=True)
        except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for bad files
            raise ValueError(f"{root / STATE_FILE}: cannot load trainer state safely ({exc})") from None
    return LoadedCheckpoint(model, meta, state)


def load_model(path: str | Path, *, map_location: str | torch.device = "cpu", verify: bool = True) -> ViewPolicyModel:
    """Only the (hash-checked) ViewPolicyModel of a checkpoint, e.g. for evaluation or rollouts."""
    return load_checkpoint(path, map_location=map_location, verify=verify, with_state=False).model


def checkpoint_sha256(path: str | Path) -> str:
    """The verified SHA-256 of a checkpoint's weight file (what run manifests record)."""
    return verify_weights(path)


def resume_trainer(trainer: TrainerState, checkpoint: LoadedCheckpoint) -> None:
    """Load the trainer state and then the RNG states (call after building everything)."""
    if checkpoint.state is None:
        raise ValueError("this checkpoint holds weights only (no state.pt); it cannot resume training")
    trainer.load_state_dict(checkpoint.state["trainer"])
    apply_config_hyperparameters(trainer)
    restore_rng(checkpoint.state["rng"])


def apply_config_hyperparameters(trainer: TrainerState) -> None:
    """Make the trainer's config win over the ``lr``/``weight_decay`` the loaded optimizer and
    scheduler states restore (else a run resumed with a new ``--grpo.lr`` keeps the old one); the
    schedule's position is kept: the new rate is ``config.lr`` times its factor at that step."""
    cfg, groups, sched = trainer.config, trainer.optimizer.param_groups, trainer.scheduler
    for factor, group in zip(sched.lr_lambdas, groups, strict=True):  # LambdaLR: one lambda per group
        group["initial_lr"] = float(cfg.lr)
        group["lr"] = float(cfg.lr) * float(factor(sched.last_epoch))
        group["weight_decay"] = float(cfg.weight_decay)
    sched.base_lrs = [float(cfg.lr)] * len(groups)
    sched._last_lr = [g["lr"] for g in groups]
