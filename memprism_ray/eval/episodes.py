"""Ordered evaluation episode lists (paper appendix C, "Common controlled protocol"): every
condition runs the same ordered list, recorded with its number of unique games and its rule.

Rule: round ``k`` orders the split's games by ``sha256(f"{seed}:{k}:{game_id}")`` (platform-
and version-independent, no random generator); rounds 0, 1, ... are concatenated and cut at
the requested count. Episode ids are ``"<split>/<game_id>#<k>"``.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RULE_NAME = "sha256-rounds-v1"


def episode_id(split: str, game_id: str, round_: int) -> str:
    """``"<split>/<game_id>#<round>"``."""
    return f"{split}/{game_id}#{round_}"


def parse_episode_id(eid: str) -> tuple[str, str, int]:
    """``(split, game_id, round)`` of an episode id (game ids may contain ``/`` and ``#``)."""
    split, sep, rest = eid.partition("/")
    game_id, sep2, k = rest.rpartition("#")
    if not sep or not sep2 or not split or not game_id or not k.isdigit():
        raise ValueError(f"not an episode id of the form '<split>/<game_id>#<k>': {eid!r}")
    return split, game_id, int(k)


def _order(game_ids: Sequence[str], seed: int, round_: int) -> list[str]:
    return sorted(game_ids, key=lambda g: (hashlib.sha256(f"{seed}:{round_}:{g}".encode()).hexdigest(), g))


@dataclass(frozen=True)
class EpisodeList:
    """An ordered episode list and the record of how it was built."""

    split: str
    seed: int
    episode_ids: tuple[str, ...]
    n_unique_games: int
    rule: str

    @property
    def game_ids(self) -> tuple[str, ...]:
        """The source game of each episode, in episode order."""
        return tuple(parse_episode_id(e)[1] for e in self.episode_ids)

    def __len__(self) -> int:
        return len(self.episode_ids)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "episode_ids": list(self.episode_ids)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeList:
        expected = {"split", "seed", "episode_ids", "n_unique_games", "rule"}
        if set(data) != expected:
            raise ValueError(f"episode list fields must be {sorted(expected)}, got {sorted(data)}")
        ids = tuple(data["episode_ids"])
        for e in ids:
            if parse_episode_id(e)[0] != data["split"]:
                raise ValueError(f"episode {e!r} is not from split {data['split']!r}")
        return cls(data["split"], int(data["seed"]), ids, int(data["n_unique_games"]), str(data["rule"]))


def build_episode_list(
    split: str, game_ids: Sequence[str], n_episodes: int | None = None, seed: int = 0
) -> EpisodeList:
    """The ordered episode list of ``split`` (default: each game exactly once)."""
    if not split or "/" in split or "#" in split:
        raise ValueError(f"split name must be non-empty without '/' or '#', got {split!r}")
    games = list(game_ids)
    if not games:
        raise ValueError(f"split {split!r} has no games")
    bad = [g for g in games if not isinstance(g, str) or not g]
    if bad:
        raise ValueError(f"game ids must be non-empty strings, got {bad[0]!r}")
    dupes = sorted(g for g, c in Counter(games).items() if c > 1)
    if dupes:
        raise ValueError(f"split {split!r} lists game ids more than once: {dupes[:5]}")
    n_games = len(games)
    n = n_games if n_episodes is None else n_episodes
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n_episodes must be a positive int, got {n_episodes!r}")
    ids: list[str] = []
    round_ = 0
    while len(ids) < n:
        for g in _order(games, seed, round_):
            if len(ids) == n:
                break
            ids.append(episode_id(split, g, round_))
        round_ += 1
    if n == n_games:
        coverage = "each game exactly once"
    elif n < n_games:
        coverage = f"the first {n} of {n_games} games (a prefix of round 0)"
    else:
        full, rest = divmod(n, n_games)
        coverage = f"{full} full round(s) of {n_games} games" + (f" plus {rest} from round {full}" if rest else "")
    rule = (
        f"{RULE_NAME}: round k orders the split's games by sha256('{seed}:k:<game_id>'); "
        f"rounds 0, 1, ... are concatenated and cut at {n} episodes: {coverage}"
    )
    return EpisodeList(split=split, seed=seed, episode_ids=tuple(ids), n_unique_games=min(n, n_games), rule=rule)
