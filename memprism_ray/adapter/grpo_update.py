"""D2: outcome-guided grouped GRPO of the Router (paper: "Adapter", eqs. advantage, ratio,
grpo-loss; appendix A.3, A.4 Table "Training configurations", C.4).

For each task ``G`` trajectories form a group; with ``mu_g`` and ``sigma_g`` the mean and
the POPULATION standard deviation (divide by ``G``) of the group's returns,

    A_i = (R_i - mu_g) / (sigma_g + eps)   if sigma_g > eps,   else 0,

shared by every view decision of trajectory ``i`` (population std: a group with one
surviving trajectory gets A = 0 where the sample estimate would divide by zero). Failed
trajectories (a dead actor, a timeout) are left out of the moments and of the loss.

The loss over the surviving decisions ``(i, t)``, each with equal weight:

    rho = pi_theta(a | z) / pi_old(a | z)                   (pi_old: stored rollout log-prob)
    L   = - E[min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)]
          + beta_KL E[KL(pi_ref(. | z) || pi_theta(. | z))]   (exact over the 144 actions)
          - beta_H  E[H(pi_theta(. | z))]

with ``eps_low = eps_high = clip_eps`` unless both are given (Mind2Web: 0.1 / 0.15). The
ratio's log-prob is :func:`memprism_ray.router.sampling.view_log_probs` at the rollout
temperature (what the rollout's sampler recorded ``pi_old`` with). Only the planner is
updated; the encoder is frozen, so ``z`` is computed once per update, and the planner runs
in train mode ("Planner train mode", Table A.4) unless ``planner_train_mode`` is off.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from memprism_ray.adapter.checkpoint import TableA4Config, TrainerState
from memprism_ray.adapter.tables import matrix_column
from memprism_ray.config_tree import Seed
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.registry import DEFAULT_BENCHMARK
from memprism_ray.router.features import FEATURE_DIMS
from memprism_ray.router.model import ViewPolicyModel
from memprism_ray.router.sampling import view_log_probs
from memprism_ray.view_space import NUM_ACTIONS

log = logging.getLogger(__name__)

#: The statistics :meth:`GRPOUpdater.update` averages over its minibatches.
_LOSS_KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "ratio_mean", "grad_norm")
#: The step-table columns (adapter/tables.py) a batch reads besides the features.
_STEP_TABLE_COLUMNS = ("episode_id", "group_id", "view_index", "view_logprob", "traj_return", "failed")
#: The per-step fields besides the features, with their dtypes.
_STEP_COLUMNS: dict[str, torch.dtype] = {
    "action": torch.int64,
    "old_logprob": torch.float32,
    "traj_id": torch.int64,
    "group_id": torch.int64,
    "traj_return": torch.float32,
    "failed": torch.bool,
}


@dataclass
class GRPOConfig(TableA4Config):
    """D2 settings; the defaults are Table A.4's ALFWorld rows. Each benchmark's row is its own
    (:meth:`memprism_ray.benchmark.Benchmark.grpo_preset`, built by :meth:`from_row`)."""

    #: one step budget, the decision loop's: GRPO's own copy had to equal it (issue 42)
    RENAMED: ClassVar[dict[str, str]] = {"max_steps": "/agent.max_steps"}

    preset_name: str = cfg_field(DEFAULT_BENCHMARK, help="Table A.4 row these settings came from")
    lr: float = cfg_field(3e-6, help="AdamW learning rate (constant)")
    weight_decay: float = cfg_field(0.0, help="AdamW weight decay")
    clip_eps: float = cfg_field(0.2, help="symmetric ratio clip epsilon")
    clip_eps_low: float | None = cfg_field(None, help="lower clip epsilon (with clip_eps_high)")
    clip_eps_high: float | None = cfg_field(None, help="upper clip epsilon (with clip_eps_low)")
    beta_kl: float = cfg_field(0.2, help="weight of KL(pi_ref || pi_theta)")
    beta_entropy: float = cfg_field(0.003, help="weight of the entropy bonus")
    update_batch_size: int = cfg_field(512, help="view decisions per optimizer step")
    update_epochs: int = cfg_field(1, help="passes over each iteration's decisions")
    grad_norm: float = cfg_field(1.0, help="gradient-norm cap")
    lr_schedule: str = cfg_field("constant", help="learning-rate schedule (constant)")
    rollout_temperature: float = cfg_field(1.0, help="Router sampling temperature in rollouts")
    top_p: float = cfg_field(1.0, help="Router nucleus sampling in rollouts (1: off)")
    iterations: int = cfg_field(100, help="GRPO iterations (Mind2Web: training steps)")
    groups_per_iteration: int = cfg_field(8, help="task groups per iteration")
    replay_first: int = cfg_field(
        0,
        help="the last N iterations (at most iterations // 2) replay the tasks of the first N with fresh "
        "trajectory seeds, so first-N vs last-N training success compares the same tasks (0: every "
        "iteration draws its own)",
    )
    group_size: int = cfg_field(16, help="trajectories per task group")
    progress_reward_coef: float = cfg_field(0.0, help="goal-progress reward weight (ALFRED 0.2)")
    reward: str = cfg_field("success", help="the return, by name among the benchmark's rewards (Benchmark.rewards)")
    adv_eps: float = cfg_field(1e-6, help="eps of the advantage rule (threshold and denominator)")
    planner_train_mode: bool = cfg_field(True, help="dropout active in the planner during updates")
    seed: Seed = cfg_field(7, help="seed of the update shuffling and dropout")
    device: str = cfg_field("cpu", help="torch device of the learner")

    def __post_init__(self) -> None:
        if (self.clip_eps_low is None) != (self.clip_eps_high is None):
            raise ValueError("GRPOConfig: set both clip_eps_low and clip_eps_high, or neither (then clip_eps is used)")
        for name in ("clip_eps", "clip_eps_low", "clip_eps_high"):
            v = getattr(self, name)
            if v is not None and not 0.0 < v < 1.0:
                raise ValueError(f"GRPOConfig.{name} must be in (0, 1), got {v}")
        self.check_settings()
        if self.beta_kl < 0 or self.beta_entropy < 0:
            raise ValueError("GRPOConfig.beta_kl and beta_entropy must be >= 0")
        steps = ("update_batch_size", "update_epochs", "iterations", "groups_per_iteration")
        for name in steps:
            if getattr(self, name) < 1:
                raise ValueError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            # The advantage rule above: a group of one has sigma_g = 0, so every A_i is 0 (issue 40).
            raise ValueError(
                f"grpo.group_size must be at least 2: GRPO's advantage is a reward minus its group's mean, so a "
                f"group of 1 has advantage 0 and nothing trains; got {self.group_size}"
            )
        if self.replay_first < 0:
            raise ValueError(f"GRPOConfig.replay_first must be >= 0, got {self.replay_first}")
        if self.lr_schedule != "constant":
            raise ValueError(f"lr_schedule: only 'constant' (Table A.4) is supported, not {self.lr_schedule!r}")
        if not self.rollout_temperature > 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError("GRPOConfig needs rollout_temperature > 0 and top_p in (0, 1]")
        if not self.adv_eps > 0:
            raise ValueError(f"GRPOConfig.adv_eps must be > 0, got {self.adv_eps}")
        if not self.reward:
            raise ValueError("GRPOConfig.reward must name one of the benchmark's rewards (Benchmark.rewards)")

    @property
    def replayed_iterations(self) -> int:
        """``replay_first``, at most half the run (``--grpo.iterations 4`` on a preset with 5 replays 2)."""
        return min(self.replay_first, self.iterations // 2)

    @property
    def eps_low(self) -> float:
        return self.clip_eps if self.clip_eps_low is None else self.clip_eps_low

    @property
    def eps_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else torch.as_tensor(np.asarray(x))


def _as_1d(x: Any, dtype: torch.dtype, name: str) -> Tensor:
    t = _tensor(x).to(dtype)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-d, got shape {tuple(t.shape)}")
    return t


def _trajectories(returns: Any, group_ids: Any, failed_mask: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(returns with failed ones zeroed, group ids, kept mask)``, one entry per trajectory."""
    r = _as_1d(returns, torch.float64, "returns")
    gid = _as_1d(group_ids, torch.int64, "group_ids")
    failed = torch.zeros_like(gid, dtype=torch.bool)
    if failed_mask is not None:
        failed = _as_1d(failed_mask, torch.bool, "failed_mask")
    if not (r.numel() == gid.numel() == failed.numel()):
        raise ValueError(f"returns, group_ids, failed_mask lengths: {r.numel()}, {gid.numel()}, {failed.numel()}")
    return torch.where(~failed, r, torch.zeros_like(r)), gid, ~failed


