"""Ordered episode lists cover a split exactly once, deterministically (appendix C)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from memprism_ray.eval.episodes import EpisodeList, build_episode_list, episode_id, parse_episode_id

GAMES = [f"pick_and_place_simple-Mug-None-Desk-{i}/trial_T2019_{i:03d}" for i in range(140)]


def test_default_list_covers_each_game_exactly_once() -> None:
    ep = build_episode_list("valid_unseen", GAMES, seed=0)
    assert len(ep) == 140 and ep.n_unique_games == 140
    assert Counter(ep.game_ids) == Counter(GAMES)
    assert all(e.endswith("#0") and e.startswith("valid_unseen/") for e in ep.episode_ids)
    assert "each game exactly once" in ep.rule and "sha256" in ep.rule
    assert list(ep.game_ids) != GAMES  # shuffled, not the input order


def test_order_depends_on_seed_not_on_input_order() -> None:
    a = build_episode_list("valid_unseen", GAMES, seed=0)
    assert a == build_episode_list("valid_unseen", list(reversed(GAMES)), seed=0)
    assert a.episode_ids != build_episode_list("valid_unseen", GAMES, seed=1).episode_ids


def test_order_is_identical_in_a_fresh_process() -> None:
    code = (
        "from memprism_ray.eval.episodes import build_episode_list;"
        f"print('|'.join(build_episode_list('s', {GAMES[:20]!r}, seed=5).episode_ids))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    ).stdout.strip()
    assert out.split("|") == list(build_episode_list("s", GAMES[:20], seed=5).episode_ids)


def test_more_episodes_than_games_repeats_in_rounds() -> None:
    ep = build_episode_list("train", GAMES[:10], n_episodes=25, seed=3)
    assert len(ep) == 25 and len(set(ep.episode_ids)) == 25 and ep.n_unique_games == 10
    rounds = [parse_episode_id(e)[2] for e in ep.episode_ids]
    assert rounds == [0] * 10 + [1] * 10 + [2] * 5
    assert Counter(ep.game_ids[:10]) == Counter(GAMES[:10]) == Counter(ep.game_ids[10:20])
    assert ep.game_ids[:10] != ep.game_ids[10:20]  # each round has its own order
    assert "2 full round(s) of 10 games plus 5 from round 2" in ep.rule


def test_fewer_episodes_is_a_prefix_of_the_full_order() -> None:
    full = build_episode_list("s", GAMES, seed=2)
    part = build_episode_list("s", GAMES, n_episodes=30, seed=2)
    assert part.episode_ids == full.episode_ids[:30] and part.n_unique_games == 30
    assert "first 30 of 140" in part.rule


def test_ids_round_trip_and_bad_inputs() -> None:
    eid = episode_id("valid_seen", "a/b#c", 4)
    assert eid == "valid_seen/a/b#c#4" and parse_episode_id(eid) == ("valid_seen", "a/b#c", 4)
    for bad in ["nosplit", "s/#1", "s/g#x", "/g#0", "s/g"]:
        with pytest.raises(ValueError, match="episode id"):
            parse_episode_id(bad)
    with pytest.raises(ValueError, match="more than once"):
        build_episode_list("s", ["g1", "g2", "g1"])
    with pytest.raises(ValueError, match="no games"):
        build_episode_list("s", [])
    with pytest.raises(ValueError, match="split name"):
        build_episode_list("a/b", ["g"])
    with pytest.raises(ValueError, match="n_episodes"):
        build_episode_list("s", ["g"], n_episodes=0)


def test_dict_round_trip() -> None:
    ep = build_episode_list("s", GAMES[:7], n_episodes=9, seed=1)
    assert EpisodeList.from_dict(ep.to_dict()) == ep
    with pytest.raises(ValueError, match="not from split"):
        EpisodeList.from_dict({**ep.to_dict(), "split": "other"})
