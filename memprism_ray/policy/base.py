"""The frozen task policy's interface (paper: "Render", eq. (task-policy)): one action
``u_t ~ pi_task(. | X_t, g, H_short, V_t)`` per input, through the batched :class:`TaskPolicy`.

Invalid model output never raises: the policy returns ``valid=False`` with a reason (appendix
E.5). Infrastructure failures raise :class:`PolicyBackendError`, so a caller marks the trajectory
failed instead of counting an invalid action."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from PIL import Image

from memprism_ray.formats.history import HistoryRecord


class PolicyBackendError(RuntimeError):
    """The backend itself failed (unreachable server, engine crash), not the model output."""


@dataclass(frozen=True)
class PolicyInput:
    """Everything one decision's prompt holds.

    ``step``: environment steps already taken. The view comes as ``view_image`` (optical),
    ``view_text`` (text view) or neither (No Memory); ``view_unpainted`` marks an optical page laid
    out but not painted, for a policy that reads no pixels. ``camera_image``: EB-ALFRED's frame. For
    Mind2Web ``admissible`` holds the snapshot's element refs. ``meta``: benchmark extras
    (``examples``, ``html_field``). ``benchmark`` names the task contract that reads the input."""

    benchmark: str
    goal: str
    observation: str
    admissible: tuple[str, ...] = ()
    history: tuple[HistoryRecord, ...] = ()
    step: int = 0
    view_image: Image.Image | None = None
    view_text: str | None = None
    camera_image: Image.Image | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    view_unpainted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.benchmark, str) or not self.benchmark:
            raise ValueError(f"PolicyInput.benchmark must name a benchmark, got {self.benchmark!r}")
        for name in ("goal", "observation"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"PolicyInput.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if isinstance(self.admissible, str) or not isinstance(self.admissible, (tuple, list)):
            raise ValueError("PolicyInput.admissible must be a tuple of strings (got a single string or non-sequence)")
        object.__setattr__(self, "admissible", tuple(self.admissible))
        bad = [a for a in self.admissible if not isinstance(a, str)]
        if bad:
            raise ValueError(f"PolicyInput.admissible must hold strings only, got {bad[0]!r}")
        object.__setattr__(self, "history", tuple(self.history))
        for rec in self.history:
            if not isinstance(rec, HistoryRecord):
                raise ValueError(f"PolicyInput.history must hold HistoryRecord items, got {type(rec).__name__}")
        if not isinstance(self.step, int) or isinstance(self.step, bool) or self.step < 0:
            raise ValueError(f"PolicyInput.step must be a non-negative int, got {self.step!r}")
        if self.view_image is not None and self.view_text is not None:
            raise ValueError("PolicyInput takes view_image (optical view) or view_text (text view), not both")
        if self.view_unpainted and (self.view_image is not None or self.view_text is not None):
            raise ValueError("PolicyInput.view_unpainted is an optical view without pixels: no view_image or view_text")
        for name in ("view_image", "camera_image"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Image.Image):
                raise ValueError(f"PolicyInput.{name} must be a PIL.Image.Image or None, got {type(value).__name__}")
        if self.view_text is not None and not isinstance(self.view_text, str):
            raise ValueError(f"PolicyInput.view_text must be a str or None, got {type(self.view_text).__name__}")
        if not isinstance(self.meta, dict):
            raise ValueError(f"PolicyInput.meta must be a dict, got {type(self.meta).__name__}")

    @property
    def view_mode(self) -> str:
        """``"image"``, ``"text"`` or ``"none"``: how the view reaches the policy."""
        if self.view_image is not None or self.view_unpainted:
            return "image"
        if self.view_text is not None:
            return "text"
        return "none"

    def images(self) -> list[Image.Image]:
        """The images of this input in prompt order (camera frame first, as in E.3)."""
        return [im for im in (self.camera_image, self.view_image) if im is not None]


@dataclass(frozen=True)
class PolicyOutput:
    """One decision's result: ``action`` is ``None`` when invalid (reason in ``error``); token
    counts are ``None`` when unknown; ``latency_s`` is the wait for the backend (a batch's time)."""

    text: str
    action: str | None
    valid: bool
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    visual_tokens: int | None = None
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.valid and self.action is None:
            raise ValueError("a valid PolicyOutput needs an action")
        if not self.valid and self.error is None:
            raise ValueError("an invalid PolicyOutput needs an error saying why")

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, ready for an Arrow row or JSON."""
        return dataclasses.asdict(self)


@runtime_checkable
class TaskPolicy(Protocol):
    """A frozen task policy: ``act`` returns one :class:`PolicyOutput` per input, in order."""

    name: str

    def act(self, inputs: Sequence[PolicyInput]) -> list[PolicyOutput]: ...
