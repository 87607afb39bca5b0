"""The joint view-action space (paper: "Router", Table "Four factors of the joint view
action", and appendix E.4 "View and environment action definitions").

A view action is ``a = (tau, window, filter, gamma)``; the 4 x 3 x 4 x 3 = 144 actions use the
stable zero-based index of eq. (A.1), ``i(a) = ((i_tau * 3 + i_w) * 4 + i_c) * 3 + i_gamma``.
Legacy names (``timeline``, ``action_outcome``, ``state_table``, ``causal_chain``) are
accepted when reading only and always serialise back to the canonical names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memprism_ray.io_atomic import loads_json

TAUS: tuple[str, ...] = ("TemporalTrace", "ActionEffect", "EntityState", "DependencyChain")
WINDOWS: tuple[str, ...] = ("recent_short", "recent_long", "all")
FILTERS: tuple[str, ...] = ("all", "exception", "state_update", "no_observed_change")
GAMMAS: tuple[str, ...] = ("coarse", "medium", "fine")

#: Number of most recent events in each window; ``None`` means the whole history.
WINDOW_SIZES: dict[str, int | None] = {"recent_short": 6, "recent_long": 10, "all": None}

#: Read-time aliases of appendix E.4; never written.
TAU_ALIASES: dict[str, str] = {
    "timeline": "TemporalTrace",
    "action_outcome": "ActionEffect",
    "state_table": "EntityState",
    "causal_chain": "DependencyChain",
}

NUM_ACTIONS: int = len(TAUS) * len(WINDOWS) * len(FILTERS) * len(GAMMAS)

_FACTORS: dict[str, tuple[str, ...]] = {"tau": TAUS, "window": WINDOWS, "filter": FILTERS, "gamma": GAMMAS}


def _canonical(factor: str, value: Any) -> str:
    """The canonical spelling of ``value`` (any case; for ``tau`` the legacy aliases too)."""
    valid = _FACTORS[factor]
    if not isinstance(value, str):
        raise ValueError(
            f"view {factor} must be a string, got {type(value).__name__} {value!r}; "
            f"valid {factor} names: {', '.join(valid)}"
        )
    if value in valid:
        return value
    lowered = value.strip().lower()
    for name in valid:
        if name.lower() == lowered:
            return name
    if factor == "tau" and lowered in TAU_ALIASES:
        return TAU_ALIASES[lowered]
    extra = f" (legacy aliases: {', '.join(TAU_ALIASES)})" if factor == "tau" else ""
    raise ValueError(f"unknown view {factor} {value!r}; valid {factor} names: {', '.join(valid)}{extra}")


@dataclass(frozen=True, slots=True)
class ViewAction:
    """One of the 144 joint view actions ``(tau, window, filter, gamma)``; the fields are always canonical."""

    tau: str
    window: str
    filter: str
    gamma: str

    def __post_init__(self) -> None:
        for factor in _FACTORS:
            object.__setattr__(self, factor, _canonical(factor, getattr(self, factor)))

    @property
    def index(self) -> int:
        """Stable zero-based index ``((i_tau*3 + i_w)*4 + i_c)*3 + i_gamma``."""
        i_tau = TAUS.index(self.tau)
        i_w = WINDOWS.index(self.window)
        i_c = FILTERS.index(self.filter)
        i_g = GAMMAS.index(self.gamma)
        return ((i_tau * len(WINDOWS) + i_w) * len(FILTERS) + i_c) * len(GAMMAS) + i_g

    @classmethod
    def from_index(cls, index: int) -> ViewAction:
        """Inverse of :attr:`index`."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(f"view index must be an int in [0, {NUM_ACTIONS}), got {index!r}")
        if not 0 <= index < NUM_ACTIONS:
            raise ValueError(f"view index {index} out of range [0, {NUM_ACTIONS})")
        rest, i_g = divmod(index, len(GAMMAS))
        rest, i_c = divmod(rest, len(FILTERS))
        i_tau, i_w = divmod(rest, len(WINDOWS))
        return cls(TAUS[i_tau], WINDOWS[i_w], FILTERS[i_c], GAMMAS[i_g])

    def to_dict(self) -> dict[str, str]:
        """The serialised action object of appendix E.4."""
        return {"tau": self.tau, "window": self.window, "filter": self.filter, "gamma": self.gamma}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ViewAction:
        """Read an action object; accepts aliases, rejects missing or extra keys."""
        if not isinstance(data, Mapping):
            raise ValueError(f"view action must be a JSON object, got {type(data).__name__}")
        missing = [k for k in _FACTORS if k not in data]
        extra = [k for k in data if k not in _FACTORS]
        if missing or extra:
            raise ValueError(
                f"view action needs exactly the keys tau, window, filter, gamma; "
                f"missing {missing or 'none'}, unexpected {extra or 'none'}"
            )
        return cls(data["tau"], data["window"], data["filter"], data["gamma"])

    @classmethod
    def from_json(cls, text: str) -> ViewAction:
        return cls.from_dict(loads_json(text, "view action"))

    @classmethod
    def parse(cls, text: str) -> ViewAction:
        """Parse ``"tau/window/filter/gamma"`` (the :attr:`name` form), an index or JSON."""
        text = text.strip()
        if text.startswith("{"):
            return cls.from_json(text)
        if text.isdigit():
            return cls.from_index(int(text))
        parts = text.split("/")
        if len(parts) != 4:
            raise ValueError(
                f"cannot parse view action {text!r}: expected 'tau/window/filter/gamma', "
                f"an index in [0, {NUM_ACTIONS}) or a JSON object"
            )
        return cls(*parts)

    @property
    def name(self) -> str:
        """Compact ``tau/window/filter/gamma`` name, used in logs and file names."""
        return f"{self.tau}/{self.window}/{self.filter}/{self.gamma}"

    def __str__(self) -> str:
        return self.name


