"""Run manifests (paper appendix A.1 "Artifact and result provenance", A.2, B): code revision
and working-tree status, split, ordered episode list, seed, model ids, checkpoint SHA-256 hashes
(models are bound by id and hash, never by local path alone), prompt version, decoding settings
and output paths.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memprism_ray.eval.episodes import EpisodeList, parse_episode_id
from memprism_ray.io_atomic import atomic_write_text, loads_json, sha256_path, tree_files
from memprism_ray.registry import DEFAULT_BENCHMARK

SCHEMA = "memprism-run-manifest/1"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def git_revision(path: str | Path = ".") -> tuple[str, bool | None]:
    """``(commit sha, dirty)`` of the checkout holding ``path`` (dirty: tracked changes or untracked
    files, either can change results); ``("unknown", None)`` outside one."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", None
    if not re.fullmatch(r"[0-9a-f]{40,64}", rev):
        return "unknown", None
    return rev, bool(status.strip())


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 of a checkpoint file or directory; a missing or empty checkpoint is refused."""
    path = Path(path)
    if not (path.is_file() or path.is_dir()):
        raise ValueError(f"checkpoint {path} does not exist")
    if path.is_dir() and not tree_files(path):
        raise ValueError(f"checkpoint directory {path} holds no files")
    return sha256_path(path)


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunManifest:
    """What one evaluation or training run was, exactly enough to rerun and audit it."""

    split: str
    episode_ids: tuple[str, ...]
    n_unique_games: int
    episode_rule: str
    seed: int
    model_ids: dict[str, str]
    checkpoint_sha256: dict[str, str]
    prompt_version: str
    decoding: dict[str, Any]
    output_paths: dict[str, str]
    code_revision: str = "unknown"
    code_dirty: bool | None = None
    condition: str = ""
    benchmark: str = DEFAULT_BENCHMARK
    created: str = field(default_factory=_utc_now)
    extra: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        object.__setattr__(self, "episode_ids", tuple(self.episode_ids))
        if self.schema != SCHEMA:
            raise ValueError(f"unsupported manifest schema {self.schema!r}; this code reads {SCHEMA!r}")
        if not self.episode_ids:
            raise ValueError("a run manifest needs a non-empty ordered episode list")
        if len(set(self.episode_ids)) != len(self.episode_ids):
            raise ValueError("manifest episode ids must be unique")
        for eid in self.episode_ids:
            if parse_episode_id(eid)[0] != self.split:
                raise ValueError(f"episode {eid!r} is not from split {self.split!r}")
        if not 1 <= self.n_unique_games <= len(self.episode_ids):
            raise ValueError(f"n_unique_games must be in 1..{len(self.episode_ids)}, got {self.n_unique_games}")
        for name, digest in self.checkpoint_sha256.items():
            if not isinstance(digest, str) or not _SHA256.match(digest):
                raise ValueError(f"checkpoint_sha256[{name!r}] is not a lowercase hex SHA-256: {digest!r}")
        for name in ("model_ids", "output_paths"):
            bad = {k: v for k, v in getattr(self, name).items() if not isinstance(k, str) or not isinstance(v, str)}
            if bad:
                raise ValueError(f"{name} must map strings to strings, got {bad}")
        if not self.prompt_version:
            raise ValueError("prompt_version must be set (e.g. memprism_ray.policy.PROMPT_VERSION)")
        try:
            json.dumps(self.decoding)
            json.dumps(self.extra)
        except TypeError as exc:
            raise ValueError(f"decoding and extra must be JSON-serialisable: {exc}") from None

    @classmethod
    def create(
        cls,
        *,
        episodes: EpisodeList,
        model_ids: Mapping[str, str],
        prompt_version: str,
        decoding: Mapping[str, Any],
        output_paths: Mapping[str, str | Path],
        checkpoints: Mapping[str, str | Path] | None = None,
        checkpoint_sha256: Mapping[str, str] | None = None,
        condition: str = "",
        benchmark: str = DEFAULT_BENCHMARK,
        repo_dir: str | Path | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> RunManifest:
        """A manifest for a run now: git state read, ``checkpoints`` (paths) hashed."""
        hashes = dict(checkpoint_sha256 or {})
        for name, path in (checkpoints or {}).items():
            hashes[name] = checkpoint_digest(path)
        rev, dirty = git_revision(repo_dir if repo_dir is not None else Path(__file__).resolve().parent)
        return cls(
            split=episodes.split,
            episode_ids=episodes.episode_ids,
            n_unique_games=episodes.n_unique_games,
            episode_rule=episodes.rule,
            seed=episodes.seed,
            model_ids=dict(model_ids),
            checkpoint_sha256=hashes,
            prompt_version=prompt_version,
            decoding=dict(decoding),
            output_paths={k: str(v) for k, v in output_paths.items()},
            code_revision=rev,
            code_dirty=dirty,
            condition=condition,
            benchmark=benchmark,
            extra=dict(extra or {}),
        )

    def episodes(self) -> EpisodeList:
        """The episode list this manifest records."""
        return EpisodeList(self.split, self.seed, self.episode_ids, self.n_unique_games, self.episode_rule)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["episode_ids"] = list(self.episode_ids)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunManifest:
        fields = dataclasses.fields(cls)
        unknown = sorted(set(data) - {f.name for f in fields})
        if unknown:
            raise ValueError(f"unknown run manifest fields: {', '.join(unknown)}")
        required = [f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING]
        missing = sorted(set(required) - set(data))
        if missing:
            raise ValueError(f"run manifest lacks required fields: {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> RunManifest:
        data = loads_json(text, "run manifest")
        if not isinstance(data, dict):
            raise ValueError("run manifest JSON must be an object")
        return cls.from_dict(data)

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Written atomically; an existing manifest is never replaced unless ``overwrite``."""
        return atomic_write_text(path, self.to_json() + "\n", overwrite=overwrite)

    @classmethod
    def load(cls, path: str | Path) -> RunManifest:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"run manifest {path} does not exist")
        return cls.from_json(path.read_text(encoding="utf-8"))