def _group_moments(returns: Tensor, group_ids: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-trajectory group mean and population std, plus each unique group's (std, live count)."""
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    g = uniq.numel()
    w = keep.double()
    r = returns.double() * w
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, inverse, w)
    total = torch.zeros(g, dtype=torch.float64).index_add_(0, inverse, r)
    mean = total / count.clamp(min=1.0)
    dev = (returns.double() - mean[inverse]) ** 2 * w
    var = torch.zeros(g, dtype=torch.float64).index_add_(0, inverse, dev) / count.clamp(min=1.0)
    std = var.sqrt()
    return mean[inverse], std[inverse], std, count


def group_advantages(returns: Any, group_ids: Any, failed_mask: Any = None, eps: float = 1e-6) -> Tensor:
    """Trajectory advantages ``A_i`` (float32 [T], one per trajectory) by the module docstring's rule;
    failed trajectories get ``A = 0`` and stay out of their group's moments."""
    r, gid, keep = _trajectories(returns, group_ids, failed_mask)
    if not torch.isfinite(r[keep]).all():
        raise ValueError("returns of non-failed trajectories must be finite")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    mean, std, _, _ = _group_moments(r, gid, keep)
    adv = torch.where(std > eps, (r - mean) / (std + eps), torch.zeros_like(r))
    return torch.where(keep, adv, torch.zeros_like(adv)).float()


