"""Build, resume and cache a corpus of ALFWorld-style games (issue 3, item 1).

Games are written in the ``alfworld-download`` layout (with ``logic/``, so ALFWorld's own
``AlfredTWEnv`` runs on the tree); a game enters the corpus only once the handcoded expert
wins it on the real engine, and its winning commands are its ``walkthrough``.

Determinism: the corpus is a function of ``(seed, train, eval)``: attempt ``j`` of slot
``(split, task type, k)`` uses a fixed combination and placement seed, so which worker builds
a slot, and when, never matters. Eval-in-distribution combinations are reserved before train
draws (unseen in train); eval-out-of-distribution uses ALFRED's held-out scenes only.
Resumability: finished slots are renamed into place, then recorded in ``.build/slots/``;
``manifest.json`` is written last, so its presence means the build completed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.alfworld.generator import (
    SPLIT_DIRS,
    TASK_TYPES,
    TaskSpec,
    enumerate_task_specs,
    generate_game,
    write_json,
)
from memprism_ray.benchmark.alfworld.layouts import test_scenes, train_scenes
from memprism_ray.config_tree import Seed
from memprism_ray.config_tree import field as cfg_field
from memprism_ray.envs.base import cache_base
from memprism_ray.io_atomic import atomic_write_text, file_lock, holds_files, sha256_file

log = logging.getLogger(__name__)

FORMAT = "memprism-alfworld-corpus"
#: Bump when the generator's output for a given seed changes.
GENERATOR_VERSION = 1
JSON_DIR = "json_2.1.1"

#: ALFWorld's corpus sizes (paper: 3,827 training instances, 140 evaluation games).
ALFWORLD_TRAIN_GAMES = 3827
ALFWORLD_EVAL_GAMES = 140

#: Embedded default: built in under 2 minutes on 2 cores (144 games, 78 s measured), enough for a
#: few GRPO groups per task type and a 48-game evaluation per split.
DEFAULT_TRAIN_GAMES = 48
DEFAULT_EVAL_GAMES = 48
DEFAULT_SEED = 0

#: Task mix, close to that of ALFWorld's 3,553 training games.
TASK_WEIGHTS: dict[str, float] = {
    "pick_and_place_simple": 790,
    "look_at_obj_in_light": 308,
    "pick_clean_then_place_in_recep": 650,
    "pick_heat_then_place_in_recep": 459,
    "pick_cool_then_place_in_recep": 533,
    "pick_two_obj_and_place": 813,
}


@dataclass(frozen=True)
class CorpusConfig:
    """Settings of one corpus build."""

    out: Path = cfg_field(help="output folder (the ALFWORLD_DATA root of the new tree)")
    train: int = cfg_field(ALFWORLD_TRAIN_GAMES, help="number of training games")
    eval: int = cfg_field(ALFWORLD_EVAL_GAMES, help="games per evaluation split (ID and OOD)")
    seed: Seed = cfg_field(DEFAULT_SEED, help="corpus seed; the corpus is a function of it")
    workers: int = cfg_field(default_factory=lambda: os.cpu_count() or 1, help="worker processes")
    max_attempts: int = cfg_field(8, help="games tried per slot before the build fails")
    expert_max_steps: int = cfg_field(120, help="commands the expert may use to win a game")

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", Path(self.out))
        minimum = {"train size": 0, "eval size": 0, "seed": 0, "workers": 1, "max_attempts": 1, "expert_max_steps": 1}
        for what, lo in minimum.items():
            v = getattr(self, what.removesuffix(" size"))
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"corpus {what} must be an int >= {lo}, got {v!r}")
        if self.train + self.eval == 0:
            raise ValueError("corpus sizes are all 0: ask for --train and/or --eval games")

    def sizes(self) -> dict[str, int]:
        return {"train": self.train, "eval_in_distribution": self.eval, "eval_out_of_distribution": self.eval}

    def identity(self) -> dict[str, Any]:
        """What determines the corpus content: not ``max_attempts`` (attempt ``j`` of a slot is the
        same game whatever the limit, so a build that ran out can be finished with a larger one)."""
        return {
            "format": FORMAT,
            "generator_version": GENERATOR_VERSION,
            "seed": self.seed,
            "sizes": self.sizes(),
            "expert_max_steps": self.expert_max_steps,
        }


def allocate(n: int, weights: Mapping[str, float] = TASK_WEIGHTS) -> dict[str, int]:
    """Split ``n`` games over task types by largest remainder; every type gets one when n >= 6."""
    types = list(TASK_TYPES)
    base = 1 if n >= len(types) else 0
    rest = n - base * len(types)
    total = sum(weights[t] for t in types)
    quotas = {t: rest * weights[t] / total for t in types}
    alloc = {t: base + int(quotas[t]) for t in types}
    left = n - sum(alloc.values())
    for t in sorted(types, key=lambda t: (-(quotas[t] - int(quotas[t])), types.index(t)))[:left]:
        alloc[t] += 1
    return alloc


@dataclass(frozen=True)
class Slot:
    """One game position of the corpus and the combinations its attempts use."""

    split: str
    task_type: str
    index: int
    candidates: tuple[TaskSpec, ...]

    @property
    def key(self) -> str:
        return f"{self.split}/{self.task_type}/{self.index:06d}"


def plan_slots(cfg: CorpusConfig) -> list[Slot]:
    """Every slot with its attempt candidates; cheap (no engine), deterministic."""
    train_specs, test_specs = enumerate_task_specs(train_scenes()), enumerate_task_specs(test_scenes())
    alloc = {split: allocate(n) for split, n in cfg.sizes().items()}
    slots: list[Slot] = []
    for task in TASK_TYPES:
        train_pool = [s for s in train_specs if s.task_type == task]
        random.Random(f"{cfg.seed}:pool:train:{task}").shuffle(train_pool)
        ood_pool = [s for s in test_specs if s.task_type == task]
        random.Random(f"{cfg.seed}:pool:ood:{task}").shuffle(ood_pool)
        n_id = alloc["eval_in_distribution"][task]
        if n_id and len(train_pool) < 2 * n_id:
            raise ValueError(
                f"only {len(train_pool)} {task} combinations in train scenes; too few for {n_id} eval games"
            )
        pools = {"train": train_pool[n_id:], "eval_in_distribution": train_pool[:n_id]}
        pools["eval_out_of_distribution"] = ood_pool
        for split in SPLIT_DIRS:
            n = alloc[split][task]
            pool = pools[split]
            if n and not pool:
                raise ValueError(f"no valid {task} combination for split {split}")
            for k in range(n):
                cands = tuple(pool[(k + j * max(n, 1)) % len(pool)] for j in range(cfg.max_attempts))
                slots.append(Slot(split, task, k, cands))
    return slots


_WORKER: dict[str, Any] = {}


def _worker_init() -> None:
    from memprism_ray.benchmark.alfworld.engine import install_engine_caches, make_engine, packaged_logic

    install_engine_caches(max_translations=8)
    _WORKER["engine"] = make_engine(expert=True)
    _WORKER["domain"], _WORKER["grammar"] = (p.read_text() for p in packaged_logic())


def _build_slot(out: str, seed: int, slot: Slot, expert_max_steps: int) -> dict[str, Any]:
    """Try the slot's candidates in order; the first game the expert wins is kept."""
    from memprism_ray.benchmark.alfworld.expert import ExpertFailed, expert_walkthrough

    if not _WORKER:
        _worker_init()
    root = Path(out)
    failures: list[str] = []
    head = {"slot": slot.key, "split": slot.split, "task_type": slot.task_type, "failures": failures}
    for attempt, spec in enumerate(slot.candidates):
        trial = f"trial_T{seed:08d}_{slot.index:06d}_a{attempt}"
        rel = Path(JSON_DIR) / SPLIT_DIRS[slot.split] / spec.task_folder / trial
        tmp = root / ".build" / "tmp" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        try:
            digest = hashlib.sha256(f"{seed}:{slot.key}:{attempt}".encode()).digest()
            game = generate_game(spec, seed=int.from_bytes(digest[:8], "big"), trial=trial)
            write_json(tmp / "traj_data.json", game.traj_data)
            write_json(tmp / "game.tw-pddl", game.game_json(_WORKER["domain"], _WORKER["grammar"], None))
            walkthrough = expert_walkthrough(_WORKER["engine"], tmp / "game.tw-pddl", max_steps=expert_max_steps)
        except (ValueError, ExpertFailed) as exc:
            failures.append(f"{spec.task_folder} attempt {attempt}: {exc}")
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        write_json(tmp / "game.tw-pddl", game.game_json(_WORKER["domain"], _WORKER["grammar"], walkthrough))
        final = root / rel
        if final.exists():  # left by a build killed between rename and record: same content
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, final)
        result = {**head, "game_id": f"{spec.task_folder}/{trial}", "path": rel.as_posix(), "scene": spec.scene_num}
        result |= {"expert_steps": len(walkthrough), "attempts": attempt + 1}
        _atomic_write_json(root / ".build" / "slots" / f"{slot.key.replace('/', '__')}.json", result)
        return result
    return {**head, "path": None}


