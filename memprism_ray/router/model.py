"""ViewPolicyModel: the Router network (paper: "Router", eq. view-policy; appendix A.2, D.4).

A.2: "Four independent linear layers project e_t^o, e^g, u_t, and s_t to 512 dimensions;
a learned 512-dimensional [CLS] token is prepended to form the five-token sequence
[CLS, o, g, w, s]. Sinusoidal positional encodings and dropout are applied before the
four-layer pre-norm Transformer, whose feed-forward blocks use GELU. The final [CLS] state
passes through a 512->512->512 GELU MLP and LayerNorm to yield z_t in R^512. ... three
residual MLP blocks with 1,024-dimensional hidden layers map z_t to a single joint
distribution over all 144 view actions. The reported tau, window/filter, and gamma
marginals are derived from these joint logits rather than trained by separate heads."
D.4: "A 64-dimensional entity-hint head is retained for compatibility with the older
rendering interface but is frozen by the current D1/D2 objective."

``encoder`` parameters are trained by D1 only, ``planner`` (residual blocks, final LayerNorm,
joint head) by D1 and D2; the planner's dropout is active in "Planner train mode" (Table A.4).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import Tensor, nn

from memprism_ray.config_tree import field as cfg_field
from memprism_ray.router.features import STATS_DIM, TEXT_DIM, WINDOW_DIM
from memprism_ray.view_space import FILTERS, GAMMAS, NUM_ACTIONS, TAUS, WINDOWS


@dataclass
class RouterConfig:
    """Architecture of :class:`ViewPolicyModel`; the defaults are appendix A.2."""

    obs_dim: int = cfg_field(TEXT_DIM, help="observation embedding size (MiniLM: 384)")
    goal_dim: int = cfg_field(TEXT_DIM, help="goal embedding size (MiniLM: 384)")
    window_dim: int = cfg_field(WINDOW_DIM, help="event-window summary size (128)")
    stats_dim: int = cfg_field(STATS_DIM, help="global statistics size (8)")
    d_model: int = cfg_field(512, help="shared token width")
    n_heads: int = cfg_field(8, help="attention heads per Transformer layer")
    n_layers: int = cfg_field(4, help="pre-norm Transformer encoder layers")
    ff_dim: int = cfg_field(1024, help="Transformer feed-forward width")
    dropout: float = cfg_field(0.1, help="dropout in the encoder and the planner blocks")
    planner_blocks: int = cfg_field(3, help="residual MLP blocks of the planner")
    planner_hidden: int = cfg_field(1024, help="hidden width of each planner block")
    num_actions: int = cfg_field(NUM_ACTIONS, help="joint view actions (must be 144)")
    entity_hint_dim: int = cfg_field(64, help="frozen compatibility entity-hint head width")

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in ("dropout", "num_actions"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RouterConfig.{f.name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"RouterConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.d_model % 2:
            raise ValueError(f"RouterConfig.d_model must be even for sinusoidal positions, got {self.d_model}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"RouterConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.num_actions != NUM_ACTIONS:
            raise ValueError(
                f"RouterConfig.num_actions must be {NUM_ACTIONS} (the joint view space), got {self.num_actions}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RouterConfig:
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown RouterConfig field(s) {', '.join(unknown)}")
        return cls(**data)


#: State-dict key prefixes of each parameter group (used to count a weight file's groups).
GROUP_PREFIXES: dict[str, tuple[str, ...]] = {
    "encoder": ("proj_obs.", "proj_goal.", "proj_window.", "proj_stats.", "cls", "transformer.", "z_mlp.", "z_norm."),
    "planner": ("planner.", "planner_norm.", "joint_head."),
    "entity_hint": ("entity_hint_head.",),
}


def parameter_group_of(key: str) -> str:
    """``encoder``, ``planner`` or ``entity_hint`` for a ViewPolicyModel state-dict key."""
    for group, prefixes in GROUP_PREFIXES.items():
        if any(key == p.rstrip(".") or key.startswith(p) for p in prefixes):
            return group
    raise ValueError(f"state-dict key {key!r} belongs to no ViewPolicyModel parameter group")


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """The fixed encoding of Vaswani et al.: sin on even, cos on odd channels."""
    pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class ResidualBlock(nn.Module):
    """``x + W2 Dropout(GELU(W1 LN(x)))``."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.fc2(self.drop(self.act(self.fc1(self.norm(x)))))


