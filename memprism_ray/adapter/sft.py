"""D1: decision-conditioned initialisation (paper: "Adapter", eq. sft-loss; appendix A.3,
A.4 Table "Training configurations", D.4).

    L_SFT = KL(q_T(. | t) || pi_theta(. | z_t)) + lambda_C * sum_a pi_theta(a | z_t) C^_t(a)

averaged over a batch, with each decision's own structural cost ``C^_t``
(:func:`memprism_ray.view_space.decision_cost_vector` of its history). A.3: the head is trained
jointly with the encoder and the Planner blocks; the entity-hint head stays frozen. The dataset
(:class:`SFTDataset`) is stored as Parquet with fixed-size list columns.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from memprism_ray.adapter.checkpoint import TableA4Config, TrainerState
from memprism_ray.adapter.tables import check_metadata, fixed_list_array, matrix_column, read_parquet, schema_metadata
from memprism_ray.config_tree import Seed
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.router.features import FEATURE_DIMS, FeatureExtractor, RouterFeatures
from memprism_ray.router.model import ViewPolicyModel
from memprism_ray.router.teacher import DecisionState, TeacherError, TeacherLabel
from memprism_ray.view_space import NUM_ACTIONS, cost_vector, decision_cost_vector

log = logging.getLogger(__name__)

DATASET_FORMAT = "memprism-sft-dataset"
DATASET_VERSION = 1
#: The dataset's matrices: the four feature matrices, the teacher distribution, the cost.
_COLUMNS = (*FEATURE_DIMS, "q", "cost")


@dataclass
class SFTConfig(TableA4Config):
    """D1 optimisation settings (Table A.4). Each benchmark's row is its own
    (:meth:`memprism_ray.benchmark.Benchmark.sft_preset`, built by :meth:`from_row`)."""

    preset_name: str = cfg_field("custom", help="Table A.4 row these settings came from")
    epochs: int = cfg_field(50, help="passes over the labelled dataset")
    lr: float = cfg_field(1e-4, help="AdamW learning rate")
    weight_decay: float = cfg_field(0.01, help="AdamW weight decay")
    batch_size: int = cfg_field(256, help="decisions per optimizer step")
    grad_norm: float = cfg_field(1.0, help="gradient-norm cap")
    lambda_cost: float = cfg_field(0.02, help="weight of the expected structural cost")
    schedule: str = cfg_field("cosine", help="learning-rate schedule: cosine or constant")
    min_lr_ratio: float = cfg_field(0.01, help="final lr / lr of the cosine schedule")
    seed: Seed = cfg_field(7, help="seed of dropout and shuffling")
    bf16: bool = cfg_field(False, help="BF16 autocast (applied on CUDA; recorded on CPU)")
    device: str = cfg_field("cpu", help="torch device")

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"SFTConfig needs epochs >= 1 and batch_size >= 1, got {self.epochs}, {self.batch_size}")
        self.check_settings()
        if self.lambda_cost < 0:
            raise ValueError(f"SFTConfig.lambda_cost must be >= 0, got {self.lambda_cost}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"SFTConfig.schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"SFTConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


@dataclass
class SFTDataset:
    """Labelled D1 decisions: features ``[N, D]`` and teacher distributions ``q [N, 144]``."""

    obs: np.ndarray
    goal: np.ndarray
    window: np.ndarray
    stats: np.ndarray
    q: np.ndarray
    sample_ids: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    #: Per-decision structural cost ``C^_t(a)`` ``[N, 144]``; ``None`` (datasets written before it
    #: was recorded): the fixed tie-break cost :func:`view_space.cost_vector` on every row.
    cost: np.ndarray | None = None

    def __post_init__(self) -> None:
        n: int | None = None
        for name, dim in {**FEATURE_DIMS, "q": NUM_ACTIONS}.items():
            arr = np.ascontiguousarray(getattr(self, name), dtype=np.float32)
            if arr.ndim != 2 or arr.shape[1] != dim:
                raise ValueError(f"SFTDataset.{name} must have shape [N, {dim}], got {arr.shape}")
            n = arr.shape[0] if n is None else n
            if arr.shape[0] != n:
                raise ValueError(f"SFTDataset.{name} has {arr.shape[0]} rows, obs has {n}")
            bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
            if bad.size:
                raise ValueError(f"SFTDataset.{name} row {int(bad[0])} has NaN or infinite values")
            setattr(self, name, arr)
        neg = np.flatnonzero((self.q < 0).any(axis=1))
        if neg.size:
            raise ValueError(f"SFTDataset.q row {int(neg[0])} has negative probabilities")
        sums = self.q.astype(np.float64).sum(axis=1)
        off = np.flatnonzero(np.abs(sums - 1.0) > 1e-3)
        if off.size:
            raise ValueError(f"SFTDataset.q row {int(off[0])} sums to {sums[off[0]]:.6f}, not 1")
        # Renormalise only rows that need it, so a write/read round trip is exact.
        fix = np.abs(sums - 1.0) > 1e-6
        if fix.any():
            q = self.q.copy()
            q[fix] = (self.q[fix] / sums[fix, None]).astype(np.float32)
            self.q = q
        if self.sample_ids is not None:
            self.sample_ids = [str(s) for s in self.sample_ids]
            if len(self.sample_ids) != n:
                raise ValueError(f"SFTDataset.sample_ids has {len(self.sample_ids)} entries for {n} rows")
        if self.cost is None:
            self.cost = np.broadcast_to(np.asarray(cost_vector(), dtype=np.float32), (n or 0, NUM_ACTIONS)).copy()
        else:
            cost = np.ascontiguousarray(self.cost, dtype=np.float32)
            if cost.shape != (n, NUM_ACTIONS):
                raise ValueError(f"SFTDataset.cost must have shape [{n}, {NUM_ACTIONS}], got {cost.shape}")
            if not np.isfinite(cost).all() or (cost < 0).any():
                raise ValueError("SFTDataset.cost must be finite and >= 0")
            self.cost = cost

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    @property
    def features(self) -> RouterFeatures:
        return RouterFeatures(self.obs, self.goal, self.window, self.stats)

    @classmethod
    def from_examples(
        cls,
        examples: Sequence[tuple[RouterFeatures, TeacherLabel | np.ndarray]],
        *,
        sample_ids: Sequence[str] | None = None,
        meta: Mapping[str, Any] | None = None,
        costs: Sequence[Sequence[float]] | None = None,
    ) -> SFTDataset:
        """Stack ``(features, label)`` pairs (single decisions) into a dataset; ``costs``: each
        decision's per-action structural cost (default: the fixed tie-break cost)."""
        if not examples:
            raise ValueError("SFTDataset.from_examples needs at least one example")
        feats = RouterFeatures.stack([f for f, _ in examples])
        q = np.stack([lab.distribution if isinstance(lab, TeacherLabel) else np.asarray(lab) for _, lab in examples])
        ids = list(sample_ids) if sample_ids else None
        cost = None if costs is None else np.asarray(costs, dtype=np.float32)
        return cls(feats.obs, feats.goal, feats.window, feats.stats, q, ids, dict(meta or {}), cost)

    def subset(self, indices: Sequence[int] | np.ndarray) -> SFTDataset:
        idx = np.asarray(indices, dtype=np.int64)
        ids = [self.sample_ids[i] for i in idx] if self.sample_ids is not None else None
        return SFTDataset(**{name: getattr(self, name)[idx] for name in _COLUMNS}, sample_ids=ids, meta=dict(self.meta))

    def to_arrow(self) -> Any:
        import pyarrow as pa

        cols = {name: fixed_list_array(getattr(self, name)) for name in _COLUMNS}
        if self.sample_ids is not None:
            cols["sample_id"] = pa.array(self.sample_ids, pa.string())
        return pa.table(cols).replace_schema_metadata(schema_metadata(DATASET_FORMAT, DATASET_VERSION, self.meta))

    @classmethod
    def from_arrow(cls, table: Any) -> SFTDataset:
        meta = check_metadata(table, DATASET_FORMAT, DATASET_VERSION)
        arrays = {name: matrix_column(table, name, dim) for name, dim in {**FEATURE_DIMS, "q": NUM_ACTIONS}.items()}
        ids = table.column("sample_id").to_pylist() if "sample_id" in table.column_names else None
        cost = matrix_column(table, "cost", NUM_ACTIONS) if "cost" in table.column_names else None
        return cls(**arrays, sample_ids=ids, meta=meta, cost=cost)

    @classmethod
    def read_parquet(cls, path: str | Path) -> SFTDataset:
        table = read_parquet(path)  # its errors name the file
        try:
            return cls.from_arrow(table)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


