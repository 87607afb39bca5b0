"""``Learner``: the central D2 learner (paper "Adapter"; appendix A.3 "Grouped GRPO
training"). It holds the Router being trained, the frozen D1 reference policy and the
GRPO trainer, turns trajectory groups into one step batch per iteration, updates the
planner and head, and writes resumable checkpoints. It runs on a GPU when the cluster has
one, else on CPU.

Data flow: the groups' step tables come as object refs straight from the rollout workers
(``update.remote(*refs)``: Ray resolves top-level refs here, the driver never fetches
them), and the planner weights leave as the object ref of ``planner_weights.remote()``,
which the rollout workers resolve themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from memprism_ray.actors.node_data import NodeData


def groups_to_batch(tables: Sequence[Any]) -> Any:
    """Concatenate the groups' step tables (``pyarrow.Table``, one per group; ``None`` for a
    group that produced none) into one :class:`GRPOBatch`.

    Trajectory and group ids become integers; the return of a trajectory repeats on its
    steps; a trajectory marked failed keeps ``failed=True`` on every step (the trainer
    leaves it out of its group's statistics and of the loss).
    """
    import torch

    from memprism_ray.adapter.grpo_update import GRPOBatch

    cols: dict[str, list[Any]] = {k: [] for k in ("obs", "goal", "window", "stats")}
    action, old_lp, traj, group, ret, failed = [], [], [], [], [], []
    traj_ids: dict[str, int] = {}
    group_ids: dict[str, int] = {}
    for t in tables:
        if t is None or t.num_rows == 0:
            continue
        for name in cols:
            flat = t.column(f"feat_{name}").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            cols[name].append(flat.reshape(t.num_rows, -1))
        d = t.select(["episode_id", "group_id", "view_index", "view_logprob", "traj_return", "failed"]).to_pydict()
        for eid, gid, vi, lp, r, f in zip(
            d["episode_id"], d["group_id"], d["view_index"], d["view_logprob"], d["traj_return"], d["failed"],
            strict=True,
        ):
            traj.append(traj_ids.setdefault(eid, len(traj_ids)))
            group.append(group_ids.setdefault(gid, len(group_ids)))
            action.append(vi)
            old_lp.append(lp)
            ret.append(r)
            failed.append(f)
    if not action:
        raise ValueError("no decisions in this iteration's groups")
    return GRPOBatch(
        **{k: torch.from_numpy(np.concatenate(v).astype(np.float32)) for k, v in cols.items()},
        action=torch.tensor(action, dtype=torch.int64),
        old_logprob=torch.tensor(old_lp, dtype=torch.float32),
        traj_id=torch.tensor(traj, dtype=torch.int64),
        group_id=torch.tensor(group, dtype=torch.int64),
        traj_return=torch.tensor(ret, dtype=torch.float32),
        failed=torch.tensor(failed, dtype=torch.bool),
    )


def state_to_numpy(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


@ray.remote(max_restarts=0)
class Learner:
    """See the module docstring. ``reference`` is the D1 checkpoint directory; ``resume``
    a D2 checkpoint directory to continue from (weights, optimizer, RNG, iteration);
    ``threads`` the torch threads of the update (0: torch's default in this worker)."""

    def __init__(
        self, grpo_config: Any, reference: str, resume: str = "", threads: int = 0, data: NodeData | None = None
    ) -> None:
        import torch

        from memprism_ray.adapter.checkpoint import load_checkpoint, load_model, resume_trainer
        from memprism_ray.adapter.grpo_update import GRPOUpdater

        # threads (rollout.learner_threads): the update runs while the rollout workers wait for
        # the new weights, so it may use more cores than the Learner reserves.
        torch.set_num_threads(threads if threads > 0 else max(1, torch.get_num_threads()))
        device = grpo_config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.config = grpo_config
        self.reference = reference  # the driver's path, as checkpoints record it
        # The checkpoints as this node has them: shipped by the driver when the run directory
        # is not here (a Learner on a worker node, issue 34).
        local = data.localize({"reference": reference, "resume": resume}) if data else {}
        reference_here, resume_here = local.get("reference", reference), local.get("resume", resume)
        ref = load_model(reference_here, map_location=device)
        if resume:
            ckpt = load_checkpoint(resume_here, map_location=device)
            model = ckpt.model
        else:
            ckpt = None
            model = load_model(reference_here, map_location=device)
        self.trainer = GRPOUpdater(model, ref, _with_device(grpo_config, device))
        if ckpt is not None:
            resume_trainer(self.trainer, ckpt)
        self.model = model

    def __repr__(self) -> str:
        trainer = getattr(self, "trainer", None)
        return f"learner: iteration {int(trainer.iteration) if trainer else 0} done"

    def iteration(self) -> int:
        return int(self.trainer.iteration)

    def place(self) -> dict[str, Any]:
        """Where the Learner runs (node id and address, pid)."""
        from memprism_ray.actors.node_data import node_place

        return node_place()

    def full_weights(self) -> dict[str, np.ndarray]:
        return state_to_numpy(self.model.state_dict())

    def planner_weights(self) -> dict[str, np.ndarray]:
        """Only what D2 changes (planner blocks and the joint head): the per-iteration broadcast."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in state_to_numpy(self.model.state_dict()).items() if k in names}

    def update(self, *steps: Any) -> dict[str, float]:
        """One GRPO update on the iteration's step tables (passed as top-level object refs,
        so Ray hands them over already resolved)."""
        return self.trainer.update(groups_to_batch(steps))

    def checkpoint(self, metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> dict:
        """A resumable D2 checkpoint as files (the driver writes them into the run directory,
        which may be on another node)."""
        import tempfile

        from memprism_ray.adapter.checkpoint import checkpoint_sha256, save_checkpoint
        from memprism_ray.pipeline.run_dir import read_files

        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(
                Path(tmp),
                self.model,
                trainer=self.trainer,
                stage="d2",
                metrics=metrics or {},
                extra={"reference": self.reference, **(extra or {})},
            )
            return {"sha256": checkpoint_sha256(tmp), "files": read_files(Path(tmp))}


def _with_device(cfg: Any, device: str) -> Any:
    from dataclasses import replace

    return replace(cfg, device=device)