def _atomic_write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, sort_keys=True, indent=1), overwrite=True)


def _load_done(root: Path) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    slot_dir = root / ".build" / "slots"
    if not slot_dir.is_dir():
        return done
    for f in sorted(slot_dir.glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # a torn record: the slot is rebuilt
        if rec.get("path") and (root / rec["path"] / "game.tw-pddl").is_file():
            done[rec["slot"]] = rec
    return done


def _check_identity(root: Path, cfg: CorpusConfig) -> None:
    ident_path = root / ".build" / "config.json"
    if ident_path.exists():
        try:
            previous = json.loads(ident_path.read_text())
        except (OSError, json.JSONDecodeError):
            previous = None
        if previous != cfg.identity():
            raise ValueError(
                f"{root} holds a build with other settings ({previous}); resume it with the same "
                f"--train/--eval/--seed or choose another --out"
            )
    else:
        manifest = root / "manifest.json"
        if manifest.exists():
            raise ValueError(f"{root} already holds a finished corpus without build state; choose another --out")
        if holds_files(root, ignore=[".build"]):  # a data tree of the user's: games mixed into it
            raise ValueError(
                f"{root} holds files but no corpus build (.build/config.json), an alfworld-download tree perhaps: the "
                "built games would be mixed into it; choose an empty or absent --out"
            )
        _atomic_write_json(ident_path, cfg.identity())


def build_corpus(cfg: CorpusConfig, *, progress: bool = True) -> Path:
    """Build (or finish) the corpus described by ``cfg``; returns the path of its manifest."""
    from importlib.metadata import version

    from memprism_ray.benchmark.alfworld.engine import packaged_logic

    root = cfg.out
    root.mkdir(parents=True, exist_ok=True)
    _check_identity(root, cfg)
    shutil.rmtree(root / ".build" / "tmp", ignore_errors=True)
    (root / "logic").mkdir(parents=True, exist_ok=True)  # as alfworld-download places them
    for src, name in zip(packaged_logic(), ("alfred.pddl", "alfred.twl2"), strict=True):
        shutil.copyfile(src, root / "logic" / name)
    slots = plan_slots(cfg)
    done = _load_done(root)
    todo = [s for s in slots if s.key not in done]
    log.info("corpus %s: %d games planned, %d already built, %d to build", root, len(slots), len(done), len(todo))
    if progress:
        print(
            f"memprism games build: {len(slots)} games ({len(done)} done, {len(todo)} to build) "
            f"with {min(cfg.workers, max(len(todo), 1))} worker(s) -> {root}",
            file=sys.stderr,
            flush=True,
        )
    failed: list[dict[str, Any]] = []
    if todo:
        for rec in _run(cfg, todo, progress):
            if rec.get("path"):
                done[rec["slot"]] = rec
            else:
                failed.append(rec)
    if failed:
        first = failed[0]
        raise RuntimeError(
            f"{len(failed)} game slot(s) found no game the expert wins in {cfg.max_attempts} attempts "
            f"(first: {first['slot']}: {first['failures'][-1] if first['failures'] else '?'}); "
            f"the games built so far are kept: rerun with a larger --max-attempts to finish"
        )
    games = [done[s.key] for s in slots]
    rels = ["logic/alfred.pddl", "logic/alfred.twl2"]
    rels += [f"{rec['path']}/{name}" for rec in games for name in ("game.tw-pddl", "traj_data.json")]
    files = {rel: sha256_file(root / rel) for rel in rels}
    counts = {split: dict.fromkeys(TASK_TYPES, 0) for split in SPLIT_DIRS}
    for rec in games:
        counts[rec["split"]][rec["task_type"]] += 1
    manifest = {
        **cfg.identity(),
        "alfworld_version": version("alfworld"),
        "splits": dict(SPLIT_DIRS),
        "counts": counts,
        "games": [
            {k: rec[k] for k in ("split", "task_type", "game_id", "path", "scene", "expert_steps", "attempts")}
            for rec in games
        ],
        "rejected_attempts": sum(rec["attempts"] - 1 for rec in games),
        "files": dict(sorted(files.items())),
        "note": (
            "ALFWorld-style games generated from the scene layouts packaged in alfworld; not the official "
            "ALFWorld games (no THOR placements, no human goal annotations, generated splits)"
        ),
    }
    _atomic_write_json(root / "manifest.json", manifest)
    return root / "manifest.json"


def _run(cfg: CorpusConfig, todo: list[Slot], progress: bool) -> Iterator[dict[str, Any]]:
    from memprism_ray.progress import progress_bar

    bar = progress_bar(total=len(todo), desc="games", unit="game", disable=not progress, file=sys.stderr)
    t0 = time.monotonic()
    workers = min(cfg.workers, len(todo))
    try:
        here = (_build_slot(str(cfg.out), cfg.seed, s, cfg.expert_max_steps) for s in todo)
        for rec in here if workers == 1 else _run_subprocesses(cfg, todo, workers):
            bar.update(1)
            yield rec
    finally:
        bar.close()
        log.info("built %d game slot(s) in %.1fs", len(todo), time.monotonic() - t0)


def _run_subprocesses(cfg: CorpusConfig, todo: list[Slot], workers: int) -> Iterator[dict[str, Any]]:
    """Worker processes fed one slot at a time over pipes. Plain subprocesses rather than
    ``multiprocessing``: fast-downward's translator is not thread-safe (processes are needed),
    ``spawn`` would re-import the caller's ``__main__`` (breaking scripts without a main guard),
    and ``fork`` is unsafe inside Ray workers."""
    import selectors
    import subprocess

    queue = list(reversed(todo))
    procs: list[subprocess.Popen[str]] = []
    sel = selectors.DefaultSelector()
    try:
        for _ in range(workers):
            p = subprocess.Popen(
                [sys.executable, "-m", "memprism_ray.benchmark.alfworld.corpus", "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            procs.append(p)
            sel.register(p.stdout, selectors.EVENT_READ, p)  # type: ignore[arg-type]
        busy = 0

        def feed(p: subprocess.Popen[str]) -> None:
            nonlocal busy
            slot = queue.pop()
            job = {"out": str(cfg.out), "seed": cfg.seed, "expert_max_steps": cfg.expert_max_steps}
            assert p.stdin is not None
            p.stdin.write(json.dumps({**job, "slot": dataclasses.astuple(slot)}) + "\n")
            p.stdin.flush()
            busy += 1

        for p in procs:
            if queue:
                feed(p)
        while busy:
            for key, _ in sel.select():
                p = key.data
                line = p.stdout.readline()
                if not line:
                    code = p.wait()
                    raise RuntimeError(
                        f"a corpus worker exited with code {code}; the games built so far are kept, rerun to resume"
                    )
                busy -= 1
                yield json.loads(line)
                if queue:
                    feed(p)
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                if p.stdin:
                    p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        sel.close()


def _worker_main() -> int:
    """Read one JSON job per line on stdin, answer one JSON result per line, on a private copy
    of the stdout descriptor: fd 1 goes to /dev/null, so the engine's prints never corrupt it."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        split, task, index, cands = job["slot"]
        slot = Slot(split, task, index, tuple(TaskSpec(*c) for c in cands))
        rec = _build_slot(job["out"], int(job["seed"]), slot, int(job["expert_max_steps"]))
        proto.write(json.dumps(rec) + "\n")
        proto.flush()
    return 0


def read_manifest(root: Path) -> dict[str, Any] | None:
    path = Path(root) / "manifest.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def default_cache_dir(
    seed: int = DEFAULT_SEED,
    train: int = DEFAULT_TRAIN_GAMES,
    eval: int = DEFAULT_EVAL_GAMES,
    base: Path | None = None,
) -> Path:
    """``<base>/alfworld-corpus-<seed>-t<train>-e<eval>`` (``base``: :func:`cache_base`). The sizes
    are in the name: a build of other sizes in the same folder would be refused, so a change of
    the default sizes would break every machine that had built the previous default."""
    return Path(base or cache_base()).expanduser() / f"alfworld-corpus-{seed}-t{train}-e{eval}"


#: Longest wait for another process's corpus build (a full default build takes minutes).
DEFAULT_LOCK_TIMEOUT_S = 1800.0
LOCK_TIMEOUT_ENV = "MEMPRISM_CORPUS_LOCK_TIMEOUT_S"


def _lock_timeout(value: float | None) -> float:
    if value is None:
        raw = os.environ.get(LOCK_TIMEOUT_ENV, "")
        try:
            value = float(raw) if raw else DEFAULT_LOCK_TIMEOUT_S
        except ValueError:
            raise ValueError(f"${LOCK_TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if not value > 0:
        raise ValueError(f"corpus lock timeout must be > 0 seconds, got {value!r}")
    return float(value)


def ensure_default_corpus(
    cache_dir: Path | None = None,
    train: int = DEFAULT_TRAIN_GAMES,
    eval: int = DEFAULT_EVAL_GAMES,
    seed: int = DEFAULT_SEED,
    workers: int | None = None,
    progress: bool = True,
    lock_timeout_s: float | None = None,
) -> Path:
    """The embedded default corpus: built on first use (a few minutes), then reused. One process
    builds under a file lock; the others wait (at most ``lock_timeout_s``, default
    ``$MEMPRISM_CORPUS_LOCK_TIMEOUT_S`` or 1800 s) and then find the finished manifest."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir(seed, train, eval)
    cfg = CorpusConfig(out=root, train=train, eval=eval, seed=seed, workers=workers or (os.cpu_count() or 1))
    if _matches(root, cfg):
        return root
    timeout = _lock_timeout(lock_timeout_s)
    with file_lock(
        root.with_name(root.name + ".lock"), timeout, what=f"building {root}", hint=f"raise ${LOCK_TIMEOUT_ENV}"
    ):
        if not _matches(root, cfg):
            if progress:
                print(f"memprism: building the embedded ALFWorld corpus in {root} (first use)", file=sys.stderr)
            build_corpus(cfg, progress=progress)
    return root


def _matches(root: Path, cfg: CorpusConfig) -> bool:
    manifest = read_manifest(root)
    if manifest is None:
        return False
    ident = cfg.identity()
    return all(manifest.get(k) == v for k, v in ident.items())


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    sys.exit(_worker_main())
