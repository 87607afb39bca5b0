"""A small deterministic Mind2Web dataset in the official schema (tests and the CPU smoke
configuration; docs/mind2web.md). Not Mind2Web data: short form workflows on a few site
templates, from a seeded generator, written in the release's layout and field names. Earlier
steps leave traces on later pages; one negative per page is absent from ``cleaned_html`` (the
snippet fallback). ``candidate_scores.jsonl`` stands in for the release's candidate ranks; on
every fourth step (:func:`positive_cut`) the positive is ranked outside the top 50.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memprism_ray.benchmark.mind2web.candidates import TOP_K, sample_id, write_scores
from memprism_ray.benchmark.mind2web.data import SPLITS
from memprism_ray.io_atomic import holds_files

#: The fixture's record of what built it, written last (:func:`ensure_fixture` reads it).
FIXTURE_FILE = "fixture.json"
FIXTURE_VERSION = 1

CITIES = ("Columbus", "Denver", "Boston", "Seattle", "Austin", "Chicago", "Portland", "Atlanta", "Phoenix", "Miami")
PRODUCTS = ("Running Shoes", "Desk Lamp", "Coffee Grinder", "Yoga Mat", "Backpack", "Water Bottle")
MOVIES = ("The Long Road", "Blue Harbor", "Night Train", "Paper Moon")


@dataclass(frozen=True)
class _El:
    node: int
    tag: str
    attrs: dict[str, str]
    text: str = ""
    options: tuple[tuple[int, str], ...] = ()


# site templates: (website, domain, subdomain, builder)
def _flights(rng: random.Random) -> tuple[str, list[_El], list[tuple[str, int, str]]]:
    a, b = rng.sample(CITIES, 2)
    cabin = rng.choice(("Economy", "Business", "First"))
    els = [
        _El(101, "a", {"href": "/deals"}, "Deals"),
        _El(102, "a", {"href": "/login"}, "Sign in"),
        _El(110, "input", {"type": "text", "name": "origin", "placeholder": "From"}, ""),
        _El(111, "input", {"type": "text", "name": "destination", "placeholder": "To"}, ""),
        _El(112, "select", {"name": "cabin"}, "", ((113, "Economy"), (114, "Business"), (115, "First"))),
        _El(120, "button", {"type": "submit"}, "Search flights"),
        _El(130, "a", {"href": "/help"}, "Help"),
    ]
    steps = [("TYPE", 110, a), ("TYPE", 111, b), ("SELECT", 112, cabin), ("CLICK", 120, "")]
    return f"Find {cabin.lower()} class flights from {a} to {b}", els, steps


def _restaurant(rng: random.Random) -> tuple[str, list[_El], list[tuple[str, int, str]]]:
    city = rng.choice(CITIES)
    size = rng.choice(("2 guests", "4 guests", "6 guests"))
    els = [
        _El(201, "a", {"href": "/"}, "Home"),
        _El(205, "input", {"type": "search", "name": "location", "placeholder": "Location"}, ""),
        _El(206, "select", {"name": "party"}, "", ((207, "2 guests"), (208, "4 guests"), (209, "6 guests"))),
        _El(210, "button", {"type": "submit"}, "Find a table"),
        _El(220, "a", {"href": "/gift"}, "Gift cards"),
    ]
    return f"Book a table for {size} in {city}", els, [("TYPE", 205, city), ("SELECT", 206, size), ("CLICK", 210, "")]


def _shop(rng: random.Random) -> tuple[str, list[_El], list[tuple[str, int, str]]]:
    product = rng.choice(PRODUCTS)
    els = [
        _El(301, "a", {"href": "/cart"}, "Cart"),
        _El(302, "input", {"type": "text", "name": "q", "placeholder": "Search products"}, ""),
        _El(303, "button", {"aria_label": "Search"}, "Go"),
        _El(310, "a", {"href": "/p/1"}, f"{product} Pro"),
        _El(311, "button", {}, "Add to cart"),
    ]
    steps = [("TYPE", 302, product), ("CLICK", 303, ""), ("CLICK", 310, ""), ("CLICK", 311, "")]
    return f"Add {product} Pro to the cart", els, steps


def _movies(rng: random.Random) -> tuple[str, list[_El], list[tuple[str, int, str]]]:
    city = rng.choice(CITIES)
    movie = rng.choice(MOVIES)
    opts = tuple((410 + i, m) for i, m in enumerate(MOVIES))
    els = [
        _El(401, "a", {"href": "/news"}, "News"),
        _El(402, "input", {"type": "text", "name": "where", "placeholder": "City or zip"}, ""),
        _El(405, "select", {"name": "movie"}, "", opts),
        _El(420, "button", {}, "Show times"),
    ]
    steps = [("TYPE", 402, city), ("SELECT", 405, movie), ("CLICK", 420, "")]
    return f"Find show times for {movie} in {city}", els, steps


SITES: dict[str, tuple[str, str, Any]] = {
    "skyfare": ("Travel", "Airlines", _flights),
    "tablefinder": ("Travel", "Restaurant", _restaurant),
    "shopmart": ("Shopping", "Department", _shop),
    "cinemaxx": ("Entertainment", "Movie", _movies),
}
#: Websites per split: test_website holds a site not in train, test_domain a domain not in train.
SPLIT_SITES: dict[str, tuple[str, ...]] = {
    "train": ("skyfare", "shopmart"),
    "test_task": ("skyfare", "shopmart"),
    "test_website": ("tablefinder",),
    "test_domain": ("cinemaxx",),
}


#: How many candidates each fixture page is ranked among (the release ranks every element).
RANKED_ELEMENTS = 80
SCORES_FILE = "candidate_scores.jsonl"


def positive_cut(task_index: int, step_index: int) -> bool:
    """Whether the fixture ranks a step's positive outside MindAct's top 50 (one step in four)."""
    return (task_index + step_index) % 4 == 1


def _ranks(action: dict[str, Any], cut: bool, seed: int) -> dict[str, int]:
    # Its own generator per step: the pages and tasks stay what they were without scores.
    rng = random.Random(f"{seed}:{action['action_uid']}:ranks")
    pos = rng.randrange(TOP_K, RANKED_ELEMENTS) if cut else rng.randrange(0, 10)
    # The first negative is ranked near the top, so no page is left empty by the cut.
    first = rng.choice([r for r in range(10) if r != pos])
    rest = rng.sample([r for r in range(RANKED_ELEMENTS) if r not in (pos, first)], len(action["neg_candidates"]) - 1)
    negs = [first, *rest]
    ranks = {c["backend_node_id"]: r for c, r in zip(action["neg_candidates"], negs, strict=True)}
    ranks.update({c["backend_node_id"]: pos for c in action["pos_candidates"]})
    return ranks


def _attrs_json(el: _El, rng: random.Random) -> str:
    box = f"{rng.randint(0, 900)},{rng.randint(0, 700)},{rng.randint(40, 300)},{rng.randint(16, 48)}"
    return json.dumps({"backend_node_id": str(el.node), "bounding_box_rect": box, **el.attrs, "text": el.text})


def _html(els: list[_El], typed: dict[int, str], chosen: dict[int, str], hidden: int) -> str:
    parts = ["<html><body><div><nav>"]
    for el in els:
        if el.node == hidden:
            continue
        attrs = dict(el.attrs)
        if el.node in typed:
            attrs["input_value"] = typed[el.node]
        a = "".join(f' {k}="{v}"' for k, v in attrs.items())
        label = attrs.get("placeholder", "")
        if el.tag == "input":
            parts.append(f'<label>{label}</label><input backend_node_id="{el.node}"{a}>')
        elif el.tag == "select":
            opts = "".join(
                f'<option backend_node_id="{n}"{" selected" if chosen.get(el.node) == t else ""}>{t}</option>'
                for n, t in el.options
            )
            parts.append(f'<select backend_node_id="{el.node}"{a}>{opts}</select>')
        else:
            parts.append(f'<{el.tag} backend_node_id="{el.node}"{a}><text>{el.text}</text></{el.tag}>')
    parts.append("</nav></div></body></html>")
    return "".join(parts)


def _task(site: str, split: str, k: int, rng: random.Random) -> dict[str, Any]:
    domain, subdomain, build = SITES[site]
    goal, els, steps = build(rng)
    by_node = {e.node: e for e in els}
    typed: dict[int, str] = {}
    chosen: dict[int, str] = {}
    actions, reprs = [], []
    aid = f"{split}-{site}-{k:02d}"
    for i, (op, node, value) in enumerate(steps):
        # One negative candidate per page is cleaned away (snapshot snippet fallback).
        negs = [e for e in els if e.node != node]
        hidden = negs[(i + k) % len(negs)].node
        target = by_node[node]
        actions.append(
            {
                "action_uid": f"{aid}-a{i}",
                "raw_html": "",
                "cleaned_html": _html(els, typed, chosen, hidden),
                "operation": {"op": op, "original_op": op, "value": value},
                "pos_candidates": [
                    {
                        "tag": target.tag,
                        "is_original_target": True,
                        "is_top_level_target": True,
                        "backend_node_id": str(node),
                        "attributes": _attrs_json(target, rng),
                    }
                ],
                "neg_candidates": [
                    {"tag": e.tag, "backend_node_id": str(e.node), "attributes": _attrs_json(e, rng)} for e in negs
                ],
            }
        )
        name = target.text or target.attrs.get("placeholder") or target.attrs.get("name", "")
        reprs.append(f"[{target.tag}]  {name} -> {op}{': ' + value if value else ''}")
        if op == "TYPE":
            typed[node] = value
        elif op == "SELECT":
            chosen[node] = value
    return {
        "annotation_id": aid,
        "website": site,
        "domain": domain,
        "subdomain": subdomain,
        "confirmed_task": goal,
        "action_reprs": reprs,
        "actions": actions,
    }


def build_fixture(root: str | Path, tasks_per_site: int = 3, seed: int = 0) -> Path:
    """Write the fixture under ``root``, a function of ``tasks_per_site`` and ``seed``; ``root``."""
    if tasks_per_site < 1:
        raise ValueError(f"build_fixture: tasks_per_site must be >= 1, got {tasks_per_site}")
    root = Path(root)
    ranks: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        rng = random.Random(f"{seed}:{split}")
        tasks = [_task(site, split, k, rng) for site in SPLIT_SITES[split] for k in range(tasks_per_site)]
        (root / split).mkdir(parents=True, exist_ok=True)
        tmp = root / split / f".{split}_0.json.tmp"
        tmp.write_text(json.dumps(tasks, indent=1), encoding="utf-8")
        tmp.replace(root / split / f"{split}_0.json")
        for k, task in enumerate(tasks):
            for i, action in enumerate(task["actions"]):
                sid = sample_id(task["annotation_id"], action["action_uid"])
                ranks[sid] = _ranks(action, positive_cut(k, i), seed)
    scores = {sid: {node: round(1.0 - r / RANKED_ELEMENTS, 6) for node, r in per.items()} for sid, per in ranks.items()}
    write_scores(ranks, scores, root / SCORES_FILE)
    made = {"version": FIXTURE_VERSION, "tasks_per_site": tasks_per_site, "seed": seed}
    (root / FIXTURE_FILE).write_text(json.dumps(made) + "\n", encoding="utf-8")  # last: the build is whole
    return root


def ensure_fixture(root: str | Path, tasks_per_site: int = 3, seed: int = 0, *, named: bool = False) -> Path:
    """:func:`build_fixture` unless ``root`` already holds the fixture these settings build (its
    ``fixture.json``); built again over one of other settings or an older version, but for a
    folder the user ``named`` that holds one of other settings, or files but no fixture (a
    release: the fixture's split files bear the release's names): a ``ValueError`` saying so."""
    root = Path(root)
    wanted = {"version": FIXTURE_VERSION, "tasks_per_site": tasks_per_site, "seed": seed}
    try:
        made = json.loads((root / FIXTURE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        made = None
    if made == wanted:
        return root
    if named and not isinstance(made, dict) and holds_files(root):
        raise ValueError(
            f"corpus.data_root {root} holds files but no Mind2Web fixture ({FIXTURE_FILE}): mind2web.fixture true "
            "builds the fixture there and would write over a release's split files; name an empty or absent folder, "
            "or set --mind2web.fixture false to read the release in it"
        )
    if named and isinstance(made, dict) and made.get("version") == FIXTURE_VERSION:
        raise ValueError(
            f"corpus.data_root {root} holds the Mind2Web fixture of {made.get('tasks_per_site')} task(s) per site, "
            f"seed {made.get('seed')}; this run asks {tasks_per_site}, seed {seed} (mind2web.fixture_tasks_per_site, "
            "corpus.seed): match them, point corpus.data_root elsewhere, or remove the folder to build it again"
        )
    return build_fixture(root, tasks_per_site, seed)  # the same files, each written again
