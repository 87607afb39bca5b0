"""The GRPO task schedule (``trainer/rollouts.py``): which games each iteration plays."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from memprism_ray.adapter.grpo_update import GRPOConfig
from memprism_ray.trainer.rollouts import sample_groups


@dataclass(frozen=True)
class _Game:
    game_id: str

    def to_dict(self) -> dict[str, str]:
        return {"game_id": self.game_id}


GAMES = [_Game(f"g{i:02d}") for i in range(30)]


def _cfg(**grpo: int) -> SimpleNamespace:
    return SimpleNamespace(run=SimpleNamespace(seed=3), grpo=GRPOConfig(groups_per_iteration=4, group_size=2, **grpo))


def _games(cfg: SimpleNamespace, it: int) -> list[str]:
    return [s.game["game_id"] for s in sample_groups(GAMES, cfg, it)]


def test_the_last_iterations_replay_the_first_ones_games_with_fresh_seeds() -> None:
    plain, replay = _cfg(iterations=10), _cfg(iterations=10, replay_first=3)
    for k in range(3):  # iterations 7, 8, 9 play the games of 0, 1, 2, in the same order
        assert _games(replay, 7 + k) == _games(replay, k) == _games(plain, k)
        first, again = sample_groups(GAMES, replay, k), sample_groups(GAMES, replay, 7 + k)
        assert {s.seed for s in first}.isdisjoint({s.seed for s in again}), "a replay must draw new trajectories"
        assert {s.group_id for s in first}.isdisjoint({s.group_id for s in again})
        assert all(s.iteration == 7 + k for s in again)
    for it in range(7):  # the iterations before the replay draw exactly what they drew without it
        assert sample_groups(GAMES, replay, it) == sample_groups(GAMES, plain, it)
    # Without the replay the last iterations draw their own games (what made first vs last
    # training success compare different tasks).
    assert any(_games(plain, 7 + k) != _games(plain, k) for k in range(3))


def test_a_shortened_run_replays_at_most_half_of_its_iterations() -> None:
    cfg = _cfg(iterations=4, replay_first=5)
    assert cfg.grpo.replayed_iterations == 2
    assert _games(cfg, 2) == _games(cfg, 0) and _games(cfg, 3) == _games(cfg, 1)
    assert _cfg(iterations=1, replay_first=5).grpo.replayed_iterations == 0
    with pytest.raises(ValueError, match="replay_first must be >= 0"):
        GRPOConfig(replay_first=-1)


def test_an_iteration_counts_its_phi_fallbacks() -> None:
    """Each group's LLM-Phi fallbacks (its step rows' ``phi_fallback``) sum into the iteration's
    ``phi_fallbacks``: a Router trained on the rules' events is said, not silent."""
    from memprism_ray.actors.rollout import GroupSummary
    from memprism_ray.trainer.rollouts import GroupOutcome, RolloutResult, iteration_stats

    ep = {"episode_id": "e", "status": "ok", "won": True, "steps": 3}
    groups = [GroupOutcome(GroupSummary(f"g{i}", "game", 1, [ep], num_steps=3, phi_fallbacks=n), None)
              for i, n in enumerate((2, 0, 1))]  # fmt: skip
    assert iteration_stats(RolloutResult(groups=groups))["phi_fallbacks"] == 3
