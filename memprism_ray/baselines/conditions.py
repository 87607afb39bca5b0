"""The evaluation conditions as view selectors (paper "Experiment Setup" baselines and
"Where Does the Gain Come From?").

* ``no_memory``, ``full_history``, ``recent4`` (``recent:K``): no view, 0 / every / the last
  4 (K) earlier steps as text
* ``fixed:TAU``          one relation view at the paper's fixed scope (recent_long, all, medium)
* ``fixed:TAU/WINDOW/FILTER/GAMMA``: any one view of the 144; ``fixed_text:TAU``: as text
* ``memprism``, ``memprism_text``: the Router's greedy choice, optical or as text
* ``freq_random``        views sampled from a given 144-way marginal, ignoring the context
* ``constrained:F=V``    the Router with one factor fixed (e.g. ``gamma=fine``)
* ``agentocr``           AgentOCR (w/o RL): the last 50 steps drawn flat as one image
* ``mem0``, ``mem0_graph``, ``amem``, ``langmem``: the external memory baselines
  (baselines/external.py, docs/baselines.md)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memprism_ray.baselines.base import FULL_HISTORY, DecisionContext, ViewDecision, ViewSelector
from memprism_ray.view_space import ALL_ACTIONS, FACTORS, NUM_ACTIONS, ViewAction

#: The fixed scope of the paper's four fixed relation views.
FIXED_WINDOW, FIXED_FILTER, FIXED_GAMMA = "recent_long", "all", "medium"


class TextHistory:
    """No view; the prompt keeps ``history`` steps of text (0 = No Memory, -1 = all)."""

    uses_features = False

    def __init__(self, name: str, history: int) -> None:
        self.name = name
        self.history = history

    def select(self, contexts: Sequence[DecisionContext], features: object | None = None) -> list[ViewDecision]:
        return [ViewDecision(None, "none", 0.0, self.history) for _ in contexts]


class FixedView:
    """The same view action at every decision."""

    uses_features = False

    def __init__(self, action: ViewAction, medium: str = "optical", name: str | None = None) -> None:
        self.action = action
        self.medium = medium
        self.name = name or f"fixed{'_text' if medium == 'text' else ''}:{action.tau}"

    def select(self, contexts: Sequence[DecisionContext], features: object | None = None) -> list[ViewDecision]:
        return [ViewDecision(self.action, self.medium) for _ in contexts]


def _seeded_uniform(seed: int, ctx: DecisionContext) -> float:
    digest = hashlib.blake2b(f"{seed}|{ctx.episode_id}|{ctx.step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class FrequencyMatchedRandom:
    """Samples each decision's view from a fixed 144-way marginal; the draw depends only on
    ``(seed, episode id, step)``, so runs are reproducible whatever the batch order."""

    uses_features = False

    def __init__(self, marginal: Sequence[float], seed: int = 0, medium: str = "optical") -> None:
        p = np.asarray(marginal, dtype=np.float64)
        if p.shape != (NUM_ACTIONS,):
            raise ValueError(f"frequency-matched marginal needs {NUM_ACTIONS} probabilities, got shape {p.shape}")
        if (p < 0).any() or not np.isfinite(p).all() or p.sum() <= 0:
            raise ValueError("frequency-matched marginal must be finite, non-negative and not all zero")
        self.marginal = p / p.sum()
        self._cdf = np.cumsum(self.marginal)
        self.seed = seed
        self.medium = medium
        self.name = "freq_random"

    def select(self, contexts: Sequence[DecisionContext], features: object | None = None) -> list[ViewDecision]:
        out = []
        for ctx in contexts:
            i = int(np.searchsorted(self._cdf, _seeded_uniform(self.seed, ctx) * self._cdf[-1], side="right"))
            i = min(i, NUM_ACTIONS - 1)
            out.append(ViewDecision(ALL_ACTIONS[i], self.medium, float(np.log(self.marginal[i]))))
        return out


def factor_value(factor: str, value: str) -> str:
    """``value``'s canonical name as a value of the view ``factor`` (a legacy alias resolved)."""
    if factor not in FACTORS:
        raise ValueError(f"unknown view factor {factor!r}; valid factors: {', '.join(FACTORS)}")
    return str(getattr(ViewAction(**{**ALL_ACTIONS[0].to_dict(), factor: value}), factor))  # or raises


def factor_mask(factor: str, value: str) -> np.ndarray:
    """Boolean mask over the 144 actions whose ``factor`` equals ``value``."""
    canonical = factor_value(factor, value)
    return np.array([getattr(a, factor) == canonical for a in ALL_ACTIONS])


