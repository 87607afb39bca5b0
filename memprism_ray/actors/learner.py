"""``Learner``: the central D2 learner (paper "Adapter"; appendix A.3 "Grouped GRPO
training"): the Router being trained, the frozen D1 reference and the GRPO update. Step
tables and weights travel as object refs the driver never fetches.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import ray

from memprism_ray.cluster.node_data import NodeData, node_place, on_this_node

if TYPE_CHECKING:
    from memprism_ray.adapter.grpo_update import GRPOConfig


def state_to_numpy(state: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


@ray.remote(max_restarts=0)
class Learner:
    """See the module docstring. ``resume``: a D2 checkpoint directory to continue from;
    ``threads``: the torch threads of the update (0: torch's default in this worker)."""

    def __init__(
        self, grpo_config: GRPOConfig, reference: str, resume: str = "", threads: int = 0, data: NodeData | None = None
    ) -> None:
        import torch

        from memprism_ray.adapter.checkpoint import resume_trainer
        from memprism_ray.adapter.grpo_update import GRPOUpdater

        # threads (rollout.learner_threads): the update runs while the rollout workers wait for
        # the new weights, so it may use more cores than the Learner reserves.
        torch.set_num_threads(threads if threads > 0 else max(1, torch.get_num_threads()))
        device = grpo_config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.config = grpo_config
        self.reference = reference  # the driver's path, as checkpoints record it
        ref, ckpt = self._load(reference, resume, device, data)
        # The policy starts as a copy of the reference: the file is read and hashed once.
        model = ckpt.model if ckpt is not None else copy.deepcopy(ref)
        self.updater = GRPOUpdater(model, ref, replace(grpo_config, device=device))
        if ckpt is not None:
            resume_trainer(self.updater, ckpt)
        self.model = model

    @staticmethod
    @on_this_node  # shipped by the driver when the run directory is not here (issue 34)
    def _load(reference: str, resume: str, device: str, data: NodeData | None) -> tuple[Any, Any]:
        """The reference Router and the checkpoint to resume (or None), as this node has them."""
        from memprism_ray.adapter.checkpoint import load_checkpoint, load_model

        ref = load_model(reference, map_location=device)
        return ref, (load_checkpoint(resume, map_location=device) if resume else None)

    def __repr__(self) -> str:
        updater = getattr(self, "updater", None)
        return f"learner: iteration {int(updater.iteration) if updater else 0} done"

    def iteration(self) -> int:
        return int(self.updater.iteration)

    def placed(self) -> dict[str, Any]:
        """Where the Learner runs (node id and address, pid)."""
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
        from memprism_ray.adapter.grpo_update import GRPOBatch

        return self.updater.update(GRPOBatch.from_step_tables(steps))

    def checkpoint(self, metrics: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> dict:
        """A resumable D2 checkpoint as files (the driver writes them into the run directory,
        which may be on another node)."""
        return checkpoint_files(self.model, self.updater, {"reference": self.reference, **(extra or {})}, metrics)


def checkpoint_files(model: Any, updater: Any, extra: dict[str, Any], metrics: dict[str, Any] | None = None) -> dict:
    """``{"sha256", "files"}`` of a D2 checkpoint of ``model`` with ``updater``'s state
    (``benchmarks/bench_checkpoint.py`` times it)."""
    import tempfile

    from memprism_ray.adapter.checkpoint import checkpoint_sha256, save_checkpoint
    from memprism_ray.io_atomic import read_files

    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp), model, trainer=updater, stage="d2", metrics=metrics or {}, extra=extra)
        return {"sha256": checkpoint_sha256(tmp), "files": read_files(Path(tmp))}
