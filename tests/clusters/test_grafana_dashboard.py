"""clusters/grafana/memprism_dashboard.json, the Grafana dashboard of the job's metrics.

Its queries may name only what the job exports (``memprism_ray/actors/metrics.py``'s tables,
under the names Ray gives them, :func:`exported_names`), every query is filtered by the
``run`` variable and Ray's ``SessionName`` / ``Cluster`` filters (``Instance`` on the rollout
workers' metrics), and every metric of the tables has a panel. The last test checks the name
rule against a live Ray metrics endpoint, in a subprocess with its own ``ray.init``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memprism_ray.actors import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "clusters" / "grafana" / "memprism_dashboard.json"

# Ray's own metrics the dashboard queries (beside the job's ray_memprism_*): none; its
# variables are read from the job's metrics too.
RAY_METRICS: frozenset[str] = frozenset()
# Grafana's built-in variables the queries may use.
GRAFANA_BUILTINS = frozenset({"__rate_interval", "__range", "__interval"})
VARIABLES = ("datasource", "Cluster", "SessionName", "run", "Instance")
# Every selector of every panel query carries these matchers; those of the rollout workers'
# metrics also instance=~"$Instance", those of the driver's never (a rollout node picked in
# "Instance" must not blank the per-iteration panels).
COMMON_MATCHERS = {"run": ("=~", "$run"), "SessionName": ("=~", "$SessionName"), "ray_io_cluster": ("=~", "$Cluster")}
INSTANCE_MATCHER = ("=~", "$Instance")
QUANTILES = {"0.5", "0.95"}


def exported_names() -> dict[str, set[str]]:
    """Each table entry of metrics.py -> the Prometheus names Ray exports for it.

    The rule, measured on Ray 2.60's metrics endpoint (and re-checked by
    :func:`test_exported_names_match_a_live_scrape`): ``ray_`` + the metric's name
    (``memprism_<entry>``); a Gauge as is; a Counter with ``_total`` (no bare name); a
    Histogram as ``_bucket`` (label ``le``), ``_sum`` and ``_count``.
    """
    out: dict[str, set[str]] = {}
    for name in metrics._GAUGES:
        out[name] = {f"ray_memprism_{name}"}
    for name in metrics._COUNTERS:
        out[name] = {f"ray_memprism_{name}_total"}
    for name in metrics._HISTOGRAMS:
        base = f"ray_memprism_{name}"
        out[name] = {f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return out


def all_exported() -> set[str]:
    return set().union(*exported_names().values())


# --- a small PromQL reader: the selectors (metric name + label matchers) of an expression ---

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>"(?:[^"\\]|\\.)*")
      | (?P<braces>\{[^}]*\})
      | (?P<range>\[[^\]]*\])
      | (?P<ident>[A-Za-z_:][\w:]*)
      | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<op>[()]|[-+*/%^,<>=!]+)
    )""",
    re.X,
)
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}
)
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})

Selector = tuple[str, dict[str, tuple[str, str]]]


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        assert m is not None and m.end() > pos, f"cannot read {expr[pos:]!r} in {expr!r}"
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _matchers(braces: str) -> dict[str, tuple[str, str]]:
    body = braces[1:-1].strip()
    out: dict[str, tuple[str, str]] = {}
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        assert m is not None, f"cannot read the label matchers {braces!r}"
        assert m.group(1) not in out, f"label {m.group(1)} matched twice in {braces!r}"
        out[m.group(1)] = (m.group(2), m.group(3))
        pos = m.end()
    return out


def selectors(expr: str) -> list[Selector]:
    """The series selectors of a PromQL expression: (metric name or "", label matchers)."""
    toks = _tokens(expr)
    out: list[Selector] = []
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < len(toks) else ("", "")
        if kind == "ident" and text in _GROUPING:
            if nxt == ("op", "("):  # a label list, not metrics
                while toks[i] != ("op", ")"):
                    i += 1
        elif kind == "ident" and (text in _AGGREGATIONS or text in _KEYWORDS or nxt == ("op", "(")):
            pass  # an aggregation, keyword or function call
        elif kind == "ident":
            out.append((text, _matchers(nxt[1]) if nxt[0] == "braces" else {}))
            if nxt[0] == "braces":
                i += 1
        elif kind == "braces":
            out.append(("", _matchers(text)))  # a selector without a metric name
        i += 1
    return out