class NoDecisionLabelled(ValueError):
    """No decision given to :func:`label_decisions` could be labelled; ``counts`` says why. A D1
    labelling task returns no rows for its episodes then: the job judges the total."""

    def __init__(self, counts: dict[str, int]) -> None:
        super().__init__(f"no decision could be labelled ({counts})")
        self.counts = counts


def label_decisions(
    states: Sequence[DecisionState],
    extractor: FeatureExtractor,
    label: Callable[[DecisionState], TeacherLabel],
    *,
    keep_fallback: bool = False,
    batch_size: int = 64,
    meta: Mapping[str, Any] | None = None,
) -> tuple[SFTDataset, dict[str, int]]:
    """The D1 dataset: Router features of each decision and its teacher label (``label``, a
    teacher call). Decisions whose teacher fails (:class:`TeacherError`) are skipped and counted,
    as are labels that fell back to the cost prior unless ``keep_fallback``."""
    counts = {"decisions": len(states), "labelled": 0, "teacher_error": 0, "fallback_skipped": 0}
    examples: list[tuple[RouterFeatures, TeacherLabel]] = []
    ids: list[str] = []
    costs: list[list[float]] = []
    for start in range(0, len(states), batch_size):
        chunk = states[start : start + batch_size]
        kept: list[tuple[DecisionState, TeacherLabel]] = []
        for state in chunk:
            try:
                lab = label(state)
            except TeacherError as exc:
                counts["teacher_error"] += 1
                log.warning("teacher failed on %s: %s", state.sample_id, exc)
                continue
            if lab.stats.get("fallback") and not keep_fallback:
                counts["fallback_skipped"] += 1
                continue
            kept.append((state, lab))
        if not kept:
            continue
        feats = extractor.features_batch(
            [s.history for s, _ in kept], [s.observation for s, _ in kept], [s.goal for s, _ in kept]
        )
        for i, (state, lab) in enumerate(kept):
            examples.append((RouterFeatures(feats.obs[i], feats.goal[i], feats.window[i], feats.stats[i]), lab))
            ids.append(state.sample_id)
            # C^_t(a) at this decision: what each view would cover of E_<t (eq. sft-loss).
            costs.append(decision_cost_vector([r.event.outcome for r in state.history]))
    counts["labelled"] = len(examples)
    if not examples:
        raise NoDecisionLabelled(counts)
    meta = {**dict(meta or {}), "counts": counts}
    return SFTDataset.from_examples(examples, sample_ids=ids, meta=meta, costs=costs), counts


