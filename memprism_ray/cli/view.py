"""``memprism view``: compose one view of a recorded event stream and render it (paper
"Composer", "Render"), with its size, visual tokens and compose/render milliseconds.

    memprism view EVENTS.jsonl --tau EntityState --window all --filter state_update \\
        --gamma medium --out view.png
    memprism view EVENTS.parquet --tau DependencyChain --text            # text to stdout
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from memprism_ray.cli import CliError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "view",
        help="compose and render one view of an event stream (PNG or text)",
        description="Compose one MemPrism view (tau, window, filter, gamma) of an event stream and render it.",
    )
    p.add_argument("events", help="event stream file: .jsonl or .parquet (EventStream.save)")
    p.add_argument(
        "--tau", default="TemporalTrace", help="TemporalTrace (default) | ActionEffect | EntityState | DependencyChain"
    )
    p.add_argument("--window", default="recent_short", help="recent_short (6 events, default) | recent_long (10) | all")
    p.add_argument("--filter", default="all", help="all (default) | exception | state_update | no_observed_change")
    p.add_argument("--gamma", default="fine", help="coarse | medium | fine (default)")
    p.add_argument("--goal", default=None, help="task goal (default: the stream's meta 'goal')")
    p.add_argument("--max-side", default="672", help="long-side cap in pixels, a multiple of 28 (default 672)")
    p.add_argument(
        "--goal-restore",
        default="history",
        help="where goal-matching events are restored from: history (default, the paper's Merge) | window | off",
    )
    p.add_argument("--out", default=None, help="output file (.png, or the text with --text; default stdout for --text)")
    p.add_argument("--text", action="store_true", help="write the text rendering instead of the PNG")
    p.set_defaults(func=_run)


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CliError(f"{name} must be an integer, got {value!r}") from None


def _run(args: argparse.Namespace) -> int:
    from memprism_ray.composer import ComposerConfig, compose
    from memprism_ray.recorder import EventStream
    from memprism_ray.render import RenderConfig, layout
    from memprism_ray.render.font import atlas
    from memprism_ray.render.optical import encode_png, paint_image
    from memprism_ray.render.visual_tokens import minicpmv26_tokens, qwen3vl_tokens, qwen25vl_tokens
    from memprism_ray.view_space import ViewAction

    action = ViewAction(args.tau, args.window, args.filter, args.gamma)
    config = RenderConfig(max_side=_int("--max-side", args.max_side))
    composer = ComposerConfig(goal_restore=args.goal_restore)
    if args.out is None and not args.text:
        raise CliError("--out is required when writing a PNG (or pass --text to print the text view)")
    out = Path(args.out) if args.out else None
    if out is not None and not out.parent.exists():
        raise CliError(f"output folder {out.parent} does not exist")
    if out is not None and (out.suffix.lower() == ".png") == args.text:  # v.jpg held PNG bytes, --text v.png text
        kind = "the text view" if args.text else "a PNG"
        raise CliError(f"--out {out}: the file would hold {kind}; name it {'.txt' if args.text else '.png'}")
    stream = EventStream.load(args.events)
    goal = args.goal if args.goal is not None else str(stream.meta.get("goal", ""))
    atlas(config.font_size)  # load the font outside the timed region (once per process)
    atlas(config.font_size, True)

    t0 = time.perf_counter()
    view = compose(stream, action, goal, composer)
    t1 = time.perf_counter()
    page = layout(view, config)
    if args.text:
        payload = ("\n".join(page.lines) + "\n").encode()
        t2 = time.perf_counter()
        width, height = page.geometry.width, page.height
    else:
        image = paint_image(page, config)
        t2 = time.perf_counter()
        payload = encode_png(image, config)
        width, height = image.size
    t3 = time.perf_counter()
    try:
        if out is None:
            print(payload.decode(), end="")
        else:
            out.write_bytes(payload)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None

    what = "text view" if args.text else "image"
    where = f"wrote {out}" if out is not None else "printed"
    omitted = f" ({page.omitted} omitted)" if page.omitted else ""
    png = "" if args.text else f", png encode {1e3 * (t3 - t2):.2f} ms"
    for line in (
        f"{where}: {action.name}, {len(stream)} events, {page.shown}/{page.total} {page.unit} shown{omitted}",
        f"{what}: {width}x{height} px = {width * height} pixels; visual tokens: "
        f"qwen2.5-vl {qwen25vl_tokens(width, height)} (incl. 2 markers), qwen3-vl {qwen3vl_tokens(width, height)}, "
        f"minicpm-v-2.6 {minicpmv26_tokens(width, height)}",
        f"time: compose {1e3 * (t1 - t0):.2f} ms, render {1e3 * (t2 - t1):.2f} ms{png}",
    ):
        print(line, file=sys.stderr if out is None else None)  # stdout holds the text view itself
    return 0
