"""``rollout.group_timeout_s`` is checked when the config is read (issue 9 item 5, issue 10
item 2): a positive finite number of seconds, or a one-line error naming key and value."""

from __future__ import annotations

import pytest

from memprism_ray.config import RolloutConfig, load_config


@pytest.mark.parametrize("bad", [-5, 0, 0.0, float("nan"), float("inf"), "30", "soon", True, None])
def test_group_timeout_must_be_a_positive_finite_number(bad) -> None:
    with pytest.raises(ValueError, match=r"rollout\.group_timeout_s must be a positive finite number .*got"):
        RolloutConfig(group_timeout_s=bad)


@pytest.mark.parametrize("text", ["-5", "nan", "0", "inf"])
def test_group_timeout_is_rejected_at_load_time(text: str) -> None:
    with pytest.raises(ValueError, match=r"group_timeout_s"):
        load_config("configs/local.yaml", ["--rollout.group_timeout_s", text])


def test_group_timeout_accepts_seconds() -> None:
    assert RolloutConfig(group_timeout_s=30).group_timeout_s == 30
    assert load_config("configs/local.yaml", ["--rollout.group_timeout_s", "45.5"]).rollout.group_timeout_s == 45.5
