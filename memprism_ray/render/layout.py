"""Layout of a compiled view: the fixed visual grammar and the row budget (paper "Render:
Optical Working Memory", appendix D.3 "rendering invariants"; ``V_t = R_{tau,gamma}(S_t)``).

Grammar: a header bar (view, goal with its terms in the accent colour, counts); ActionEffect
groups as cards, DependencyChain links under their anchor card, EntityState as a table of value
chains; every event row has the columns step | action | outcome | state changes; arrows show
change; failed rows are red, goal evidence yellow with an accent bar. Fine shows every accepted
delta (unchanged repeats as ``key = value``); medium and coarse only changes (D.1: "individual
view extractors may suppress unchanged values").

Row budget: a page is ``max_side`` wide and as tall as its content (a multiple of 28, at most
``max_side``); entries that do not fit are dropped farthest from the decision first and counted
on a ``... N earlier <unit> omitted`` marker, in the image and its text twin alike. A ``fine``
view first shrinks its rows (``RenderConfig.fine_fit``) until every selected item fits.

No caches: memoising laid-out blocks, text wraps and per-page facts bought 1.01-1.09x of a
whole decision's compose + render at the paper's horizons (``benchmarks/bench_views.py
--horizons-only``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from memprism_ray.composer.select import SelectedEvent
from memprism_ray.composer.structures import (
    ActionEffect,
    DependencyChain,
    EntityRow,
    EntityState,
    LinkKind,
    StateChain,
    StateValue,
    TemporalTrace,
    TraceGap,
    TraceRun,
    View,
)
from memprism_ray.composer.terms import fold
from memprism_ray.recorder.events import Outcome
from memprism_ray.render.config import PATCH, RenderConfig
from memprism_ray.render.font import atlas

# --- the page model ------------------------------------------------------------------
#: A text segment: (text, colour role, bold).
Seg = tuple[str, str, bool]


@dataclass(slots=True)
class Span:
    """Text at a column of its block's content box."""

    col: int
    text: str
    fg: str = "text"
    bold: bool = False


@dataclass(slots=True)
class Row:
    """One text row; ``bg`` overrides the block background, ``bar`` draws an accent bar
    in the left margin."""

    spans: list[Span]
    bg: str | None = None
    bar: str | None = None


@dataclass(slots=True)
class Block:
    """A group of rows drawn as one unit: kinds plain, marker, card, anchor, link,
    table_head, table_row. ``lines`` is the text rendering of the same content."""

    kind: str
    rows: list[Row]
    lines: list[str]
    gap: int = 0
    col_rules: tuple[int, ...] = ()
    bg: str = "background"
    #: Items of the entry its rows leave out (attempts, state changes, chain values), each
    #: counted on a visible ``⋯`` row of the block.
    hidden: int = 0


# kind -> (border, pad_left, pad_right, pad_top, pad_bottom) in pixels; link adds a gutter.
_BOX: dict[str, tuple[int, int, int, int, int]] = {
    "header": (0, 0, 0, 3, 3),
    "plain": (0, 0, 0, 0, 0),
    "marker": (0, 0, 0, 1, 1),
    "card": (1, 5, 5, 2, 2),
    "anchor": (2, 5, 5, 2, 2),
    "link": (0, 0, 0, 1, 1),
    "table_head": (0, 0, 0, 1, 1),
    "table_row": (0, 0, 0, 1, 2),
}
LINK_GUTTER_COLS = 3
#: Height of a block of each kind without its rows (borders and paddings).
_BOX_HEIGHT: dict[str, int] = {kind: 2 * b + top + bottom for kind, (b, _, _, top, bottom) in _BOX.items()}


@dataclass(frozen=True, slots=True)
class Geometry:
    """Pixel geometry derived from a :class:`RenderConfig` and the font cell."""

    width: int
    max_side: int
    font_size: int
    margin: int
    cell_w: int
    cell_h: int
    row_h: int

    @property
    def cols(self) -> int:
        return (self.width - 2 * self.margin) // self.cell_w

    def content_x(self, kind: str) -> int:
        border, left, _, _, _ = _BOX[kind]
        x = self.margin + border + left
        if kind == "link":
            x += LINK_GUTTER_COLS * self.cell_w
        return x

    def content_cols(self, kind: str) -> int:
        border, left, right, _, _ = _BOX[kind]
        width = self.width - 2 * self.margin - 2 * border - left - right
        if kind == "link":
            width -= LINK_GUTTER_COLS * self.cell_w
        return width // self.cell_w

    def height(self, block: Block) -> int:
        border, _, _, top, bottom = _BOX[block.kind]
        return 2 * border + top + bottom + len(block.rows) * self.row_h