def group_summary(returns: Any, group_ids: Any, failed_mask: Any = None, eps: float = 1e-6) -> dict[str, float]:
    """How many groups took part and which fraction of them had ``std <= eps`` (zero advantage)."""
    r, gid, keep = _trajectories(returns, group_ids, failed_mask)
    _, _, std, count = _group_moments(r, gid, keep)
    live = count > 0
    n_live = int(live.sum())
    zero = int(((std <= eps) & live).sum())
    return {
        "num_groups": float(n_live),
        "num_groups_all_failed": float(int((~live).sum())),
        "zero_std_group_frac": zero / n_live if n_live else 0.0,
    }


def grpo_loss(
    logits: Tensor,
    actions: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    ref_logits: Tensor | None,
    *,
    clip_eps: float = 0.2,
    clip_eps_low: float | None = None,
    clip_eps_high: float | None = None,
    beta_kl: float = 0.0,
    beta_entropy: float = 0.0,
    temperature: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """eq. grpo-loss over a batch of view decisions; returns ``(loss, detached statistics)``."""
    lo = clip_eps if clip_eps_low is None else clip_eps_low
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    if logits.dim() != 2 or logits.shape[1] != NUM_ACTIONS:
        raise ValueError(f"logits must be [B, {NUM_ACTIONS}], got {tuple(logits.shape)}")
    if beta_kl > 0 and ref_logits is None:
        raise ValueError("beta_kl > 0 needs reference logits")
    logp = torch.log_softmax(logits.float(), dim=-1)
    logp_t = logp if temperature == 1.0 else view_log_probs(logits, temperature)
    new_lp = logp_t.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(new_lp - old_logprobs.float())
    adv = advantages.float()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - lo, 1.0 + hi) * adv
    surrogate = torch.minimum(unclipped, clipped)
    pg_loss = -surrogate.mean()
    probs = logp.exp()
    entropy = -(probs * logp).sum(dim=-1)
    if ref_logits is not None:
        ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(dim=-1)
    else:
        kl = torch.zeros_like(entropy)
    loss = pg_loss + beta_kl * kl.mean() - beta_entropy * entropy.mean()
    stats = {
        "pg_loss": pg_loss.detach(),
        "kl": kl.mean().detach(),
        "entropy": entropy.mean().detach(),
        "clip_frac": (clipped < unclipped).float().mean().detach(),
        "ratio_mean": ratio.mean().detach(),
    }
    return loss, stats