def sft_loss(logits: Tensor, q: Tensor, cost: Tensor, lambda_cost: float) -> tuple[Tensor, dict[str, Tensor]]:
    """``mean_t [KL(q_t || pi_t) + lambda_C * E_{pi_t}[C^_t]]`` and its two parts (detached means);
    ``cost`` is ``[B, 144]`` or ``[144]``; ``0 log 0 = 0`` in the KL."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    q = q.float()
    kl = (torch.xlogy(q, q) - q * logp).sum(dim=-1)
    expected_cost = (logp.exp() * cost.float()).sum(dim=-1)
    loss = (kl + lambda_cost * expected_cost).mean()
    return loss, {"kl": kl.mean().detach(), "cost": expected_cost.mean().detach()}


def cosine_factor(step: int, total: int, min_ratio: float) -> float:
    """lr multiplier: 1 at step 0, ``min_ratio`` at ``total`` and after."""
    if total <= 0:
        return 1.0
    progress = min(step, total) / total
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class SFTTrainer(TrainerState):
    """Runs D1 epoch by epoch (encoder and planner learn); resumable through
    :class:`~memprism_ray.adapter.checkpoint.TrainerState`."""

    KIND = "sft"
    COUNTERS = ("epoch", "step", "history")

    def __init__(self, model: ViewPolicyModel, dataset: SFTDataset, config: SFTConfig) -> None:
        if len(dataset) == 0:
            raise ValueError("the SFT dataset is empty")
        self.dataset = dataset
        self._prepare(model, config, ("encoder", "planner"))
        # The fused AdamW kernel for the 12.7M-parameter update (a D1 step at batch 16 both ways:
        # benchmarks/results/bench_router_training.json, d1_fused_speedup).
        fused = self.device.type in ("cpu", "cuda")
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay, fused=fused)
        self.steps_per_epoch = math.ceil(len(dataset) / config.batch_size)
        self.total_steps = self.steps_per_epoch * config.epochs
        total, ratio, cosine = self.total_steps, config.min_lr_ratio, config.schedule == "cosine"
        factor = (lambda s: cosine_factor(s, total, ratio)) if cosine else (lambda s: 1.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)
        self.tensors = {name: torch.as_tensor(getattr(dataset, name), device=self.device) for name in _COLUMNS}
        self.epoch = 0
        self.step = 0
        self.history: list[dict[str, float]] = []
        self._autocast = config.bf16 and self.device.type == "cuda"
        if config.bf16 and not self._autocast:
            log.info("bf16 requested; autocast is applied on CUDA only, training in float32 on %s", self.device)

    @property
    def done(self) -> bool:
        return self.epoch >= self.config.epochs

    def train_epoch(self) -> dict[str, float]:
        """One pass over the shuffled dataset; returns the epoch's mean loss, KL, cost and lr."""
        self.model.train()
        n = len(self.dataset)
        order = torch.randperm(n, generator=self.generator).to(self.device)
        totals = {"loss": 0.0, "kl": 0.0, "cost": 0.0, "grad_norm": 0.0}
        bs = self.config.batch_size
        for start in range(0, n, bs):
            idx = order[start : start + bs]
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self._autocast):
                logits = self.model(*(self.tensors[k][idx] for k in FEATURE_DIMS))
            loss, parts = sft_loss(logits, self.tensors["q"][idx], self.tensors["cost"][idx], self.config.lambda_cost)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.step += 1
            w = len(idx) / n
            for key, value in {**parts, "loss": loss.detach(), "grad_norm": grad_norm}.items():
                totals[key] += float(value) * w
        self.epoch += 1
        lr = float(self.scheduler.get_last_lr()[0])
        metrics = {"epoch": float(self.epoch), "step": float(self.step), **totals, "lr": lr}
        self.history.append(metrics)
        log.info(
            "D1 epoch %d/%d loss %.4f kl %.4f cost %.4f lr %.2e",
            *(self.epoch, self.config.epochs, *(metrics[k] for k in ("loss", "kl", "cost", "lr"))),
        )
        return metrics

    @torch.no_grad()
    def evaluate(self, dataset: SFTDataset | None = None) -> dict[str, float]:
        """Mean loss, KL and expected cost on ``dataset`` (default: the training set), eval mode."""
        ds = dataset or self.dataset
        was_training = self.model.training
        self.model.eval()
        tensors = {k: torch.as_tensor(getattr(ds, k), device=self.device) for k in _COLUMNS}
        totals = {"loss": 0.0, "kl": 0.0, "cost": 0.0}
        n = len(ds)
        for start in range(0, n, self.config.batch_size):
            sl = slice(start, start + self.config.batch_size)
            logits = self.model(*(tensors[k][sl] for k in FEATURE_DIMS))
            loss, parts = sft_loss(logits, tensors["q"][sl], tensors["cost"][sl], self.config.lambda_cost)
            w = logits.shape[0] / n
            for key, value in {**parts, "loss": loss}.items():
                totals[key] += float(value) * w
        self.model.train(was_training)
        return totals


def train_sft(
    model: ViewPolicyModel,
    dataset: SFTDataset,
    config: SFTConfig,
    *,
    on_epoch: Callable[[SFTTrainer, dict[str, float]], None] | None = None,
    trainer: SFTTrainer | None = None,
) -> dict[str, Any]:
    """Train ``model`` for the remaining epochs of ``config`` (``trainer``: a resumed one);
    ``on_epoch(trainer, metrics)`` runs after every epoch. Returns the history and final metrics."""
    from tqdm.auto import tqdm

    trainer = trainer or SFTTrainer(model, dataset, config)
    bar = tqdm(total=config.epochs, initial=trainer.epoch, desc="D1 SFT", unit="epoch", leave=False)
    while not trainer.done:
        metrics = trainer.train_epoch()
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        if on_epoch is not None:
            on_epoch(trainer, metrics)
    bar.close()
    return {
        "epochs": trainer.epoch,
        "steps": trainer.step,
        "history": list(trainer.history),
        "final": dict(trainer.history[-1]) if trainer.history else {},
        "config": replace(config).to_dict(),
    }