def geometry(config: RenderConfig) -> Geometry:
    font, c = atlas(config.font_size), config
    return Geometry(c.max_side, c.max_side, c.font_size, c.margin, font.cell_w, font.cell_h, font.cell_h + c.line_gap)


@dataclass(slots=True)
class Page:
    """A laid-out view: header, blocks top to bottom, the text lines and the budget."""

    view: View
    geometry: Geometry
    header: Block
    blocks: list[Block]
    total: int
    shown: int
    unit: str
    height: int = 0
    header_h: int = 0
    lines: list[str] = field(default_factory=list)
    #: Items inside the kept entries their rows leave out (see :attr:`Block.hidden`), plus
    #: one for an entry clipped because it is taller than the page.
    hidden: int = 0

    @property
    def omitted(self) -> int:
        """Entries left off the page (counted by the page's ``⋯ N ... omitted`` marker)."""
        return self.total - self.shown

    @property
    def complete(self) -> bool:
        """Whether the page shows every entry with every item it holds."""
        return self.omitted == 0 and self.hidden == 0


# --- text helpers --------------------------------------------------------------------
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """One line of text: whitespace runs (newlines, tabs) become single spaces."""
    return _SPACES.sub(" ", text).strip()


def wrap(text: str, width: int) -> tuple[str, ...]:
    """Greedy word wrap to ``width`` columns; words longer than a line are split."""
    if width <= 0:
        return (text,)
    if len(text) <= width:
        return (text,)
    lines: list[str] = []
    line = ""
    for word in text.split(" "):
        while len(word) > width:
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width])
            word = word[width:]
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line = f"{line} {word}"
        else:
            lines.append(line)
            line = word
    if line or not lines:
        lines.append(line)
    return tuple(lines)


_TOKENS = re.compile(r"\S+\s*|\s+")


def flow(items: list[list[Seg]], sep: Seg | None, width: int, cont: Seg | None = None) -> list[list[Seg]]:
    """Lay items (segment lists) into lines of ``width`` columns, joined by ``sep`` within
    a line; a continuation line starts with ``cont`` (e.g. the chain arrow). An item that
    does not fit on its own line is word-wrapped; words longer than a line are split."""
    width = max(1, width)
    if cont is not None and len(cont[0]) + 4 > width:
        cont = None
    lines: list[list[Seg]] = []
    line: list[Seg] = []
    used = 0
    fresh = True

    def break_line() -> None:
        nonlocal line, used, fresh
        lines.append(line)
        line, used, fresh = ([cont], len(cont[0]), True) if cont else ([], 0, True)

    for item in items:
        size = sum(len(t) for t, _, _ in item)
        if not fresh:
            if sep is not None and used + len(sep[0]) + size <= width:
                line.append(sep)
                used += len(sep[0])
            elif sep is not None or used + size > width:
                break_line()
        if used + size <= width:
            line.extend(item)
            used += size
            fresh = False
            continue
        for text, fg, bold in item:
            for tok in _TOKENS.findall(text):
                if not fresh and used + len(tok.rstrip()) > width:
                    break_line()
                    tok = tok.lstrip()
                while tok and len(tok.rstrip()) > width - used:
                    room = width - used
                    line.append((tok[:room], fg, bold))
                    fresh = False
                    break_line()
                    tok = tok[room:]
                if tok:
                    take = tok if used + len(tok) <= width else tok.rstrip()
                    line.append((take, fg, bold))
                    used += len(take)
                    fresh = False
    if line and not (fresh and lines):
        lines.append(line)
    if not lines:
        lines.append([])
    return lines


Cell = tuple[int, list[list[Seg]]]  # (column, lines of segments)


def grid(cells: list[Cell], bg: str | None = None, bar: str | None = None) -> list[Row]:
    """Rows holding cells side by side; the entry is as tall as its tallest cell."""
    height = max((len(lines) for _, lines in cells), default=1) or 1
    rows = []
    for r in range(height):
        spans = []
        for col, lines in cells:
            if r < len(lines):
                c = col
                for text, fg, bold in lines[r]:
                    if text:
                        spans.append(Span(c, text, fg, bold))
                    c += len(text)
        rows.append(Row(spans, bg, bar))
    return rows


# --- shared event formatting -----------------------------------------------------------
OUTCOME_LABEL: dict[Outcome, tuple[str, str]] = {
    Outcome.EXCEPTION: ("exception", "exception"),
    Outcome.STATE_UPDATE: ("update", "update"),
    Outcome.NO_OBSERVED_CHANGE: ("no change", "dim"),
}
OUTCOME_W = 9


def delta_items(item: SelectedEvent, gamma: str) -> list[tuple[str, str, bool]]:
    """``(key, value, changed)`` shown at this granularity (see the module docstring)."""
    ev = item.event
    if gamma == "fine":
        return [(d.key, d.value, d.changed) for d in ev.deltas]
    return [(d.key, d.value, True) for d in ev.deltas if d.changed]


