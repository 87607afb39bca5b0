"""The generated corpus: layout, manifest, ALFWorld's own AlfredTWEnv, resume, determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memprism_ray.benchmark.alfworld.corpus import (
    DEFAULT_EVAL_GAMES,
    DEFAULT_SEED,
    DEFAULT_TRAIN_GAMES,
    CorpusConfig,
    allocate,
    build_corpus,
    default_cache_dir,
    ensure_default_corpus,
    read_manifest,
)
from memprism_ray.benchmark.alfworld.generator import TASK_TYPES
from memprism_ray.io_atomic import sha256_file


def test_allocate_covers_all_types_and_sums() -> None:
    for n in (0, 3, 6, 24, 140, 3827):
        alloc = allocate(n)
        assert sum(alloc.values()) == n
        if n >= 6:
            assert min(alloc.values()) >= 1
    full = allocate(3827)
    assert full["pick_two_obj_and_place"] > full["look_at_obj_in_light"]


def test_tree_layout_and_manifest(alfworld_corpus: Path, alfworld_games: dict, alfworld_tiny_config: dict) -> None:
    root = alfworld_corpus
    for d in ("train", "valid_seen", "valid_unseen"):
        assert (root / "json_2.1.1" / d).is_dir()
    assert (root / "logic" / "alfred.pddl").is_file() and (root / "logic" / "alfred.twl2").is_file()
    manifest = read_manifest(root)
    assert manifest is not None and manifest["seed"] == alfworld_tiny_config["seed"]
    for split, games in alfworld_games.items():
        counts = manifest["counts"][split]
        assert sum(counts.values()) == len(games) == 6
        assert counts == {t: sum(g.task_type == t for g in games) for t in TASK_TYPES}
    assert len(manifest["files"]) == 2 + 2 * 18
    assert {rel: sha256_file(root / rel) for rel in manifest["files"]} == manifest["files"]
    for g in alfworld_games["train"]:
        data = json.loads(g.path.read_text())
        assert data["solvable"] is True and data["walkthrough"]
        assert set(data) == {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
        assert "UNKNOWN GOAL" not in data["grammar"]


def test_walkthroughs_win_on_the_eval_games(alfworld_games: dict) -> None:
    from memprism_ray.benchmark.alfworld.env import AlfworldEnv

    with AlfworldEnv(1) as env:
        for split in ("eval_in_distribution", "eval_out_of_distribution"):
            for g in alfworld_games[split][:3]:
                env.reset(g)
                walk = json.loads(g.path.read_text())["walkthrough"]
                for i, command in enumerate(walk):
                    tr = env.step(command)
                    assert tr.feedback != "Nothing happens.", (g.game_id, i, command)
                assert tr.won, g.game_id


def test_alfworlds_own_alfredtwenv_loads_and_plays_the_tree(
    alfworld_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    from memprism_ray.benchmark.alfworld import engine

    engine.uninstall_engine_caches()  # ALFWorld exactly as shipped
    monkeypatch.setenv("ALFWORLD_DATA", str(alfworld_corpus))
    config = {
        "env": {"type": "AlfredTWEnv", "goal_desc_human_anns_prob": 0.0, "task_types": [1, 2, 3, 4, 5, 6],
                "domain_randomization": False, "expert_type": "handcoded"},
        "dataset": {"data_path": "$ALFWORLD_DATA/json_2.1.1/train",
                    "eval_id_data_path": "$ALFWORLD_DATA/json_2.1.1/valid_seen",
                    "eval_ood_data_path": "$ALFWORLD_DATA/json_2.1.1/valid_unseen",
                    "num_train_games": -1, "num_eval_games": -1},
        "logic": {"domain": "$ALFWORLD_DATA/logic/alfred.pddl", "grammar": "$ALFWORLD_DATA/logic/alfred.twl2"},
        "general": {"training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": 50}},
        "rl": {"training": {"max_nb_steps_per_episode": 50}},
    }  # fmt: skip
    for split in ("eval_in_distribution", "eval_out_of_distribution"):
        assert AlfredTWEnv(config, train_eval=split).num_games == 6
    tw = AlfredTWEnv(config, train_eval="train")
    assert tw.num_games == 6
    tw.game_files = sorted(g for g in tw.game_files if "pick_two" not in g)[:1]  # the stock expert loops on pick-two
    env = tw.init_env(batch_size=1)
    try:
        obs, infos = env.reset()
        assert "Your task is to:" in obs[0]
        for _ in range(60):
            obs, _, dones, infos = env.step([infos["extra.expert_plan"][0][0]])
            if dones[0]:
                break
        assert infos["won"][0]
    finally:
        env.close()
        engine.install_engine_caches()


def _build_cmd(out: Path, **kw: int) -> list[str]:
    code = (
        "import sys; from pathlib import Path; "
        "from memprism_ray.benchmark.alfworld.corpus import CorpusConfig, build_corpus; "
        f"build_corpus(CorpusConfig(out=Path({str(out)!r}), **{kw!r}), progress=False)"
    )
    return [sys.executable, "-c", code]


def test_killed_build_resumes_to_the_same_corpus(tmp_path: Path) -> None:
    kw = {"train": 3, "eval": 0, "seed": 2, "workers": 1}
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_build_cmd(killed, **kw), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    slots = killed / ".build" / "slots"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (slots.is_dir() and any(slots.glob("*.json"))):
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    assert not (killed / "manifest.json").exists(), "the build finished before it could be killed"
    done_before = {p.name for p in slots.glob("*.json")}
    assert 1 <= len(done_before) < 3
    build_corpus(CorpusConfig(out=killed, **kw), progress=False)
    fresh = tmp_path / "fresh"
    build_corpus(CorpusConfig(out=fresh, **{**kw, "workers": 2}), progress=False)
    a, b = read_manifest(killed), read_manifest(fresh)
    assert a["files"] == b["files"] and a["games"] == b["games"]
    tmp_left = killed / ".build" / "tmp"
    assert not tmp_left.exists() or not any(tmp_left.iterdir())  # half-written games were cleared
    with pytest.raises(ValueError, match="other settings"):
        build_corpus(CorpusConfig(out=killed, train=4, eval=0, seed=2, workers=1), progress=False)


def test_a_user_data_tree_is_not_built_into(tmp_path: Path) -> None:
    """``memprism games build --out`` naming an alfworld-download tree copied the packaged PDDL
    over its ``logic/`` and mixed the built games into its ``json_2.1.1``."""
    real = tmp_path / "alfworld-download"
    (real / "logic").mkdir(parents=True)
    (real / "logic" / "alfred.pddl").write_text("the user's domain")
    with pytest.raises(ValueError, match="holds files but no corpus build"):
        build_corpus(CorpusConfig(out=real, train=1, eval=0, workers=1), progress=False)
    assert sorted(p.name for p in real.iterdir()) == ["logic"]
    assert (real / "logic" / "alfred.pddl").read_text() == "the user's domain"


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="all 0"):
        CorpusConfig(out=tmp_path, train=0, eval=0)
    with pytest.raises(ValueError, match="train size"):
        CorpusConfig(out=tmp_path, train=-1)
    with pytest.raises(ValueError, match="workers"):
        CorpusConfig(out=tmp_path, workers=0)


def test_ensure_default_corpus_is_safe_under_concurrency(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "corpus"
    code = (
        "from pathlib import Path; from memprism_ray.benchmark.alfworld.corpus import ensure_default_corpus; "
        f"print(ensure_default_corpus(Path({str(cache)!r}), train=2, eval=0, seed=4, workers=1))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    pipe = subprocess.PIPE
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=pipe, stderr=pipe, text=True, env=env) for _ in "ab"]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o[0].strip() for o in outs] == [str(cache)] * 2
    assert sum("building the embedded" in o[1] for o in outs) == 1  # one built, the other waited
    assert read_manifest(cache)["sizes"]["train"] == 2
    # a third call returns at once, without building
    t0 = time.monotonic()
    assert ensure_default_corpus(cache, train=2, eval=0, seed=4, workers=1, progress=False) == cache
    assert time.monotonic() - t0 < 5


def test_default_cache_folders_are_per_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that built an earlier default keeps working when the default sizes change: every
    size gets its own folder, the default included (one folder per seed refused the new sizes)."""
    monkeypatch.setenv("MEMPRISM_CACHE", str(tmp_path))
    name = f"alfworld-corpus-{DEFAULT_SEED}-t{DEFAULT_TRAIN_GAMES}-e{DEFAULT_EVAL_GAMES}"
    assert default_cache_dir() == tmp_path / name
    assert default_cache_dir(DEFAULT_SEED, DEFAULT_TRAIN_GAMES, DEFAULT_EVAL_GAMES + 1) != default_cache_dir()
    first = ensure_default_corpus(train=1, eval=0, seed=4, workers=1, progress=False)
    second = ensure_default_corpus(train=2, eval=0, seed=4, workers=1, progress=False)
    assert first != second
    assert [read_manifest(p)["sizes"]["train"] for p in (first, second)] == [1, 2]