def variable_selector(query: str) -> Selector:
    """The selector of a ``label_values(<selector>, <label>)`` variable query."""
    m = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
    assert m, f"variable query is not label_values(<selector>, <label>): {query!r}"
    (sel,) = selectors(m.group(1))
    return sel


# --- the dashboard ---


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # those of a collapsed row


def query_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dash) if p["type"] != "row"]


def exprs(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every target."""
    for p in query_panels(dash):
        for t in p["targets"]:
            yield p["title"], t["expr"]


def variable_queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            assert q == v["definition"], v["name"]
            yield v["name"], q


def recorded_by() -> dict[str, dict[str, set[str]]]:
    """What record_iteration (driver) and record_steps (rollout workers) record, with a fake
    metric object: side -> table entry -> tag keys; plus the view factors ("factor" tag values)."""
    seen: dict[str, dict[str, set[str]]] = {"driver": {}, "rollout": {}, "factors": {}}
    side = "driver"

    class Fake:
        def __init__(self, name: str) -> None:
            self.name = name

        def _note(self, tags: dict[str, str]) -> None:
            seen[side].setdefault(self.name, set()).update(tags)
            if "factor" in tags:
                seen["factors"].setdefault(tags["factor"], set()).add(tags["value"])

        def set(self, value: float, tags: dict[str, str]) -> None:
            self._note(tags)

        def inc(self, value: float, tags: dict[str, str]) -> None:
            self._note(tags)

        def observe(self, value: float, tags: dict[str, str]) -> None:
            self._note(tags)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "_metric", Fake)
        metrics.record_iteration("r", FULL_ITERATION)
        side = "rollout"
        metrics.record_steps("r", [STEP_ROW])
    return seen


# One iteration's statistics that set every gauge and increment every counter of
# record_iteration, and one decision row that records everything of record_steps.
FULL_ITERATION: dict[str, float] = {
    "iteration": 1,
    "success_rate": 0.5,
    "mean_return": 0.25,
    "mean_episode_length": 7,
    "loss": 0.1,
    "kl": 0.01,
    "entropy": 1.2,
    "clip_frac": 0.05,
    "zero_std_group_frac": 0.25,
    "iteration_seconds": 12.0,
    "weights_version": 1,
    "fleet_size": 2,
    "rollout_phase_seconds": 9.0,
    "update_phase_seconds": 3.0,
    "trajectories": 6,
    "failed_trajectories": 1,
    "groups_rerun": 1,
    "workers_replaced": 1,
    "workers_lost": 1,
    "learner_restarts": 1,
    "iterations_replayed": 1,
}
STEP_ROW: dict[str, Any] = {
    "view_index": 0,
    "view_cached": False,
    "view": "0.5/4/obj/0.9",
    "compose_ms": 1.0,
    "render_ms": 2.0,
    "policy_ms": 30.0,
    "env_ms": 4.0,
    "prompt_tokens": 700,
    "visual_tokens": 300,
}


def query_problems(dash: dict[str, Any]) -> list[str]:
    """Everything wrong with the dashboard's queries (names, filters, quantiles)."""
    problems: list[str] = []
    allowed = all_exported() | RAY_METRICS
    entry_of = {n: e for e, names in exported_names().items() for n in names}
    sides = recorded_by()
    defined = {v["name"] for v in dash["templating"]["list"]}
    for title, expr in [*exprs(dash), *(("variable " + n, q) for n, q in variable_queries(dash))]:
        for var in re.findall(r"\$\{?(\w+)", expr):
            if var not in defined and var not in GRAFANA_BUILTINS:
                problems.append(f"{title}: undefined variable ${var}")
        sels = [variable_selector(expr)] if title.startswith("variable ") else selectors(expr)
        if not sels:
            problems.append(f"{title}: no metric in {expr!r}")
        for name, matchers in sels:
            if name not in allowed:
                problems.append(f"{title}: {name or '(no metric name)'} is not a metric the job exports")
                continue
            if title.startswith("variable "):
                continue
            for label, want in COMMON_MATCHERS.items():
                if matchers.get(label) != want:
                    problems.append(f'{title}: {name} lacks {label}{want[0]}"{want[1]}"')
            entry = entry_of.get(name)
            if entry in sides["rollout"] and matchers.get("instance") != INSTANCE_MATCHER:
                problems.append(f"{title}: {name} (rollout workers) lacks the Instance filter")
            if entry in sides["driver"] and "instance" in matchers:
                problems.append(f"{title}: {name} (driver) is filtered by instance")
            if name.endswith("_bucket"):
                m = re.fullmatch(r"histogram_quantile\((0\.\d+), sum by \(([^)]*)\) \(rate\(.*\)\)\)", expr)
                if not m or "le" not in [x.strip() for x in m.group(2).split(",")]:
                    problems.append(f"{title}: {name} outside histogram_quantile(q, sum by (..., le) (rate(...)))")
    return problems


# --- tests ---


def test_dashboard_loads_with_unique_panels_and_targets() -> None:
    dash = load()
    assert dash["uid"] and dash["title"]
    panels = list(all_panels(dash))
    ids = [p["id"] for p in panels]
    titles = [p["title"] for p in panels]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert len(titles) == len(set(titles)), sorted(t for t in titles if titles.count(t) > 1)
    assert {p["type"] for p in panels} <= {"row", "timeseries", "stat"}
    for p in query_panels(dash):
        assert p["datasource"] == "${datasource}", p["title"]
        assert p["targets"], f"{p['title']}: no target"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]
    # Grafana's 24-column grid, no two panels on the same cell.
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_variables_follow_rays_dashboards() -> None:
    dash = load()
    by_name = {v["name"]: v for v in dash["templating"]["list"]}
    assert tuple(by_name) == VARIABLES
    assert by_name["datasource"]["type"] == "datasource" and by_name["datasource"]["query"] == "prometheus"
    for name in VARIABLES[1:]:
        v = by_name[name]
        assert v["type"] == "query" and v["datasource"] == "${datasource}" and v["includeAll"], name
    # "All" must match the Cluster label's absence (no KubeRay PodMonitor) and any run / node.
    assert by_name["Cluster"]["allValue"] == ".*"
    assert by_name["run"]["allValue"] == ".+" and by_name["run"]["multi"]
    assert by_name["Instance"]["allValue"] == ".+" and by_name["Instance"]["multi"]
    queries = dict(variable_queries(dash))
    assert queries["run"].endswith(", run)") and queries["Instance"].endswith(", instance)")
    assert queries["SessionName"].endswith(", SessionName)") and queries["Cluster"].endswith(", ray_io_cluster)")