class RouterSelector:
    """The MemPrism Router as a view selector (paper eq. view-policy / greedy-view) over
    :class:`memprism_ray.router.sampling.RouterSampler`: argmax at evaluation, ``temperature`` /
    ``top_p`` samples in GRPO rollouts; ``mask``: the constrained planners' subset."""

    uses_features = True

    def __init__(
        self,
        model: Any,
        *,
        greedy: bool = True,
        temperature: float = 1.0,
        medium: str = "optical",
        mask: np.ndarray | None = None,
        seed: int = 0,
        name: str = "memprism",
        top_p: float = 1.0,
    ) -> None:
        from memprism_ray.router.sampling import RouterSampler  # torch, loaded only when a Router is used

        self.sampler = RouterSampler(model, greedy=greedy, temperature=temperature, top_p=top_p, mask=mask, seed=seed)
        self.medium = medium
        self.name = name

    def reseed(self, seed: int) -> None:
        self.sampler.reseed(seed)

    def select(self, contexts: Sequence[DecisionContext], features: object | None) -> list[ViewDecision]:
        if features is None:
            raise ValueError("the Router selector needs Router features")
        idx, logp = self.sampler.select(features)  # type: ignore[arg-type]
        return [ViewDecision(ALL_ACTIONS[int(i)], self.medium, float(lp)) for i, lp in zip(idx, logp, strict=True)]


def load_marginal(source: str | Path | Sequence[float]) -> np.ndarray:
    """A 144-way marginal from a list, a JSON file holding a list or ``{"view_marginal": [...]}``,
    an evaluation ``report.json`` or the condition directory holding it, or a whole evaluation
    (its ``summary.json`` or ``--out`` directory: its ``memprism`` condition's marginal); anything
    but a flat list of :data:`NUM_ACTIONS` numbers is a one-line ``ValueError`` naming the source."""
    where = "frequency-matched marginal"
    data: Any = source
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            path = path / ("summary.json" if (path / "summary.json").is_file() else "report.json")
        if not path.exists():
            raise ValueError(f"{where}: {path} does not exist (give a report.json or a JSON list)")
        where = str(path)
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{where}: not valid JSON ({exc})") from None
        if isinstance(data, dict) and isinstance(data.get("conditions"), list):  # an evaluation's summary
            router = [c for c in data["conditions"] if isinstance(c, dict) and c.get("condition") == "memprism"]
            if not router:
                raise ValueError(
                    f"{path}: an evaluation without the memprism condition; name the report.json of the "
                    "condition whose view marginal is meant"
                )
            data = router[0]
        if isinstance(data, dict):
            data = data.get("view_selection", data) if "view_marginal" not in data else data
            if not isinstance(data, dict) or "view_marginal" not in data:
                raise ValueError(
                    f"{path} has no 'view_marginal' entry (run `memprism eval --condition memprism` first)"
                )
            data = data["view_marginal"]
    numbers = isinstance(data, (list, tuple, np.ndarray)) and all(
        isinstance(x, (int, float, np.number)) and not isinstance(x, bool) for x in data
    )
    if not numbers:
        shown = json.dumps(data.tolist() if isinstance(data, np.ndarray) else data, default=repr)[:60]
        raise ValueError(f"{where}: the view marginal must be a flat JSON list of numbers, got {shown}")
    if len(data) != NUM_ACTIONS:
        raise ValueError(
            f"{where}: the view marginal needs {NUM_ACTIONS} probabilities (one per view), got {len(data)}"
        )
    return np.asarray(data, dtype=np.float64)


#: The text-history conditions and the steps of history each keeps.
_TEXT_HISTORY = {"no_memory": 0, "full_history": FULL_HISTORY, "recent4": 4}
#: External memory baselines: they call an LLM endpoint (``memory.base_url``).
EXTERNAL_MEMORY_CONDITIONS: tuple[str, ...] = ("mem0", "mem0_graph", "amem", "langmem")

CONDITIONS_HELP = (
    "no_memory, full_history, recent4 (recent:K), fixed:TAU, fixed_text:TAU, memprism, memprism_text, "
    "freq_random, constrained:FACTOR=VALUE, agentocr, " + ", ".join(EXTERNAL_MEMORY_CONDITIONS)
)