@dataclass
class GRPOBatch:
    """One iteration's view decisions, one row per step (:meth:`from_step_tables`); ``traj_return``
    and ``failed`` repeat the trajectory's values on each of its steps, ``old_logprob`` is the
    rollout policy's log-prob of ``action``."""

    obs: Tensor
    goal: Tensor
    window: Tensor
    stats: Tensor
    action: Tensor
    old_logprob: Tensor
    traj_id: Tensor
    group_id: Tensor
    traj_return: Tensor
    failed: Tensor

    def __post_init__(self) -> None:
        n: int | None = None
        for name, dim in FEATURE_DIMS.items():
            t = _tensor(getattr(self, name)).float()
            if t.dim() != 2 or t.shape[1] != dim:
                raise ValueError(f"GRPOBatch.{name} must be [S, {dim}], got {tuple(t.shape)}")
            if not torch.isfinite(t).all():
                raise ValueError(f"GRPOBatch.{name} contains NaN or infinite values")
            n = t.shape[0] if n is None else n
            if t.shape[0] != n:
                raise ValueError(f"GRPOBatch.{name} has {t.shape[0]} rows, obs has {n}")
            setattr(self, name, t)
        for name, dtype in _STEP_COLUMNS.items():
            t = _as_1d(getattr(self, name), dtype, f"GRPOBatch.{name}")
            if t.numel() != n:
                raise ValueError(f"GRPOBatch.{name} has {t.numel()} entries for {n} steps")
            setattr(self, name, t)
        if n and (self.action.min() < 0 or self.action.max() >= NUM_ACTIONS):
            raise ValueError(f"GRPOBatch.action must be view indices in [0, {NUM_ACTIONS})")
        live = ~self.failed
        if not torch.isfinite(self.old_logprob[live]).all() or (self.old_logprob[live] > 1e-6).any():
            raise ValueError("GRPOBatch.old_logprob must be finite log-probabilities (<= 0)")
        if not torch.isfinite(self.traj_return[live]).all():
            raise ValueError("GRPOBatch.traj_return must be finite for trajectories that did not fail")

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def trajectories(self) -> dict[str, Tensor]:
        """Per trajectory id: ``traj_id``, ``group_id``, ``return``, ``failed``, ``inverse``; raises
        if steps of one trajectory disagree on its group, return or failed flag."""
        uniq, inverse = torch.unique(self.traj_id, return_inverse=True)
        first = torch.full((uniq.numel(),), len(self), dtype=torch.int64)
        first = first.scatter_reduce(0, inverse, torch.arange(len(self)), reduce="amin")
        for name in ("group_id", "traj_return", "failed"):
            col = getattr(self, name)
            per_traj = col[first]
            same = per_traj[inverse] == col
            if name == "traj_return":
                same = same | (self.failed & per_traj[inverse].isnan())
            if not bool(same.all()):
                bad = int(self.traj_id[~same][0])
                raise ValueError(f"GRPOBatch: steps of trajectory {bad} disagree on {name}")
        return {
            "traj_id": uniq,
            "group_id": self.group_id[first],
            "return": self.traj_return[first],
            "failed": self.failed[first],
            "inverse": inverse,
        }

    @classmethod
    def from_step_tables(cls, tables: Sequence[Any]) -> GRPOBatch:
        """Concatenate the groups' step tables (:mod:`memprism_ray.adapter.tables`; ``None`` or empty
        for a group that produced none). Trajectory and group ids become integers in order of first
        appearance."""
        feats: dict[str, list[np.ndarray]] = {name: [] for name in FEATURE_DIMS}
        action, old_lp, traj, group, ret, failed = [], [], [], [], [], []
        traj_ids: dict[Any, int] = {}
        group_ids: dict[Any, int] = {}
        for t in tables:
            if t is None or t.num_rows == 0:
                continue
            for name, dim in FEATURE_DIMS.items():
                feats[name].append(matrix_column(t, f"feat_{name}", dim))
            d = t.select(list(_STEP_TABLE_COLUMNS)).to_pydict()
            for eid, gid, vi, lp, r, f in zip(*(d[name] for name in _STEP_TABLE_COLUMNS), strict=True):
                traj.append(traj_ids.setdefault(eid, len(traj_ids)))
                group.append(group_ids.setdefault(gid, len(group_ids)))
                action.append(vi)
                old_lp.append(lp)
                ret.append(r)
                failed.append(f)
        if not action:
            raise ValueError("no decisions in this iteration's groups")
        return cls(
            **{name: torch.from_numpy(np.concatenate(v)) for name, v in feats.items()},
            action=torch.tensor(action, dtype=torch.int64),
            old_logprob=torch.tensor(old_lp, dtype=torch.float32),
            traj_id=torch.tensor(traj, dtype=torch.int64),
            group_id=torch.tensor(group, dtype=torch.int64),
            traj_return=torch.tensor(ret, dtype=torch.float32),
            failed=torch.tensor(failed, dtype=torch.bool),
        )