def test_every_query_names_only_exported_metrics_and_carries_the_filters() -> None:
    assert query_problems(load()) == []


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("ray_memprism_decisions_total{", "ray_memprism_decisions{", "ray_memprism_decisions is not"),
        ("ray_memprism_iteration{", "ray_memprism_iteration_total{", "ray_memprism_iteration_total is not"),
        ("ray_memprism_render_ms_bucket{", "ray_memprism_render_ms{", "ray_memprism_render_ms is not"),
        ("ray_memprism_grpo_kl{", "memprism_grpo_kl{", "memprism_grpo_kl is not"),
        ("ray_memprism_grpo_kl{", "ray_node_cpu_utilization{", "ray_node_cpu_utilization is not"),
        ('run=~"$run",', "", 'lacks run=~"$run"'),
        ('SessionName=~"$SessionName",', "", "lacks SessionName"),
        ('instance=~"$Instance",', "", "lacks the Instance filter"),
        (
            '(ray_memprism_fleet_size{run=~"$run",',
            '(ray_memprism_fleet_size{instance=~"$Instance",run=~"$run",',
            "(driver) is filtered",
        ),
        ("sum by (run, le)", "sum by (run)", "outside histogram_quantile"),
        ("$run", "$runs", "undefined variable $runs"),
    ],
)
def test_a_wrong_query_is_caught(old: str, new: str, problem: str) -> None:
    dash = load()
    broken = copy.deepcopy(dash)
    for p in query_panels(broken):
        for t in p["targets"]:
            t["expr"] = t["expr"].replace(old, new, 1)
    assert broken != dash, f"{old!r} is not in the dashboard"
    assert any(problem in x for x in query_problems(broken)), query_problems(broken)[:5]