def make_selector(
    condition: str,
    *,
    router: Any = None,
    marginal: str | Path | Sequence[float] | None = None,
    seed: int = 0,
    greedy: bool = True,
    temperature: float = 1.0,
    memory: Any = None,
) -> ViewSelector:
    """The selector of a condition name; ``memory``: the external baselines' ``MemoryBaselineConfig``."""
    name = condition.strip()
    if name == "agentocr":
        from memprism_ray.baselines.agentocr import agentocr_selector

        return agentocr_selector()
    if name in EXTERNAL_MEMORY_CONDITIONS:
        from memprism_ray.baselines.external import external_selector

        return external_selector(name, memory)
    if name in _TEXT_HISTORY:
        return TextHistory(name, _TEXT_HISTORY[name])
    if name.startswith("recent:"):
        k = name.split(":", 1)[1]
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"condition {condition!r}: recent:K needs a positive integer K")
        return TextHistory(f"recent{k}", int(k))
    if name.startswith(("fixed:", "fixed_text:")):
        kind, spec = name.split(":", 1)
        parts = spec.split("/")
        if len(parts) == 1:
            action = ViewAction(spec, FIXED_WINDOW, FIXED_FILTER, FIXED_GAMMA)
            label = action.tau
        elif len(parts) == 4:
            action = ViewAction(*parts)
            label = action.name
        else:
            raise ValueError(f"condition {condition!r}: use fixed:TAU or fixed:TAU/WINDOW/FILTER/GAMMA")
        medium = "text" if kind == "fixed_text" else "optical"
        return FixedView(action, medium, name=f"{kind}:{label}")
    if name == "freq_random":
        if marginal is None:
            raise ValueError("condition freq_random needs a marginal (--marginal: a report.json or a JSON list)")
        return FrequencyMatchedRandom(load_marginal(marginal), seed=seed)
    if name in ("memprism", "memprism_text") or name.startswith("constrained:"):
        if router is None:
            raise ValueError(f"condition {condition!r} needs a Router checkpoint (--checkpoint)")
        medium = "text" if name == "memprism_text" else "optical"
        mask = None
        if name.startswith("constrained:"):
            spec = name.split(":", 1)[1]
            if "=" not in spec:
                raise ValueError(f"condition {condition!r}: use constrained:FACTOR=VALUE, e.g. constrained:gamma=fine")
            factor, value = (s.strip() for s in spec.split("=", 1))
            mask = factor_mask(factor, value)
            name = f"constrained:{factor}={factor_value(factor, value)}"
        return RouterSelector(
            router, greedy=greedy, temperature=temperature, medium=medium, mask=mask, seed=seed, name=name
        )
    raise ValueError(f"unknown condition {condition!r}; valid conditions: {CONDITIONS_HELP}")


#: Stands in for a Router model when only a condition's name is checked.
_NAME_CHECK = object()


def condition_needs(condition: str) -> frozenset[str]:
    """What ``condition`` needs besides the episodes: ``{"router"}``, ``{"marginal"}``,
    ``{"memory_llm"}`` or nothing; a ``ValueError`` listing the valid conditions for an unknown
    or malformed name."""
    if condition.strip() in EXTERNAL_MEMORY_CONDITIONS:
        return frozenset({"memory_llm"})
    selector = make_selector(condition, router=_NAME_CHECK, marginal=np.ones(NUM_ACTIONS))
    if isinstance(selector, RouterSelector):
        return frozenset({"router"})
    if isinstance(selector, FrequencyMatchedRandom):
        return frozenset({"marginal"})
    return frozenset()


def condition_name(condition: str) -> str:
    """``condition``'s canonical name, the one its reports and folders carry: a legacy view alias
    resolved (``fixed:timeline`` is ``fixed:TemporalTrace``), ``recent:4`` is ``recent4``; a
    ``ValueError`` listing the valid conditions for an unknown or malformed one."""
    if condition.strip() in EXTERNAL_MEMORY_CONDITIONS:
        return condition.strip()
    return str(make_selector(condition, router=_NAME_CHECK, marginal=np.ones(NUM_ACTIONS)).name)


def canonical_conditions(conditions: Sequence[str], key: str) -> tuple[str, ...]:
    """``conditions`` by their canonical names; an empty list, an unknown or malformed name, or
    one condition listed twice (under any of its names) refused naming ``key``."""
    if not conditions:
        raise ValueError(f"{key} must name at least one condition; valid conditions: {CONDITIONS_HELP}")
    names: dict[str, str] = {}
    for condition in conditions:
        try:
            name = condition_name(condition)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        if name in names:
            same = "" if names[name] == condition else f" (as {names[name]!r})"
            raise ValueError(f"{key}: condition {condition!r} is listed twice{same}")
        names[name] = condition
    return tuple(names)
