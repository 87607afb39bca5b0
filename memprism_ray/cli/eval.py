"""``memprism eval`` (the evaluation of ``jobs/eval_<benchmark>.py``,
:func:`memprism_ray.trainer.fit.run_evaluation`, with a command's options) and ``memprism
compare`` (paper appendix C evaluation protocol).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from memprism_ray.cli import CliError
from memprism_ray.config_tree import int_at_least, seed_arg
from memprism_ray.eval.compare import Outcomes, split_pairs
from memprism_ray.registry import DEFAULT_BENCHMARK, known_benchmarks

#: option -> the config keys it sets (``--max-steps`` sets both horizons, which must agree).
OPTION_KEYS: dict[str, tuple[str, ...]] = {
    "benchmark": ("corpus.benchmark",),
    "condition": ("eval.conditions",),
    "episodes": ("eval.episodes",),
    "seed": ("run.seed",),
    "data_root": ("corpus.data_root",),
    "slots": ("eval.slots",),
    "workers": ("eval.workers",),
    "max_steps": ("agent.max_steps",),
    "short_history": ("agent.short_history",),
    "policy": ("policy.backend",),
    "artifacts": ("eval.artifacts",),
    "memory_base_url": ("eval.memory.base_url",),
    "memory_model": ("eval.memory.model",),
}

#: Without ``--config``: the command's own defaults (the library's defaults for every other key;
#: the scripted stand-in also gets temperature 0.3 and the run's seed).
DEFAULTS: dict[str, Any] = {
    "run": {"name": "memprism-eval", "seed": 0},
    "eval": {"episodes": 0, "slots": 8, "artifacts": 3},
    "agent": {"max_steps": 50, "short_history": 2},
    "policy": {"backend": "scripted"},
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate one or more conditions on a benchmark (on Ray: local, or the cluster RAY_ADDRESS names)",
        description=(
            "Play the benchmark's evaluation plan (ALFWorld: every game of a split, or --episodes N) under each "
            "condition, on the same ordered episode list, and write report.json, report.md, plots and a run "
            "manifest per condition plus summary.md. The evaluation of jobs/eval_<benchmark>.py: EvalWorker actors "
            "on a local Ray started for the command, or on the cluster RAY_ADDRESS names. Conditions: no_memory, "
            "full_history, recent4, fixed:TAU, fixed_text:TAU, memprism, memprism_text, freq_random, "
            "constrained:FACTOR=VALUE, agentocr, mem0, mem0_graph, amem, langmem (comma-separated for several). "
            "Every episode of the plan is reported; a broken game or a crashed episode counts as a failure, and "
            "the exit code is then 1."
        ),
        epilog=(
            "Without --config the defaults named above apply; with --config FILE (configs/local.yaml, "
            "configs/mind2web_smoke.yaml, configs/ebalfred_smoke.yaml, ...) the preset's values do, and an option "
            "given overrides its key. Any other --section.key VALUE overrides one setting (--help-config lists "
            "them), e.g. --run.ray_address local."
        ),
    )
    p.add_argument("--condition", required=True, help="condition name(s), comma-separated (eval.conditions)")
    p.add_argument("--out", required=True, help="output directory (refused when it already holds an evaluation)")
    p.add_argument("--config", default=None, help="YAML preset whose values replace the defaults named here")
    p.add_argument(
        "--benchmark",
        default=None,
        help=f"{', '.join(known_benchmarks())} (corpus.benchmark; default {DEFAULT_BENCHMARK})",
    )
    for option, (key, help_) in benchmark_eval_options().items():  # e.g. ALFWorld's --split
        p.add_argument(f"--{option.replace('_', '-')}", default=None, help=f"{help_} ({key})")
    p.add_argument("--episodes", type=int, default=None, help="ALFWorld episodes (default 0: each game once)")
    p.add_argument("--seed", type=seed_arg, default=None, help="episode order and policy seed (default 0)")
    p.add_argument("--data-root", default=None, help="ALFWorld data root (default: $ALFWORLD_DATA or built-in corpus)")
    p.add_argument("--checkpoint", default="", help="Router checkpoint for memprism/constrained conditions")
    p.add_argument(
        "--marginal", default=None, help="freq_random marginal: eval dir, report.json, JSON list, or auto (this run)"
    )
    p.add_argument("--slots", type=int, default=None, help="episodes each worker plays step-synchronously (default 8)")
    p.add_argument("--workers", type=int, default=None, help="evaluation workers (Ray actors; default 2)")
    p.add_argument("--max-steps", type=int, default=None, help="environment steps per episode (default 50)")
    p.add_argument(
        "--short-history", type=int, default=None, help="steps of text history H_short in view conditions (default 2)"
    )
    p.add_argument("--policy", default=None, help="task-policy backend: scripted (default), vllm, openai, hf")
    p.add_argument(
        "--policy-temperature", type=float, default=None, help="task-policy sampling temperature (scripted: 0.3)"
    )
    p.add_argument("--artifacts", type=int, default=None, help="episodes per condition with full artifacts (default 3)")
    p.add_argument(
        "--memory-base-url", default=None, help="OpenAI-compatible endpoint of the memory baselines (mem0, amem, ...)"
    )
    p.add_argument("--memory-model", default=None, help="model the memory endpoint serves (default: the config's)")
    p.add_argument("--help-config", action=_HelpConfig, help="list every --section.key setting and exit")
    p.set_defaults(func=_eval, overrides=True)

    c = sub.add_parser(
        "compare",
        help="paired bootstrap difference (SR; Mind2Web: step accuracy too) between two evaluations",
    )
    c.add_argument(
        "dir_a", help="evaluation of A: one condition's directory (holds episodes.parquet), or an --out of eval"
    )
    c.add_argument("dir_b", help="evaluation of B, the same kind: with two --out folders, every condition both hold")
    c.add_argument("--boot", type=int_at_least(1), default=10000, help="bootstrap resamples")
    c.add_argument("--seed", type=seed_arg, default=0, help="bootstrap seed")
    c.set_defaults(func=_compare)


def benchmark_eval_options() -> dict[str, tuple[str, str]]:
    """The registered benchmarks' own options of this command (:attr:`Benchmark.eval_options
    <memprism_ray.benchmark.base.Benchmark.eval_options>`): option -> (config key, help)."""
    from memprism_ray.registry import benchmark_class

    out: dict[str, tuple[str, str]] = {}
    for name in known_benchmarks():
        for option, spec in getattr(benchmark_class(name), "eval_options", {}).items():
            if option in OPTION_KEYS or option in out:
                raise ValueError(f"benchmark {name!r}: memprism eval option --{option} is already taken")
            out[option] = spec
    return out


def eval_config(args: argparse.Namespace, overrides: list[str]) -> Any:
    """The command's config: ``--config`` (else :data:`DEFAULTS`), then the options given, then the
    ``--section.key`` overrides; ``--seed`` also seeds the scripted policy."""
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.config_tree import from_dict, load_yaml, merge, parse_overrides, set_path

    data = load_yaml(args.config) if args.config else copy.deepcopy(DEFAULTS)
    given: dict[str, Any] = {}
    options = {**OPTION_KEYS, **{o: (key,) for o, (key, _) in benchmark_eval_options().items()}}
    for option, keys in options.items():
        value = getattr(args, option)
        for key in keys if value is not None else ():
            set_path(given, key, value)
    if args.marginal is not None:
        set_path(given, "eval.marginal", "" if args.marginal == "auto" else args.marginal)
    data = merge(data, given)
    backend = data.get("policy", {}).get("backend", "scripted")
    if backend == "scripted" and not args.config:
        set_path(data, "policy.scripted.temperature", 0.3)
    if backend == "scripted" and (args.seed is not None or not args.config):
        set_path(data, "policy.scripted.seed", data["run"]["seed"])
    if args.policy_temperature is not None:
        set_path(data, f"policy.{backend}.temperature", args.policy_temperature)
    return from_dict(ExperimentConfig, merge(data, parse_overrides(overrides)))


class _HelpConfig(argparse.Action):
    """``--help-config``: every setting of the config tree with its default, then exit (as ``--help``)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from memprism_ray.trainer.job_args import print_config_help

        print_config_help()
        parser.exit()


def _eval(args: argparse.Namespace, overrides: list[str]) -> int:
    import ray

    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.benchmark.job_spec import check_job
    from memprism_ray.trainer.fit import _eval_say, run_evaluation

    args.condition = [c.strip() for c in args.condition.split(",") if c.strip()]
    cfg = eval_config(args, overrides)
    benchmark = get_benchmark(cfg.corpus.benchmark)
    check_job(benchmark.job_spec("eval"), cfg)  # what the job refuses (and the policy backend can run here)
    started = not ray.is_initialized()
    try:
        return run_evaluation(cfg, benchmark, args.checkpoint, Path(args.out), say=_eval_say, error=_error)
    finally:
        if started and ray.is_initialized():  # a Ray this command started ends with it
            ray.shutdown()


def _error(msg: str) -> None:
    print(f"memprism: error: {msg}", file=sys.stderr, flush=True)


def _evaluations(path: Path) -> dict[str, Path]:
    """The condition directories ``path`` names: itself when it holds ``episodes.parquet`` (key
    ""), else each of its folders that does: the ``--out`` of ``memprism eval``, a run's ``eval/``."""
    if (path / "episodes.parquet").is_file():
        return {"": path}
    found = {d.name: d for d in sorted(path.iterdir()) if (d / "episodes.parquet").is_file()} if path.is_dir() else {}
    if not found:
        raise CliError(
            f"{path} is not an evaluation directory (no episodes.parquet, nor a condition folder holding one)"
        )
    return found


def _pairs(a: Path, b: Path) -> list[tuple[str, Path, Path]]:
    """(condition, A's directory, B's directory): the one pair named, or every condition two
    ``--out`` folders both hold."""
    ea, eb = _evaluations(a), _evaluations(b)
    if "" in ea and "" in eb:
        return [("", a, b)]
    if "" in ea or "" in eb:
        root, leaf = (b, a) if "" in ea else (a, b)
        names = sorted(_evaluations(root))
        raise CliError(
            f"{root} holds the evaluations of {', '.join(names)} and {leaf} one condition's: "
            f"name one of them, e.g. {root / names[0]}"
        )
    common = sorted(set(ea) & set(eb))
    if not common:
        raise CliError(f"{a} ({', '.join(ea)}) and {b} ({', '.join(eb)}) share no condition")
    return [(name, ea[name], eb[name]) for name in common]


def _outcomes(a: Path, b: Path) -> list[tuple[Outcomes, Outcomes]]:
    """Each measure of A's and B's evaluations of one condition, as their benchmark reads them
    (task success alone for a bare episodes table)."""
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.eval.compare import benchmark_of, success

    names = {benchmark_of(a), benchmark_of(b)} - {None}
    if len(names) > 1:
        raise CliError(f"{a} is an evaluation of {benchmark_of(a)} and {b} of {benchmark_of(b)}: compare one benchmark")
    read = get_benchmark(names.pop()).compared if names else success
    return list(zip(read(a), read(b), strict=True))


def _other_settings(a: Path, b: Path, shown: int = 6) -> str | None:
    """A line naming the settings that decide the episodes (``agent.max_steps``, the policy, the
    seed, ...) and differ between A's and B's manifests: a paired difference is then theirs too,
    not the condition's alone. ``None`` when none differ, or a manifest records no settings."""
    from memprism_ray.policy.config import BACKENDS
    from memprism_ray.trainer.evaluate import played_settings

    recorded = []
    for d in (a, b):
        path = d / "manifest.json"
        try:
            recorded.append(json.loads(path.read_text())["extra"]["config"] if path.is_file() else None)
        except (OSError, ValueError, KeyError, TypeError):
            recorded.append(None)  # a table alone, or a manifest of its own making: nothing to name
    if not all(isinstance(c, dict) for c in recorded):
        return None
    sa, sb = (played_settings(c) for c in recorded)
    keys = sorted((set(sa) | set(sb)) - {"eval.episodes"})  # the episodes: paired by id, counted below
    if sa.get("policy.backend") != sb.get("policy.backend"):  # named once: their own sections differ wholly
        keys = [k for k in keys if not k.startswith(tuple(f"policy.{b}." for b in BACKENDS))]
    changed = [f"{k} {sa.get(k, '<unset>')} -> {sb.get(k, '<unset>')}" for k in keys
               if sa.get(k, "<unset>") != sb.get(k, "<unset>")]  # fmt: skip
    if not changed:
        return None
    more = f" and {len(changed) - shown} more" if len(changed) > shown else ""
    return f"note: A and B were played with other settings ({', '.join(changed[:shown])}{more})"


def _compare(args: argparse.Namespace) -> int:
    for condition, a, b in _pairs(Path(args.dir_a), Path(args.dir_b)):
        note = _other_settings(a, b)
        if note:
            print(f"{condition}: {note}" if condition else note)
        for oa, ob in _outcomes(a, b):
            _print_comparison(oa, ob, condition, a, b, args)
            # The paper reports each split (Mind2Web) or subset (EB-ALFRED): one line each.
            for name, sa, sb in split_pairs(oa, ob):
                _print_comparison(sa, sb, condition, a, b, args, split=name)
    return 0


def _print_comparison(
    oa: Outcomes, ob: Outcomes, condition: str, a: Path, b: Path, args: argparse.Namespace, split: str = ""
) -> None:
    """One measure of A against B: the rates, the paired difference and its bootstrap CI, in
    text and as a JSON line."""
    from memprism_ray.eval.report import paired_comparison

    res = paired_comparison(oa.items, ob.items, n_boot=args.boot, seed=args.seed)
    m = oa.label
    head = "".join(f"{x}: " for x in (condition, split) if x)
    if res["n_common"] == 0 and split:  # the split of one evaluation only, or of other items
        print(f"  {head}{m}: no {oa.noun} in common (A {len(oa.items)}, B {len(ob.items)})")
        return
    if res["n_common"] == 0:
        raise CliError(f"{a} and {b} share no {oa.noun[:-1]} ids: evaluate both on the same split and seed")
    res.update({"measure": oa.measure, "a": str(a), "b": str(b), "rate_a": oa.rate, "rate_b": ob.rate})
    rates = (
        f"{head}{m}(A) = {100 * oa.rate:.2f}% ({len(oa.items)} {oa.noun}), "
        f"{m}(B) = {100 * ob.rate:.2f}% ({len(ob.items)} {ob.noun})"
    )
    diff = (
        f"{m}(B) - {m}(A) on {res['n_common']} common {oa.noun}: {100 * res['diff']:+.2f} points, "
        f"paired bootstrap 95% CI [{100 * res['ci95'][0]:+.2f}, {100 * res['ci95'][1]:+.2f}]"
    )
    print(f"  {rates}; {diff}" if split else f"{rates}\n{diff}")
    where = {"condition": condition} if condition else {}
    print(json.dumps({**where, **({"split": split} if split else {}), **res}), flush=True)
