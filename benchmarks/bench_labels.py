"""D1 labelling cost for a policy that reads only the page's text (the scripted stand-in).

The counterfactual teacher (paper section 3.4, ``adapter/d1_labels.py``) shows the frozen policy
every one of the 144 views at each decision state. A VLM is shown the painted page; the
scripted stand-in reads the text twin, so its pages are laid out and not painted. This
compares, interleaved round by round so that machine load affects both alike, the seconds to
label the same states with the page painted (what every policy got before) and laid out only
(``needs_view_image = False``), and checks that the labels are identical.

    .venv/bin/python benchmarks/bench_labels.py [--states 24] [--events 20] [--rounds 3]

The last stdout line is ``RESULT {json}``; the same figures are recorded in
``benchmarks/results/bench_labels.json`` (``_results.write_result``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
from _results import write_result

from memprism_ray.adapter.d1_labels import LabelState, counterfactual_labels
from memprism_ray.benchmark.alfworld.scripted import ScriptedPolicy
from memprism_ray.config_tree import int_at_least
from memprism_ray.router.encoder import HashingEncoder
from memprism_ray.router.features import FeatureExtractor
from memprism_ray.router.teacher import decision_states
from memprism_ray.testing.synthetic_streams import alfworld_like_stream


class PaintedScripted(ScriptedPolicy):
    """The stand-in as if it read pixels: every page is painted (the old path)."""

    needs_view_image = True


def states(n: int, events: int) -> list[LabelState]:
    """``n`` late decision states of seeded ALFWorld-like streams (the last step of each,
    its recorded command as the reference, the stream's commands as the admissible ones)."""
    out: list[LabelState] = []
    seed = 0
    while len(out) < n:
        stream = alfworld_like_stream(events, seed=seed)
        st = decision_states(stream)[-1]
        admissible = tuple(sorted({r.raw.action for r in stream.records}))
        out.append(LabelState(st, admissible))
        seed += 1
    return out


def label(policy: Any, sts: list[LabelState]) -> tuple[float, Any]:
    extractor = FeatureExtractor(HashingEncoder())
    t0 = time.perf_counter()
    dataset, _ = counterfactual_labels(sts, extractor, policy, short_history=0, benchmark="alfworld")
    return time.perf_counter() - t0, dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int_at_least(1), default=24, help="decision states labelled per round")
    ap.add_argument(
        "--events", type=int_at_least(0), default=20, help="events before each state (ALFWorld default: 25 steps)"
    )
    ap.add_argument("--rounds", type=int_at_least(1), default=3, help="interleaved rounds per variant")
    args = ap.parse_args()
    sts = states(args.states, args.events)
    times: dict[str, list[float]] = {"painted": [], "laid_out": []}
    same = True
    for r in range(args.rounds):
        tp, dp = label(PaintedScripted(temperature=0.5, seed=0), sts)
        tl, dl = label(ScriptedPolicy(temperature=0.5, seed=0), sts)
        same = same and len(dp) == len(dl) and all(np.array_equal(a, b) for a, b in zip(dp.q, dl.q, strict=True))
        times["painted"].append(tp)
        times["laid_out"].append(tl)
        print(f"round {r + 1}: painted {tp:.2f} s, laid out {tl:.2f} s ({len(dl)} labels)", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "states": len(sts),
        "views_per_state": 144,
        "painted_s": round(med["painted"], 3),
        "laid_out_s": round(med["laid_out"], 3),
        "laid_out_over_painted": round(med["laid_out"] / med["painted"], 3),
        "labels_identical": same,
    }
    print(f"laid out / painted: {result['laid_out_over_painted']:.2f} (labels identical: {same})")
    print("RESULT " + json.dumps(result))
    write_result("bench_labels", result)


if __name__ == "__main__":
    main()
