"""Run manifests (appendix A.1): git state, checkpoint hashes, JSON round trip."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from memprism_ray.eval.episodes import build_episode_list
from memprism_ray.eval.manifest import RunManifest, checkpoint_digest, git_revision
from memprism_ray.policy.config import PolicyConfig
from memprism_ray.policy.prompts import PROMPT_VERSION

GAMES = [f"game-{i:03d}" for i in range(12)]
HAS_GIT = shutil.which("git") is not None


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make(tmp_path: Path, **kw) -> RunManifest:
    ckpt = tmp_path / "router.safetensors"
    ckpt.write_bytes(b"weights" * 100)
    defaults = dict(
        episodes=build_episode_list("valid_unseen", GAMES, seed=4),
        model_ids={"task_policy": "Qwen/Qwen2.5-VL-7B-Instruct", "minilm": "sentence-transformers/all-MiniLM-L6-v2"},
        prompt_version=PROMPT_VERSION,
        decoding=PolicyConfig().decoding(),
        output_paths={"report": str(tmp_path / "report.json")},
        checkpoints={"router": ckpt},
        condition="memprism",
        repo_dir=tmp_path,
    )
    defaults.update(kw)
    return RunManifest.create(**defaults)


def test_manifest_covers_the_split_and_round_trips(tmp_path: Path) -> None:
    m = make(tmp_path)
    assert Counter(m.episodes().game_ids) == Counter(GAMES)  # each game exactly once, in order
    assert m.n_unique_games == 12 and m.seed == 4 and "exactly once" in m.episode_rule
    assert m.checkpoint_sha256["router"] == hashlib.sha256(b"weights" * 100).hexdigest()
    assert m.prompt_version == "memprism-prompts-v3" and m.decoding["backend"] == "scripted"
    path = m.save(tmp_path / "out" / "manifest.json")
    loaded = RunManifest.load(path)
    assert loaded == m
    data = json.loads(path.read_text())
    assert data["episode_ids"] == list(m.episode_ids) and data["schema"] == "memprism-run-manifest/1"
    assert data["created"].endswith("+00:00")


def test_outside_a_git_checkout_the_revision_is_unknown(tmp_path: Path) -> None:
    m = make(tmp_path)
    assert (m.code_revision, m.code_dirty) == ("unknown", None)
    assert git_revision(tmp_path / "does-not-exist") == ("unknown", None)


@pytest.mark.skipif(not HAS_GIT, reason="git not installed")
def test_git_revision_and_dirty_flag(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "init")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_revision(repo) == (head, False)
    (repo / "a.py").write_text("x = 2\n")
    assert git_revision(repo) == (head, True)
    _git(repo, "checkout", "-q", "--", "a.py")
    (repo / "new.py").write_text("")
    assert git_revision(repo) == (head, True)  # untracked files can change results too
    m = make(tmp_path, repo_dir=repo)
    assert m.code_revision == head and m.code_dirty is True


def test_directory_checkpoints_hash_names_and_contents(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"a")
    (d / "sub" / "b.bin").write_bytes(b"b")
    first = checkpoint_digest(d)
    assert first == checkpoint_digest(d) and len(first) == 64
    (d / "sub" / "b.bin").write_bytes(b"c")
    assert checkpoint_digest(d) != first
    (d / "sub" / "b.bin").write_bytes(b"b")
    (d / "sub" / "b.bin").rename(d / "sub" / "renamed.bin")
    assert checkpoint_digest(d) != first
    with pytest.raises(ValueError, match="does not exist"):
        checkpoint_digest(tmp_path / "missing")


def test_a_directory_checkpoints_recorded_digest_is_fixed(tmp_path: Path) -> None:
    """Manifests already written name checkpoints by this digest: it never changes for the same
    files (pinned: sorted relative paths, ``a/b/z`` before ``a-c.bin`` as path parts sort)."""
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "a" / "b").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"a")
    (d / "sub" / "b.bin").write_bytes(b"b")
    (d / "a-c.bin").write_bytes(b"x")
    (d / "a" / "b" / "z").write_bytes(b"z")
    assert checkpoint_digest(d) == "74de605d1994a5cf1839cb0fb59f4d37c9543d405e67a457a3b1f14045586dd1"
    assert checkpoint_digest(d / "a.bin") == hashlib.sha256(b"a").hexdigest()  # a file: its own SHA-256
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        checkpoint_digest(tmp_path / "empty")


def test_bad_manifests_are_rejected(tmp_path: Path) -> None:
    m = make(tmp_path)
    data = m.to_dict()
    with pytest.raises(ValueError, match="unknown run manifest fields: colour"):
        RunManifest.from_dict({**data, "colour": "red"})
    with pytest.raises(ValueError, match="lacks required fields: split"):
        RunManifest.from_dict({k: v for k, v in data.items() if k != "split"})
    with pytest.raises(ValueError, match="not from split"):
        RunManifest.from_dict({**data, "split": "train"})
    with pytest.raises(ValueError, match="unique"):
        RunManifest.from_dict({**data, "episode_ids": data["episode_ids"] + data["episode_ids"][:1]})
    with pytest.raises(ValueError, match="SHA-256"):
        RunManifest.from_dict({**data, "checkpoint_sha256": {"router": "abc"}})
    with pytest.raises(ValueError, match="schema"):
        RunManifest.from_dict({**data, "schema": "memprism-run-manifest/0"})
    with pytest.raises(ValueError, match="JSON-serialisable"):
        RunManifest.from_dict({**data, "decoding": {"fn": print}})
    with pytest.raises(ValueError, match="not valid JSON"):
        RunManifest.from_json("{not json")
    with pytest.raises(FileNotFoundError):
        RunManifest.load(tmp_path / "nope.json")
