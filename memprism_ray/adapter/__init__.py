"""Adapter: view-policy learning (paper: "Adapter"; appendix A.3, A.4, D.4).

``sft`` (D1: KL to the view teacher plus expected structural cost), ``grpo`` (D2: grouped
GRPO with clipped ratio, reference KL and entropy), ``checkpoint`` (safetensors weights,
JSON config, safely loaded trainer state). The Router's other modules stay frozen.
"""

from memprism_ray.adapter.checkpoint import (
    LoadedCheckpoint,
    checkpoint_sha256,
    load_checkpoint,
    load_model,
    resume_trainer,
    save_checkpoint,
)
from memprism_ray.adapter.grpo import GRPOBatch, GRPOConfig, GRPOTrainer, group_advantages, grpo_loss
from memprism_ray.adapter.sft import SFTConfig, SFTDataset, SFTTrainer, label_decisions, sft_loss, train_sft

__all__ = [
    "GRPOBatch",
    "GRPOConfig",
    "GRPOTrainer",
    "LoadedCheckpoint",
    "SFTConfig",
    "SFTDataset",
    "SFTTrainer",
    "checkpoint_sha256",
    "group_advantages",
    "grpo_loss",
    "label_decisions",
    "load_checkpoint",
    "load_model",
    "resume_trainer",
    "save_checkpoint",
    "sft_loss",
    "train_sft",
]