ALL_ACTIONS: tuple[ViewAction, ...] = tuple(ViewAction.from_index(i) for i in range(NUM_ACTIONS))

#: Maximum of the lexicographic structural-cost code, used to scale cost into [0, 1].
_COST_MAX = (len(WINDOWS) - 1) * 6 + 1 * 3 + (len(GAMMAS) - 1)


def cost(action: ViewAction) -> float:
    """Decision-free tie-break order in [0, 1] (the view-teacher prompt's Phase 2, appendix E.2:
    shorter window, then a selective filter before ``all``, then coarse < medium < fine; never
    tau). The paper's per-decision structural cost is :func:`decision_cost_vector`."""
    code = 6 * WINDOWS.index(action.window) + 3 * int(action.filter == "all") + GAMMAS.index(action.gamma)
    return code / _COST_MAX


def cost_vector() -> list[float]:
    """:func:`cost` of every action in index order (length 144)."""
    return [cost(a) for a in ALL_ACTIONS]


#: Events at which the range term of :func:`decision_cost_vector` saturates: the paper's
#: horizons are at most 50 steps (ALFWorld's step limit).
COST_HORIZON = 50
_OUTCOMES: tuple[str, ...] = tuple(f for f in FILTERS if f != "all")


def _scope_sizes(outcomes: Any) -> dict[tuple[str, str], int]:
    """``|sigma_{w,c}(E_<t)|`` for every (window, filter) from the history's outcomes."""
    if isinstance(outcomes, str) or not hasattr(outcomes, "__len__"):
        raise ValueError(
            f"outcomes must be a sequence of outcome names ({', '.join(_OUTCOMES)}), one per event of E_<t, "
            f"got {type(outcomes).__name__}"
        )
    names = [getattr(o, "value", o) for o in outcomes]  # outcome enums or their names
    for i, name in enumerate(names):
        if name not in _OUTCOMES:
            raise ValueError(f"outcomes[{i}] is {name!r}; valid outcome names: {', '.join(_OUTCOMES)}")
    sizes: dict[tuple[str, str], int] = {}
    for window in WINDOWS:
        size = WINDOW_SIZES[window]
        tail = names if size is None else names[max(0, len(names) - size) :]
        sizes[(window, "all")] = len(tail)
        for name in _OUTCOMES:
            sizes[(window, name)] = tail.count(name)
    return sizes


def decision_cost_vector(outcomes: Any, horizon: int = COST_HORIZON) -> list[float]:
    """Structural cost ``C^_t(a)`` in [0, 1] of every view action at one decision, in index
    order (paper "Adapter", eq. sft-loss; appendix A.3), from the outcome names of ``E_<t``:
    ``C^_t(a) = 1/2 * min(1, |sigma_{w,c}(E_<t)| / horizon) + 1/2 * i_gamma / 2``."""
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"decision_cost_vector horizon must be an int >= 1, got {horizon!r}")
    sizes = _scope_sizes(outcomes)
    return [0.5 * min(1.0, sizes[(a.window, a.filter)] / horizon) + 0.25 * GAMMAS.index(a.gamma) for a in ALL_ACTIONS]


def factor_options(factor: str) -> tuple[str, ...]:
    """The option names of one factor (``tau``, ``window``, ``filter`` or ``gamma``)."""
    if factor not in _FACTORS:
        raise ValueError(f"unknown view factor {factor!r}; valid factors: {', '.join(_FACTORS)}")
    return _FACTORS[factor]


FACTORS: tuple[str, ...] = tuple(_FACTORS)