def event_line(item: SelectedEvent, gamma: str, shown: int | None = None) -> str:
    """``step 7 | take mug 1 from countertop 2 | state_update | agent.holding -> mug 1``;
    ``shown`` limits the state changes to the ones the image shows (with a count)."""
    ev = item.event
    line = f"step {ev.t} | {ev.action} | {ev.outcome.value}"
    deltas = delta_items(item, gamma)
    kept = deltas if shown is None else deltas[:shown]
    parts = [f"{k} -> {clean(v)}" if c else f"{k} = {clean(v)}" for k, v, c in kept]
    if len(kept) < len(deltas):
        parts.append(f"(+{len(deltas) - len(kept)} more changes)")
    if parts:
        line += " | " + "; ".join(parts)
    return line + (" [goal]" if item.goal_match else "")


@dataclass(frozen=True, slots=True)
class EventColumns:
    """Column positions of an event row inside a block of ``cols`` columns. When the
    state-change column would be too narrow to read (``stacked``), changes go on the rows
    under the action instead, spanning to the right edge."""

    prefix_w: int
    step_w: int
    action_w: int
    delta_w: int
    stacked: bool = False

    @property
    def step_col(self) -> int:
        return self.prefix_w + (1 if self.prefix_w else 0)

    @property
    def action_col(self) -> int:
        return self.step_col + self.step_w + 1

    @property
    def outcome_col(self) -> int:
        return self.action_col + self.action_w + 1

    @property
    def delta_col(self) -> int:
        return self.action_col if self.stacked else self.outcome_col + OUTCOME_W + 1


MIN_DELTA_W = 24