def test_full_size_plan_keeps_eval_combinations_unseen_in_train(tmp_path: Path) -> None:
    from memprism_ray.benchmark.alfworld.corpus import plan_slots
    from memprism_ray.benchmark.alfworld.layouts import test_scenes as held_out

    slots = plan_slots(CorpusConfig(out=tmp_path))  # ALFWorld's sizes: 3,827 + 140 + 140
    by_split: dict[str, set] = {}
    for s in slots:
        by_split.setdefault(s.split, set()).update(s.candidates)
    assert sum(s.split == "train" for s in slots) == 3827
    assert sum(s.split == "eval_in_distribution" for s in slots) == 140
    assert by_split["train"].isdisjoint(by_split["eval_in_distribution"])
    assert all(c.scene_num in held_out() for c in by_split["eval_out_of_distribution"])
    assert not any(c.scene_num in held_out() for c in by_split["train"] | by_split["eval_in_distribution"])
    assert plan_slots(CorpusConfig(out=tmp_path)) == slots  # deterministic


def test_corpus_lock_wait_ends_in_a_clear_error(tmp_path: Path) -> None:
    """A build held by another process is waited for at most lock_timeout_s."""
    import fcntl

    root = tmp_path / "corpus"
    lock = root.with_name(root.name + ".lock")
    with lock.open("w") as fh:
        fh.write("4242")
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX)  # another open file description: conflicts like another process
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"waited 0\.5s for the lock .*corpus\.lock \(held by process 4242"):
            ensure_default_corpus(root, train=6, eval=6, seed=11, workers=1, progress=False, lock_timeout_s=0.5)
        assert time.monotonic() - t0 < 5
    with pytest.raises(ValueError, match="must be > 0"):
        ensure_default_corpus(root, train=6, eval=6, seed=11, workers=1, progress=False, lock_timeout_s=-1)