class ViewPolicyModel(nn.Module):
    """``pi_theta^v(a | z_t) = softmax(f_theta(z_t))_a`` over the 144 joint view actions."""

    NUM_TOKENS = 5  # [CLS, o, g, w, s]

    def __init__(self, config: RouterConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or RouterConfig()
        d = config.d_model
        self.proj_obs = nn.Linear(config.obs_dim, d)
        self.proj_goal = nn.Linear(config.goal_dim, d)
        self.proj_window = nn.Linear(config.window_dim, d)
        self.proj_stats = nn.Linear(config.stats_dim, d)
        self.cls = nn.Parameter(torch.empty(1, 1, d))
        nn.init.normal_(self.cls, std=0.02)
        self.register_buffer("positions", sinusoidal_positions(self.NUM_TOKENS, d), persistent=False)
        self.input_dropout = nn.Dropout(config.dropout)
        layer = nn.TransformerEncoderLayer(
            d_model=d,
            nhead=config.n_heads,
            dim_feedforward=config.ff_dim,
            dropout=config.dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.transformer = nn.TransformerEncoder(layer, num_layers=config.n_layers, enable_nested_tensor=False)
        self.z_mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        self.z_norm = nn.LayerNorm(d)
        self.planner = nn.ModuleList(
            [ResidualBlock(d, config.planner_hidden, config.dropout) for _ in range(config.planner_blocks)]
        )
        self.planner_norm = nn.LayerNorm(d)
        self.joint_head = nn.Linear(d, config.num_actions)
        self.entity_hint_head = nn.Linear(d, config.entity_hint_dim)
        self.entity_hint_head.requires_grad_(False)

    def encoder_modules(self) -> list[nn.Module]:
        projections = [self.proj_obs, self.proj_goal, self.proj_window, self.proj_stats]
        return [*projections, self.transformer, self.z_mlp, self.z_norm]

    def planner_modules(self) -> list[nn.Module]:
        return [self.planner, self.planner_norm, self.joint_head]

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """``{"encoder": [...], "planner": [...]}``; the frozen entity-hint head is in neither."""
        encoder = [self.cls] + [p for m in self.encoder_modules() for p in m.parameters()]
        planner = [p for m in self.planner_modules() for p in m.parameters()]
        return {"encoder": encoder, "planner": planner}

    def frozen_parameters(self) -> list[nn.Parameter]:
        return list(self.entity_hint_head.parameters())

    def parameter_counts(self) -> dict[str, int]:
        groups = self.parameter_groups()
        counts = {name: sum(p.numel() for p in params) for name, params in groups.items()}
        counts["entity_hint"] = sum(p.numel() for p in self.frozen_parameters())
        counts["total"] = sum(p.numel() for p in self.parameters())
        return counts

    def set_mode(self, *, encoder_train: bool, planner_train: bool) -> ViewPolicyModel:
        """Put the encoder and planner in train/eval mode independently (D2 "Planner train mode")."""
        self.train(encoder_train)
        self.input_dropout.train(encoder_train)
        for m in self.planner_modules():
            m.train(planner_train)
        return self

    def encode(self, obs: Tensor, goal: Tensor, window: Tensor, stats: Tensor) -> Tensor:
        """``z_t`` [B, d_model] from the four feature tensors ([B, D] each)."""
        tokens = torch.stack(
            [self.proj_obs(obs), self.proj_goal(goal), self.proj_window(window), self.proj_stats(stats)], dim=1
        )
        cls = self.cls.expand(tokens.shape[0], -1, -1)
        x = torch.cat([cls, tokens], dim=1) + self.positions.to(tokens.dtype)
        x = self.transformer(self.input_dropout(x))
        return self.z_norm(self.z_mlp(x[:, 0]))

    def planner_logits(self, z: Tensor) -> Tensor:
        """Joint logits [B, 144] from ``z_t``."""
        h = z
        for block in self.planner:
            h = block(h)
        return self.joint_head(self.planner_norm(h))

    def entity_hint(self, z: Tensor) -> Tensor:
        """The frozen 64-d compatibility output (unused by D1/D2)."""
        return self.entity_hint_head(z)

    def forward(self, obs: Tensor, goal: Tensor, window: Tensor, stats: Tensor) -> Tensor:
        """Joint logits ``l_t`` [B, 144] (eq. view-policy)."""
        _check_inputs(self.config, obs, goal, window, stats)
        return self.planner_logits(self.encode(obs, goal, window, stats))


def _check_inputs(config: RouterConfig, obs: Tensor, goal: Tensor, window: Tensor, stats: Tensor) -> None:
    dims = {"obs": config.obs_dim, "goal": config.goal_dim, "window": config.window_dim, "stats": config.stats_dim}
    batch = obs.shape[0] if obs.dim() == 2 else None
    for (name, dim), t in zip(dims.items(), (obs, goal, window, stats), strict=True):
        if t.dim() != 2 or t.shape[1] != dim or t.shape[0] != batch:
            raise ValueError(f"ViewPolicyModel input {name} must be [B, {dim}] with a shared B, got {tuple(t.shape)}")


def factor_marginals(logits: Tensor) -> dict[str, Tensor]:
    """Per-factor probabilities from the joint logits [B, 144], and ``window_filter`` [B, 12]."""
    if logits.shape[-1] != NUM_ACTIONS:
        raise ValueError(f"factor_marginals expects [..., {NUM_ACTIONS}] logits, got {tuple(logits.shape)}")
    lead = logits.shape[:-1]
    logp = torch.log_softmax(logits.float(), dim=-1).reshape(*lead, len(TAUS), len(WINDOWS), len(FILTERS), len(GAMMAS))
    n = len(lead)
    axes = {"tau": n, "window": n + 1, "filter": n + 2, "gamma": n + 3}
    out: dict[str, Tensor] = {}
    for name, axis in axes.items():
        others = [a for a in axes.values() if a != axis]
        out[name] = torch.logsumexp(logp, dim=others).exp()
    out["window_filter"] = torch.logsumexp(logp, dim=[n, n + 3]).exp().reshape(*lead, len(WINDOWS) * len(FILTERS))
    return out