def event_columns(cols: int, prefix_w: int, step_w: int, longest_action: int) -> EventColumns:
    fixed = prefix_w + (1 if prefix_w else 0) + step_w + 1 + OUTCOME_W + 1 + 1
    rest = max(8, cols - fixed)
    action_w = max(8, min(longest_action, (rest * 11) // 20))
    if rest - action_w >= MIN_DELTA_W:
        return EventColumns(prefix_w, step_w, action_w, rest - action_w)
    ec = EventColumns(prefix_w, step_w, rest, 0, True)
    return EventColumns(prefix_w, step_w, rest, max(8, cols - ec.action_col - 2), True)


def body_cells(ec: EventColumns, action: str, right: list[list[Seg]], fg: str = "text") -> list[Cell]:
    """The action cell and the state-change lines (beside it, or under it when stacked)."""
    action_lines: list[list[Seg]] = [[(line, fg, False)] for line in wrap(action, ec.action_w)]
    if not right:
        return [(ec.action_col, action_lines)]
    if ec.stacked:
        return [(ec.action_col, action_lines + [[("  ", "dim", False), *line] for line in right])]
    return [(ec.action_col, action_lines), (ec.delta_col, right)]


def row_style(item_outcome: Outcome | None, goal_match: bool) -> tuple[str | None, str | None]:
    bg = "exception_bg" if item_outcome is Outcome.EXCEPTION else ("goal_bg" if goal_match else None)
    return bg, ("accent" if goal_match else None)


def event_entry(
    item: SelectedEvent,
    gamma: str,
    ec: EventColumns,
    limit: int,
    prefix: list[list[Seg]] | None = None,
    note: Seg | None = None,
) -> tuple[list[Cell], int]:
    """Cells of one event row and how many of its state changes they show: at most
    ``limit`` rows, the changes that do not fit are counted on a ``... k more changes`` row.
    ``note`` (e.g. a dependency link's shared entities) heads the state-change column."""
    ev = item.event
    label, fg = OUTCOME_LABEL[ev.outcome]
    cells: list[Cell] = []
    if prefix:
        cells.append((0, prefix))
    cells.append((ec.step_col, [[(f"s{ev.t}".rjust(ec.step_w), "dim", False)]]))
    cells.append((ec.outcome_col, [[(label, fg, False)]]))
    deltas = delta_items(item, gamma)
    room = limit - (len(wrap(ev.action, ec.action_w)) if ec.stacked else 0)
    lines: list[list[Seg]] = flow([[note]], None, ec.delta_w) if note else []
    shown = 0
    for k, (key, value, changed) in enumerate(deltas):
        arrow = " → " if changed else " = "
        parts = [[(key, "text", False), (arrow, "arrow" if changed else "dim", False)], [(clean(value), "text", False)]]
        dl = flow(parts, None, ec.delta_w, ("  ", "dim", False))
        if len(lines) + len(dl) + (1 if k < len(deltas) - 1 else 0) > room:
            break
        lines.extend(dl)
        shown += 1
    if shown < len(deltas):
        lines.append([(f"⋯ {len(deltas) - shown} more changes", "dim", False)])
    return cells + body_cells(ec, ev.action, lines), shown


# --- header --------------------------------------------------------------------------
_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]+")


def header_block(view: View, geo: Geometry, counts: list[str]) -> Block:
    """Title (tau, window, filter, gamma), goal (at most 2 rows, goal terms highlighted)
    and counts; rows wrap at narrow widths."""
    a = view.action
    cols = geo.cols
    title: list[list[Seg]] = [[(a.tau, "text", True)]]
    title += [
        [(f"{k}={v}", "text", False)] for k, v in (("window", a.window), ("filter", a.filter), ("gamma", a.gamma))
    ]
    terms = frozenset(view.goal_terms)
    goal: list[list[Seg]] = [[("goal: ", "dim", False)]]
    for tok in _WORD.findall(clean(view.goal)):
        hit = tok[0].isalnum() and not tok.isdigit() and fold(tok.lower()) in terms
        goal.append([(tok, "accent" if hit else "text", hit)])
    goal_lines = flow(goal, None, cols - 1)
    if len(goal_lines) > 2:
        goal_lines = [goal_lines[0], [*goal_lines[1], ("…", "dim", False)]]
    lines = flow(title, ("  ", "text", False), cols) + goal_lines
    lines += flow([[(c, "dim", False)] for c in counts], (" · ", "dim", False), cols)
    text = [
        f"view: {a.tau} | window={a.window} | filter={a.filter} | gamma={a.gamma}",
        f"goal: {clean(view.goal)}",
        " | ".join(counts),
    ]
    return Block("header", grid([(0, lines)]), text, bg="header_bg")


# --- per-view entry builders ---------------------------------------------------------
Builder = Callable[[int], Block]
#: What a view type's layout gives: its entry count, the block builder of entry ``i`` and
#: a fixed block above the entries (the EntityState table head), if any.
Layout = tuple[int, Builder, "Block | None"]


def entry_limit(budget_rows: int) -> int:
    """Rows one entry (an event's changes, a table cell's chain) may take: a third of the
    page, so no single long entry crowds out the rest of the view."""
    return max(4, budget_rows // 3)


def _step_w(view: View) -> int:
    return len(f"s{max(view.n_stream, 1)}")


def _longest_action(items: list[SelectedEvent]) -> int:
    return max((len(it.event.action) for it in items), default=8)


def _temporal(view: View, body: TemporalTrace, geo: Geometry, budget_rows: int) -> Layout:
    entries = body.entries
    limit = entry_limit(budget_rows)
    gamma = view.action.gamma
    recent = entries[-budget_rows:]
    reps = [e if isinstance(e, SelectedEvent) else e.last for e in recent if not isinstance(e, TraceGap)]
    ec = event_columns(geo.cols, 0, max(_step_w(view), 3), _longest_action(reps))

    def build(i: int) -> Block:
        e = entries[i]
        if isinstance(e, SelectedEvent):
            bg, bar = row_style(e.event.outcome, e.goal_match)
            cells, shown = event_entry(e, gamma, ec, limit)
            hidden = len(delta_items(e, gamma)) - shown
            return Block("plain", grid(cells, bg, bar), [event_line(e, gamma, shown)], hidden=hidden)
        if isinstance(e, TraceRun):
            label, fg = OUTCOME_LABEL[e.outcome]
            note = f"×{e.count} since s{e.first.t}: {e.first.event.action}"
            cells = [
                (ec.step_col, [[(f"s{e.last.t}".rjust(ec.step_w), "dim", False)]]),
                (ec.outcome_col, [[(label, fg, False)]]),
                *body_cells(ec, e.last.event.action, [[(line, "dim", False)] for line in wrap(note, ec.delta_w)]),
            ]
            bg, bar = row_style(e.outcome, e.goal_match)
            line = (
                f"steps {e.first.t}-{e.last.t} | {e.count}x {e.outcome.value} | "
                f"first: {e.first.event.action} | last: {e.last.event.action}"
            ) + (" [goal]" if e.goal_match else "")
            return Block("plain", grid(cells, bg, bar), [line])
        assert isinstance(e, TraceGap)
        hist = [(o, c) for o, c in e.histogram if c]
        segs: list[Seg] = [(f"⋯ {e.count} events s{e.first_t}–s{e.last_t} collapsed: ", "dim", False)]
        for k, (o, c) in enumerate(hist):
            segs.append((f"{', ' if k else ''}{c} {OUTCOME_LABEL[o][0]}", OUTCOME_LABEL[o][1], False))
        cells = [(ec.step_col, [[("⋯".rjust(ec.step_w), "dim", False)]]), (ec.action_col, flow([segs], None, geo.cols))]
        text = ", ".join(f"{o.value} {c}" for o, c in hist)
        return Block("plain", grid(cells), [f"steps {e.first_t}-{e.last_t} | {e.count} events collapsed | {text}"])

    return len(entries), build, None


def _effect(view: View, body: ActionEffect, geo: Geometry, budget_rows: int) -> Layout:
    groups = body.groups
    gamma = view.action.gamma
    cols = geo.content_cols("card")
    shown = groups[-budget_rows:]
    longest = max((len(it.event.action) for g in shown for it in g.attempts[-budget_rows:]), default=-1)
    num_w = max((len(f"#{g.count}") for g in shown), default=2)
    ec = event_columns(cols, num_w, max(_step_w(view), 3), 8 if longest < 0 else longest)

    limit = entry_limit(budget_rows)
    card_limit = max(limit, budget_rows // 2)

    def build(i: int) -> Block:
        g = groups[i]
        bar = "accent" if g.goal_match else None
        head: list[Seg] = [(f"{g.act} {g.entity}".strip() or "(no entity)", "text", True)]
        head.append((f"   {g.count} attempt{'s' if g.count != 1 else ''}", "dim", False))
        for o, c in g.histogram:
            head.append((f"  {OUTCOME_LABEL[o][0]} {c}", OUTCOME_LABEL[o][1] if c else "dim", bool(c)))
        head_rows = grid([(0, flow([[s] for s in head], None, cols))], "goal_bg" if g.goal_match else None, bar)
        hist = ", ".join(f"{o.value} {c}" for o, c in g.histogram)
        head_line = f"{g.act} {g.entity} | attempts {g.count} | {hist}" + (" [goal]" if g.goal_match else "")
        # Most recent attempts first until the card is full (same rule as the page).
        body_rows: list[Row] = []
        body_lines: list[str] = []
        shown_attempts = g.shown()
        kept = 0
        hidden = 0
        for num, it in reversed(shown_attempts):
            bg, _ = row_style(it.event.outcome, False)
            prefix = [[(f"#{num}".ljust(num_w), "dim", False)]]
            cells, shown = event_entry(it, gamma, ec, limit, prefix)
            rows = grid(cells, bg, "accent" if it.goal_match else None)
            more = 1 if kept + 1 < len(shown_attempts) else 0
            if kept and len(head_rows) + len(body_rows) + len(rows) + more > card_limit:
                break
            body_rows[:0] = rows
            body_lines.insert(0, f"  #{num} {event_line(it, gamma, shown)}")
            hidden += len(delta_items(it, gamma)) - shown
            kept += 1
        if kept < len(shown_attempts):
            note = f"⋯ {len(shown_attempts) - kept} earlier shown attempts omitted"
            body_rows.insert(0, Row([Span(0, note, "dim")]))
            body_lines.insert(0, "  " + note.replace("⋯", "..."))
        hidden += len(shown_attempts) - kept
        return Block("card", head_rows + body_rows, [head_line, *body_lines], gap=4, bg="card_bg", hidden=hidden)

    return len(groups), build, None


def _chain_items(chain: StateChain, gamma: str, drop: int = 0) -> list[list[Seg]]:
    """Chain items; ``drop`` more values after the first are skipped (added to the
    ``...k`` marker that coarse elision already uses)."""
    values, skipped = _chain_values(chain, drop)
    items: list[list[Seg]] = []
    last = len(values) - 1
    for k, v in enumerate(values):
        fg = "accent" if v.goal_match else ("text" if v.changed or k == 0 else "dim")
        item: list[Seg] = [(clean(v.value), fg, k == last)]
        if gamma == "fine":
            item.append((f" s{v.t} {v.act}" + ("" if v.changed else " ="), "dim", False))
        items.append(item)
        if k == 0 and skipped:
            items.append([(f"⋯{skipped}", "dim", False)])
    return items


def _chain_values(chain: StateChain, drop: int) -> tuple[tuple[StateValue, ...], int]:
    """The values a chain shows when ``drop`` more after the first are left out, and how many
    it skips in all."""
    return (chain.values if not drop else (chain.values[0], *chain.values[1 + drop :])), chain.elided + drop


def _chain_text(chain: StateChain, gamma: str, drop: int = 0) -> str:
    values, skipped = _chain_values(chain, drop)
    texts = [clean(v.value) for v in values]
    if skipped:
        texts.insert(1, f"({skipped} more)")
    text = f"{chain.key}: " + " -> ".join(texts)
    if gamma == "fine":
        sources = ", ".join(f"step {v.t} {v.act}" + ("" if v.changed else " (=)") for v in values)
        text += f" | sources: {sources}"
    return text


_ARROW: Seg = (" → ", "arrow", False)
_CONT: Seg = ("→ ", "arrow", False)


def _value_size(v: StateValue, gamma: str) -> int:
    """Columns one chain item takes (must match :func:`_chain_items`)."""
    size = len(clean(v.value))
    if gamma == "fine":
        size += len(f" s{v.t} {v.act}") + (0 if v.changed else 2)
    return size


def _count_lines(sizes: list[int], width: int) -> int:
    """Rows :func:`flow` needs for items of these sizes with the chain arrow (an estimate
    for items longer than a row, which flow word-wraps)."""
    sep, cont = len(_ARROW[0]), len(_CONT[0])
    lines, used, fresh = 1, 0, True
    for size in sizes:
        if not fresh:
            if used + sep + size <= width:
                used += sep + size
                continue
            lines, used, fresh = lines + 1, cont, True
        if used + size <= width:
            used += size
        else:
            lines += (used + size - 1) // width
            used = (used + size) % width or width
        fresh = False
    return lines


def _fit_chain(
    chain: StateChain, gamma: str, width: int, limit: int, label: Seg | None = None
) -> tuple[list[list[Seg]], int]:
    """Flowed lines of a chain in at most ``limit`` rows and how many values were dropped:
    the initial value and the most recent values that fit are kept. The number to drop is
    found on item sizes (cheap), then checked with the real flow."""
    values = chain.values
    n = len(values)
    label_len = len(label[0]) if label else 0

    def sizes_for(drop: int) -> list[int]:
        sizes = [label_len + _value_size(values[0], gamma)]
        skipped = chain.elided + drop
        if skipped:
            sizes.append(len(f"⋯{skipped}"))
        sizes.extend(_value_size(v, gamma) for v in values[1 + drop :])
        return sizes

    def lines_for(drop: int) -> list[list[Seg]]:
        items = _chain_items(chain, gamma, drop)
        if label is not None:
            items[0] = [label, *items[0]]
        return flow(items, _ARROW, width, _CONT)

    drop = 0
    if n > 2 and _count_lines(sizes_for(0), width) > limit:
        # Values that can possibly fit: a row holds at most `width` columns.
        room, k = limit * width, n - 1
        while k > 1 and room > 0:
            room -= _value_size(values[k], gamma) + len(_ARROW[0])
            k -= 1
        lo, hi = max(1, k), n - 2
        while lo < hi:
            mid = (lo + hi) // 2
            if _count_lines(sizes_for(mid), width) <= limit:
                hi = mid
            else:
                lo = mid + 1
        drop = lo
    lines = lines_for(drop)
    while len(lines) > limit and n - drop > 2:
        drop += 1
        lines = lines_for(drop)
    return lines, drop


def _chain_stats(c: StateChain, gamma: str) -> tuple[int, int]:
    """(longest shown value, columns its shown values want)."""
    # The first value and the most recent ones are what a cell can show.
    tail = c.values if len(c.values) <= 33 else (c.values[0], *c.values[-32:])
    sizes = [_value_size(v, gamma) for v in tail]
    return max(sizes, default=0), sum(sizes) + 3 * max(0, len(sizes) - 1)


def _table_columns(rows: tuple[EntityRow, ...], cols: int, gamma: str) -> tuple[int, list[tuple[str, int, int]], int]:
    """Entity column width, kept attribute columns ``(attribute, col, width)`` and the column of the
    catch-all ``other`` column (``-1``: none). Spare width goes in proportion to chain text, so long
    chains (locations) get the room and short states stay narrow."""
    count: dict[str, int] = {}
    longest: dict[str, int] = {}
    demand: dict[str, int] = {}
    for r in rows:
        for c in r.chains:
            a = c.attribute
            count[a] = count.get(a, 0) + 1
            c_longest, c_demand = _chain_stats(c, gamma)
            longest[a] = max(longest.get(a, 0), c_longest)
            demand[a] = demand.get(a, 0) + c_demand
    attrs = sorted(count, key=lambda a: (-count[a], a))
    ew = max(6, min(18, max((len(r.entity) for r in rows), default=6)))
    cap = 26 if gamma == "fine" else 20
    minw = {a: max(len(a), 8, min(cap, longest[a] + 2)) for a in attrs}
    avail = cols - ew
    kept: list[str] = list(attrs)
    if sum(minw[a] + 3 for a in attrs) > avail:
        kept = []
        for a in attrs:
            if sum(minw[x] + 3 for x in kept) + minw[a] + 3 + 3 + 16 > avail:
                break
            kept.append(a)
    other = len(kept) < len(attrs)
    demand_other = sum(demand[a] for a in attrs[len(kept) :])
    room = avail - 3 * len(kept) - (3 if other else 0)
    widths = {a: minw[a] for a in kept}
    spare = room - sum(widths.values()) - (16 if other else 0)
    if spare > 0:
        wants = {a: max(0, demand[a] - widths[a]) for a in kept}
        if other:
            wants["\0other"] = max(0, demand_other - 16)
        total_want = sum(wants.values())
        if total_want:
            for a, want in wants.items():
                if a != "\0other":
                    widths[a] += min(want, spare * want // total_want)
    out = []
    col = ew
    for a in kept:
        out.append((a, col + 3, widths[a]))
        col += 3 + widths[a]
    other_col = col + 3 if other else -1
    return ew, out, other_col


def _state(view: View, body: EntityState, geo: Geometry, budget_rows: int) -> Layout:
    rows = body.rows
    gamma = view.action.gamma
    cols = geo.content_cols("table_row")
    if not rows:
        return 0, lambda i: Block("plain", [], []), None
    # Only the most recent rows can be on the page (each takes at least one text row).
    ew, attr_cols, other_col = _table_columns(rows[-budget_rows:], cols, gamma)
    where = {a: (c, w) for a, c, w in attr_cols}
    other_w = cols - other_col if other_col >= 0 else 0
    rules = tuple(c - 2 for _, c, _ in attr_cols) + ((other_col - 2,) if other_col >= 0 else ())
    head_cells: list[Cell] = [(0, [[("entity", "text", True)]])]
    head_cells += [(c, [[(a[:w], "text", True)]]) for a, c, w in attr_cols]
    if other_col >= 0:
        head_cells.append((other_col, [[("other", "text", True)]]))
    head = Block("table_head", grid(head_cells), [], col_rules=rules, bg="header_bg")

    limit = entry_limit(budget_rows)

    def build(i: int) -> Block:
        r = rows[i]
        fg = "accent" if r.goal_match else "text"
        cells: list[Cell] = [(0, [[(line, fg, True)] for line in wrap(r.entity, ew)])]
        extra: list[list[Seg]] = []
        texts = []
        hidden = 0
        n_other = sum(1 for c in r.chains if c.attribute not in where)
        other_limit = max(2, limit // max(1, n_other))  # the other cell shares the entry's rows
        for c in r.chains:
            if c.attribute in where:
                col, w = where[c.attribute]
                lines, drop = _fit_chain(c, gamma, w, limit)
                cells.append((col, lines))
            else:
                lines, drop = _fit_chain(c, gamma, other_w, other_limit, (f"{c.attribute}: ", "dim", True))
                extra.extend(lines)
            texts.append(_chain_text(c, gamma, drop))
            hidden += drop
        if extra:
            cells.append((other_col, extra))
        bg = "goal_bg" if r.goal_match else None
        line = f"{r.entity} | " + " | ".join(texts) + (" [goal]" if r.goal_match else "")
        table_rows = grid(cells, bg, "accent" if r.goal_match else None)
        return Block("table_row", table_rows, [line], col_rules=rules, hidden=hidden)

    return len(rows), build, head


LINK_LABEL = {kind.value: "ANCHOR" if kind is LinkKind.ANCHOR else kind.value.replace("_", " ") for kind in LinkKind}


def _dependency(view: View, body: DependencyChain, geo: Geometry, budget_rows: int) -> Layout:
    links = body.links
    gamma = view.action.gamma
    cols = geo.content_cols("link")
    label_w = max(len(v) for v in LINK_LABEL.values())
    ec = event_columns(cols, label_w, max(_step_w(view), 3), _longest_action([lk.item for lk in links]))
    anchor_ec = event_columns(geo.content_cols("anchor"), label_w, ec.step_w, ec.action_w)

    limit = entry_limit(budget_rows)

    def build(i: int) -> Block:
        lk = links[i]
        it = lk.item
        label = LINK_LABEL[lk.kind.value]
        bg, bar = row_style(it.event.outcome, it.goal_match)
        if i == 0:
            prefix = [[(label.ljust(label_w), "arrow", True)]]
            cells, shown = event_entry(it, gamma, anchor_ec, limit, prefix)
            kind, gap, block_bg = "anchor", 0, "card_bg"
        else:
            prefix = [[(label.ljust(label_w), "link", False)]]
            note: Seg | None = (f"via {', '.join(lk.via)}", "link", False) if lk.via else None
            cells, shown = event_entry(it, gamma, ec, limit, prefix, note)
            kind, gap, block_bg = "link", 2, "background"
        line = f"{lk.kind.value} | {event_line(it, gamma, shown)}" + (f" | via {', '.join(lk.via)}" if lk.via else "")
        hidden = len(delta_items(it, gamma)) - shown
        return Block(kind, grid(cells, bg, bar), [line], gap=gap, bg=block_bg, hidden=hidden)

    return len(links), build, None


# --- fitting ---------------------------------------------------------------------------
def _marker(text: str) -> Block:
    return Block("marker", [Row([Span(0, text, "dim")])], [text.replace("⋯", "...")])


def layout(view: View, config: RenderConfig | None = None) -> Page:
    """Lay ``view`` out under ``config``'s row budget (module docstring). A ``fine`` view ("fine:
    preserve all selected events/items", appendix E.2) takes the largest font size that shows
    everything, else the smallest, which shows the most."""
    config = config or RenderConfig()
    page = _layout_at(view, config)
    if page.complete or view.action.gamma != "fine" or config.fine_fit != "shrink":
        return page
    smallest = _layout_at(view, dataclasses.replace(config, font_size=config.min_font_size))
    if not smallest.complete:  # nothing fits everything: the smallest rows show the most
        return smallest
    for size in range(config.font_size - 1, config.min_font_size, -1):
        page = _layout_at(view, dataclasses.replace(config, font_size=size))
        if page.complete:
            return page
    return smallest


def _layout_at(view: View, config: RenderConfig) -> Page:
    geo = geometry(config)
    body = view.body
    counts = [f"events {view.n_stream}", f"in scope {view.n_scope}", f"selected {view.n_selected}"]
    if isinstance(body, TemporalTrace):
        counts.append(f"entries {len(body.entries)}")
        lay, unit = _temporal, "entries"
    elif isinstance(body, ActionEffect):
        counts.append(f"groups {len(body.groups)}")
        lay, unit = _effect, "groups"
    elif isinstance(body, EntityState):
        counts.append(f"entities {len(body.rows)}")
        lay, unit = _state, "entities"
    elif isinstance(body, DependencyChain):
        counts += [f"chain {len(body.links)}/{body.cap}", f"candidates {body.candidates}"]
        lay, unit = _dependency, "links"
    else:  # pragma: no cover - View.body is one of the four
        raise ValueError(f"cannot lay out a view body of type {type(body).__name__}")
    header = header_block(view, geo, counts)
    header_h = geo.height(header) + 2
    top = header_h + 4
    budget = geo.max_side - top - geo.margin
    budget_rows = max(1, budget // geo.row_h)
    total, build, head = lay(view, body, geo, budget_rows)  # type: ignore[arg-type]
    fixed = [head] if head is not None else []
    recent_first = unit != "links"  # DependencyChain keeps its highest-priority links

    used = sum(b.gap + geo.height(b) for b in fixed)
    kept: list[Block] = []
    order = range(total - 1, -1, -1) if recent_first else range(total)
    row_h = geo.row_h
    for i in order:
        b = build(i)
        h = b.gap + _BOX_HEIGHT[b.kind] + len(b.rows) * row_h  # == b.gap + geo.height(b)
        if used + h > budget:
            break
        kept.append(b)
        used += h
    if total and not kept:  # one entry taller than the page: clip its rows (image only)
        b = build(total - 1 if recent_first else 0)
        b = Block(b.kind, [Row(list(r.spans), r.bg, r.bar) for r in b.rows], list(b.lines), b.gap, b.col_rules, b.bg)
        room = max(1, (budget - used - b.gap - geo.height(Block(b.kind, [], []))) // geo.row_h - 1)
        b.rows = b.rows[:room]
        if b.rows and b.rows[-1].spans:
            b.rows[-1].spans.append(Span(geo.content_cols(b.kind) - 1, "…", "dim"))
        b.hidden += 1
        kept.append(b)
        used += b.gap + geo.height(b)
    marker: Block | None = None
    if len(kept) < total:
        word = "earlier" if recent_first else "lower-priority"
        marker = _marker(f"⋯ {total - len(kept)} {word} {unit} omitted")
        while len(kept) > 1 and used + geo.height(marker) > budget:
            dropped = kept.pop()
            used -= dropped.gap + geo.height(dropped)
            marker = _marker(f"⋯ {total - len(kept)} {word} {unit} omitted")
        used += geo.height(marker)
    if recent_first:
        kept.reverse()
    shown = len(kept)
    blocks = fixed + kept
    if marker is not None:
        blocks = [*fixed, marker, *kept] if recent_first else [*fixed, *kept, marker]
    if total == 0:
        blocks = [_marker("(no events in this view)")]
        used = geo.height(blocks[0])
    height = min(geo.max_side, -(-(top + used + geo.margin) // PATCH) * PATCH)
    page = Page(view, geo, header, blocks, total, shown, unit, height, header_h)
    page.lines = [*header.lines, *(line for b in blocks for line in b.lines)]
    page.hidden = sum(b.hidden for b in kept)
    return page