def test_selectors_read_promql() -> None:
    sel = selectors(
        'sum by (run, value) (rate(m_total{factor="tau",run=~"$run"}[5m])) / on (run) group_left '
        "sum by (run) (rate(m_total[5m])) + 60 * max(g)"
    )
    assert sel == [("m_total", {"factor": ("=", "tau"), "run": ("=~", "$run")}), ("m_total", {}), ("g", {})]
    assert selectors("sum by (run)(rate(x_total[5m]))") == [("x_total", {})]
    assert selectors('{__name__=~"ray_memprism_.*"}') == [("", {"__name__": ("=~", "ray_memprism_.*")})]
    assert variable_selector('label_values(m_total{a=~"$a"}, run)') == ("m_total", {"a": ("=~", "$a")})


def test_every_metric_of_metrics_py_has_a_panel() -> None:
    dash = load()
    used = {name for _, e in exprs(dash) for name, _ in selectors(e)}
    missing = sorted(entry for entry, names in exported_names().items() if not names & used)
    assert missing == [], f"metrics.py entries without a panel: {missing}"
    for entry in metrics._HISTOGRAMS:  # p50 and p95 of each histogram
        quantiles = {
            m.group(1)
            for _, e in exprs(dash)
            if (m := re.match(r"histogram_quantile\((0\.\d+), .*ray_memprism_" + entry + r"_bucket\{", e))
        }
        assert quantiles == QUANTILES, entry


def test_recording_sides_and_view_factors() -> None:
    sides = recorded_by()
    tables = set(metrics._GAUGES) | set(metrics._COUNTERS) | set(metrics._HISTOGRAMS)
    assert set(sides["driver"]) | set(sides["rollout"]) == tables
    assert not set(sides["driver"]) & set(sides["rollout"])
    for side in ("driver", "rollout"):
        assert all("run" in keys for keys in sides[side].values()), side
    # One "View selections: <factor>" panel per factor record_steps tags.
    dash = load()
    panel_factors = {
        m.group(1)
        for _, e in exprs(dash)
        for m in [re.search(r'ray_memprism_view_selections_total\{factor="(\w+)"', e)]
        if m
    }
    assert panel_factors == set(sides["factors"])
    titles = {p["title"] for p in query_panels(dash)}
    assert {f"View selections: {f}" for f in sides["factors"]} <= titles


_SCRAPE = r"""
import json, re, shutil, socket, sys, tempfile, time, urllib.request

import ray

from memprism_ray.actors import metrics
from memprism_ray.cluster.placement import init_ray

expected = set(json.loads(sys.argv[1]))
iteration, row = json.loads(sys.argv[2])
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
tmp = tempfile.mkdtemp(prefix="mpr-")  # Ray's socket paths must stay under 107 bytes
init_ray(address="local", num_cpus=1, log_to_driver=False, _temp_dir=tmp, _metrics_export_port=port,
         _system_config={"metrics_report_interval_ms": 500})
try:
    metrics.record_iteration("probe", iteration)
    metrics.record_steps("probe", [row])
    labels = {}
    deadline = time.time() + 30
    while time.time() < deadline and not expected <= set(labels):
        time.sleep(0.3)
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        except OSError:
            continue
        labels = {}
        for line in text.splitlines():
            if line.startswith("ray_memprism_"):
                name, _, rest = line.partition("{")
                keys = re.findall(r'(?:^|,)(\w+)="(?:[^"\\]|\\.)*"', rest.rsplit("}", 1)[0])
                labels.setdefault(name.split(" ", 1)[0], set()).update(keys)
    print(json.dumps({k: sorted(v) for k, v in labels.items()}))
finally:
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
"""


@pytest.mark.ray
def test_exported_names_match_a_live_scrape() -> None:
    expected = all_exported()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRAPE, json.dumps(sorted(expected)), json.dumps([FULL_ITERATION, STEP_ROW])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(labels) == expected, (sorted(set(labels) - expected), sorted(expected - set(labels)))
    for name, keys in labels.items():
        assert {"run", "SessionName"} <= set(keys), (name, keys)
        assert ("le" in keys) == name.endswith("_bucket"), (name, keys)
    assert {"factor", "value"} <= set(labels["ray_memprism_view_selections_total"])