class GRPOUpdater(TrainerState):
    """One D2 iteration's update, AdamW over the planner only (the loop is ``trainer/grpo.py``, the
    actor that holds this ``actors/learner.py``)."""

    KIND = "grpo"
    COUNTERS = ("iteration", "step")

    def __init__(self, model: ViewPolicyModel, ref_model: ViewPolicyModel | None, config: GRPOConfig) -> None:
        if ref_model is None and config.beta_kl > 0:
            raise ValueError("GRPOUpdater needs the D1 reference model when beta_kl > 0")
        if ref_model is model:
            raise ValueError("ref_model must be a separate frozen copy of the D1 model, not the trained model")
        self.ref_model = ref_model
        self._prepare(model, config, ("planner",))
        if ref_model is not None:
            ref_model.to(self.device).eval()
            ref_model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)
        self.iteration = 0
        self.step = 0

    def update(self, batch: GRPOBatch) -> dict[str, float]:
        """One D2 iteration on ``batch``; returns the statistics of the module docstring."""
        cfg = self.config
        traj = batch.trajectories()
        adv_traj = group_advantages(traj["return"], traj["group_id"], traj["failed"], cfg.adv_eps)
        summary = group_summary(traj["return"], traj["group_id"], traj["failed"], cfg.adv_eps)
        keep = ~batch.failed
        n = int(keep.sum())
        stats: dict[str, float] = {
            "iteration": float(self.iteration + 1),
            "num_steps": float(n),
            "num_trajectories": float(traj["traj_id"].numel()),
            "num_failed_excluded": float(int(traj["failed"].sum())),
            "num_failed_steps_excluded": float(len(batch) - n),
            **summary,
        }
        live_returns = traj["return"][~traj["failed"]]
        stats["mean_return"] = float(live_returns.mean()) if live_returns.numel() else 0.0
        self.iteration += 1
        if n == 0:
            log.warning("GRPO iteration %d: every trajectory failed; no update", self.iteration)
            stats.update(dict.fromkeys(_LOSS_KEYS, 0.0), ratio_mean=1.0, num_minibatches=0.0)
            stats["lr"] = float(self.scheduler.get_last_lr()[0])
            return stats
        dev = self.device
        adv = adv_traj[traj["inverse"]][keep].to(dev)
        actions = batch.action[keep].to(dev)
        old_lp = batch.old_logprob[keep].to(dev)
        inputs = [getattr(batch, k)[keep].to(dev) for k in FEATURE_DIMS]
        stats["adv_abs_mean"] = float(adv.abs().mean())
        self.model.set_mode(encoder_train=False, planner_train=cfg.planner_train_mode)
        with torch.no_grad():
            z = self.model.encode(*inputs)
            ref_logits = None
            if self.ref_model is not None:
                # D2 never trains the encoder, so the reference's encoder is normally the model's
                # own: its z_t is then reused, one encoder pass instead of two (the encoder is ~75%
                # of the Router's parameters and runs over 5 tokens); an update on 631 decisions both
                # ways: benchmarks/results/bench_router_training.json (d2_shared_z_speedup).
                if self.ref_shares_encoder():
                    ref_logits = self.ref_model.planner_logits(z)
                else:
                    ref_logits = self.ref_model(*inputs)
        totals = dict.fromkeys(_LOSS_KEYS, 0.0)
        loss_settings = {k: getattr(cfg, k) for k in ("clip_eps", "clip_eps_low", "clip_eps_high", "beta_kl")}
        loss_settings |= {"beta_entropy": cfg.beta_entropy, "temperature": cfg.rollout_temperature}
        minibatches = 0
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, generator=self.generator).to(dev)
            for start in range(0, n, cfg.update_batch_size):
                idx = order[start : start + cfg.update_batch_size]
                logits = self.model.planner_logits(z[idx])
                ref = ref_logits[idx] if ref_logits is not None else None
                loss, parts = grpo_loss(logits, actions[idx], old_lp[idx], adv[idx], ref, **loss_settings)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.step += 1
                minibatches += 1
                w = len(idx) / (n * cfg.update_epochs)
                for key, value in {**parts, "loss": loss.detach(), "grad_norm": grad_norm}.items():
                    totals[key] += float(value) * w
        stats.update(totals, num_minibatches=float(minibatches), lr=float(self.scheduler.get_last_lr()[0]))
        if not all(math.isfinite(v) for v in stats.values()):
            raise FloatingPointError(f"GRPO iteration {self.iteration} produced non-finite statistics: {stats}")
        keys = ("loss", "kl", "entropy", "clip_frac", "zero_std_group_frac")
        log.info(
            "D2 iteration %d: loss %.4f kl %.4f entropy %.3f clip %.3f zero-std groups %.2f steps %d",
            *(self.iteration, *(stats[k] for k in keys), n),
        )
        return stats

    def ref_shares_encoder(self) -> bool:
        """Whether the reference model's encoder weights equal the trained model's (checked on
        every update, a few milliseconds, so a model loaded after the updater was built is safe)."""
        if self.ref_model is None:
            return False
        ref = self.ref_model.parameter_groups()["encoder"]
        own = self.model.parameter_groups()["encoder"]
        return len(ref) == len(own) and all(
            a.shape == b.shape and a.device == b.device and torch.equal(a, b) for a, b in zip(ref, own, strict=True)
        )
