"""``memprism eval`` and ``memprism compare`` (paper appendix C evaluation protocol)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memprism_ray.cli import CliError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate one or more conditions on an ALFWorld split (in-process)",
        description=(
            "Play every game of a split (or --episodes N of them) under each condition, on the same ordered "
            "episode list, and write report.json, report.md, plots and a run manifest per condition. "
            "Conditions: no_memory, full_history, recent4, fixed:TAU, fixed_text:TAU, memprism, memprism_text, "
            "freq_random, constrained:FACTOR=VALUE (comma-separated for several). Every episode of the plan is "
            "reported; a broken game or a crashed episode counts as a failure, and the exit code is then 1."
        ),
    )
    p.add_argument("--condition", required=True, help="condition name(s), comma-separated")
    p.add_argument("--split", default="eval_out_of_distribution", help="train, eval_in_distribution, ...")
    p.add_argument("--episodes", type=int, default=0, help="episodes (0 = each game of the split once)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="episode order and policy seed")
    p.add_argument("--data-root", default="", help="ALFWorld data root (default: $ALFWORLD_DATA or built-in corpus)")
    p.add_argument("--checkpoint", default="", help="Router checkpoint for memprism/constrained conditions")
    p.add_argument(
        "--marginal", default="", help="freq_random marginal: eval dir, report.json, JSON list, or auto (this run)"
    )
    p.add_argument("--slots", type=int, default=8, help="episodes played step-synchronously")
    p.add_argument("--max-steps", type=int, default=50, help="environment steps per episode")
    p.add_argument("--short-history", type=int, default=2, help="steps of text history H_short in view conditions")
    p.add_argument("--policy", default="scripted", help="task-policy backend: scripted, vllm, openai, hf")
    p.add_argument("--policy-temperature", type=float, default=None, help="task-policy sampling temperature")
    p.add_argument("--artifacts", type=int, default=3, help="episodes per condition with full artifacts")
    p.add_argument(
        "--memory-base-url", default="", help="OpenAI-compatible endpoint of the memory baselines (mem0, amem, ...)"
    )
    p.add_argument("--memory-model", default="", help="model the memory endpoint serves (default: the config's)")
    p.set_defaults(func=_eval)

    c = sub.add_parser("compare", help="paired bootstrap SR difference between two evaluation directories")
    c.add_argument("dir_a", help="evaluation directory of condition A (holds episodes.parquet)")
    c.add_argument("dir_b", help="evaluation directory of condition B")
    c.add_argument("--boot", type=int, default=10000, help="bootstrap resamples")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    c.set_defaults(func=_compare)


def check_marginal_arg(value: str) -> None:
    """A ``--marginal`` JSON must hold a flat list of numbers (directly, as ``view_marginal`` or
    under ``view_selection``); anything nested would otherwise fail inside numpy with a
    traceback. Missing files and wrong lengths are reported by the loader."""
    if not value or value == "auto":
        return
    path = Path(value)
    path = path / "report.json" if path.is_dir() else path
    if not path.is_file():
        return
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"--marginal {value}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        inner = data.get("view_selection")
        data = data.get("view_marginal", inner.get("view_marginal") if isinstance(inner, dict) else None)
        if data is None:
            return
    if not isinstance(data, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data):
        shown = json.dumps(data)[:60]
        raise CliError(f"--marginal {value}: the view marginal must be a flat JSON list of numbers, got {shown}")


def _eval(args: argparse.Namespace) -> int:
    from memprism_ray.agent import AgentConfig
    from memprism_ray.baselines.external import MemoryBaselineConfig
    from memprism_ray.config_tree import from_dict
    from memprism_ray.eval.report import failure_message
    from memprism_ray.eval.runner import EvalConfig, run_conditions
    from memprism_ray.policy.config import PolicyConfig

    check_marginal_arg(args.marginal)
    conditions = tuple(c.strip() for c in args.condition.split(",") if c.strip())
    policy: dict[str, Any] = {"backend": args.policy}
    if args.policy_temperature is not None:
        if args.policy == "scripted":
            policy["scripted"] = {"temperature": args.policy_temperature, "seed": args.seed}
        else:
            policy[args.policy] = {"temperature": args.policy_temperature}
    elif args.policy == "scripted":
        policy["scripted"] = {"temperature": 0.3, "seed": args.seed}

    same = ("split", "episodes", "seed", "data_root", "checkpoint", "marginal", "slots", "artifacts", "out")
    cfg = EvalConfig(
        conditions=conditions,
        **{k: getattr(args, k) for k in same},
        agent=AgentConfig(max_steps=args.max_steps, short_history=args.short_history),
        policy=from_dict(PolicyConfig, policy),
        memory=from_dict(
            MemoryBaselineConfig,
            {"base_url": args.memory_base_url} | ({"model": args.memory_model} if args.memory_model else {}),
        ),
    )
    problem = cfg.policy.unavailable_here()
    if problem:
        raise CliError(problem)
    summary = run_conditions(cfg)
    print((Path(args.out) / "summary.md").read_text())
    problem = failure_message(summary)
    if problem:
        # Exit 1: the run finished and its reports are written, but not every episode played.
        print(f"memprism: error: {problem}; see {Path(args.out) / 'summary.md'}", file=sys.stderr)
        return 1
    return 0


def _load_outcomes(path: Path) -> dict[str, bool]:
    import pyarrow.parquet as pq

    table_path = path / "episodes.parquet"
    if not table_path.exists():
        raise CliError(f"{path} is not an evaluation directory (no episodes.parquet)")
    rows = pq.read_table(table_path).to_pylist()
    # A failed episode is a failure, as in the reports' success rates.
    return {r["episode_id"]: bool(r["won"]) and r["status"] != "failed" for r in rows}


def _compare(args: argparse.Namespace) -> int:
    from memprism_ray.eval.report import paired_comparison

    a, b = Path(args.dir_a), Path(args.dir_b)
    oa, ob = _load_outcomes(a), _load_outcomes(b)
    res = paired_comparison(oa, ob, n_boot=args.boot, seed=args.seed)
    if res["n_common"] == 0:
        raise CliError("the two runs share no episode ids: evaluate both on the same split and seed")
    sr_a, sr_b = sum(oa.values()) / len(oa), sum(ob.values()) / len(ob)
    res.update({"a": str(a), "b": str(b), "sr_a": sr_a, "sr_b": sr_b})
    print(
        f"SR(A) = {100 * sr_a:.2f}% ({len(oa)} episodes), SR(B) = {100 * sr_b:.2f}% ({len(ob)} episodes)\n"
        f"SR(B) - SR(A) on {res['n_common']} common episodes: {100 * res['diff']:+.2f} points, "
        f"paired bootstrap 95% CI [{100 * res['ci95'][0]:+.2f}, {100 * res['ci95'][1]:+.2f}]"
    )
    print(json.dumps(res))
    return 0
