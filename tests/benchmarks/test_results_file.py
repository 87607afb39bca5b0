"""benchmarks/_results.py: one record per benchmark, written whole or not at all.

A record holds the figures a benchmark printed after ``RESULT`` with the command line, the
date, the machine and the git commit; it is written atomically, so a failed write leaves the
previous record as it was. Every benchmark script (but the policy pool's, recorded by its own
owner) writes one under its own name, and every record the docs cite exists.
"""

from __future__ import annotations

import ast
import datetime as dt
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import _results
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_record_holds_the_figures_and_what_ran(bench_results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_results, "_LAUNCH_ARGV", [str(ROOT / "benchmarks" / "bench_x.py"), "--rounds", "2"])
    monkeypatch.setattr(sys, "argv", ["translate.py", "domain", "task"])  # what ALFWorld's translator leaves
    figures = {"ratio": 1.5, "per_horizon": {"10": 2.4, "50": 4.0}, "identical": True}
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)

    path = _results.write_result("bench_x", figures)

    assert path == bench_results_dir / "bench_x.json"
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "bench_x" and doc["variant"] is None
    assert doc["result"] == figures
    assert doc["command"] == "python benchmarks/bench_x.py --rounds 2"
    written = dt.datetime.fromisoformat(doc["date"])
    assert written.utcoffset() == dt.timedelta(0)
    assert before <= written <= dt.datetime.now(dt.timezone.utc)
    assert doc["machine"]["cpu_count"] == os.cpu_count()
    assert 1 <= doc["machine"]["usable_cpus"] <= os.cpu_count()
    assert doc["machine"]["cpu_model"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert doc["git"]["commit"] == head.stdout.strip()
        assert isinstance(doc["git"]["dirty"], bool)


def test_argv_given_to_main_is_the_command_line_and_a_variant_has_its_own_file(
    bench_results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_results, "_LAUNCH_ARGV", [str(ROOT / "benchmarks" / "bench_x.py")])
    main = _results.write_result("bench_x", {"ratio": 1.0})
    other = _results.write_result("bench_x", {"ratio": 2.0}, variant="layout-local", argv=["--layout", "local"])
    assert other == bench_results_dir / "bench_x.layout-local.json"
    assert json.loads(other.read_text())["command"] == "python benchmarks/bench_x.py --layout local"
    assert json.loads(main.read_text())["result"] == {"ratio": 1.0}  # the default run's record is untouched


def test_a_rerun_replaces_the_record(bench_results_dir: Path) -> None:
    _results.write_result("bench_x", {"ratio": 1.0})
    _results.write_result("bench_x", {"ratio": 3.0})
    assert json.loads((bench_results_dir / "bench_x.json").read_text())["result"] == {"ratio": 3.0}
    assert sorted(p.name for p in bench_results_dir.iterdir()) == ["bench_x.json"]


def test_figures_that_do_not_serialise_leave_the_old_record(bench_results_dir: Path) -> None:
    path = _results.write_result("bench_x", {"ratio": 1.0})
    old = path.read_bytes()
    with pytest.raises(TypeError):
        _results.write_result("bench_x", {"ratio": object()})
    assert path.read_bytes() == old
    assert sorted(p.name for p in bench_results_dir.iterdir()) == ["bench_x.json"]


def test_a_write_that_fails_before_the_rename_leaves_the_old_record_and_no_temp_file(
    bench_results_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _results.write_result("bench_x", {"ratio": 1.0})
    old = path.read_bytes()

    def disk_full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        _results.write_result("bench_x", {"ratio": 2.0})
    assert path.read_bytes() == old
    assert sorted(p.name for p in bench_results_dir.iterdir()) == ["bench_x.json"]


@pytest.mark.parametrize(("name", "variant"), [("Bench X", ""), ("../escape", ""), ("bench_x", "a/b")])
def test_a_bad_name_or_variant_is_refused_by_name(name: str, variant: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(variant if variant else name))):
        _results.result_path(name, variant)


def test_a_benchmark_records_exactly_what_it_printed(bench_results_dir: Path, tmp_path: Path, capsys) -> None:
    from memprism_ray.recorder import EventStream, RawEvent

    spec = importlib.util.spec_from_file_location("bench_phi_agreement", ROOT / "benchmarks" / "bench_phi_agreement.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    stream = EventStream()
    stream.record(RawEvent("You are in a room.", "go to drawer 1", "You arrive at drawer 1."), entity="x", act="y")
    saved = tmp_path / "episode.jsonl"
    stream.save(saved)

    assert bench.main(["--streams", str(saved)]) == 0

    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("RESULT "))
    doc = json.loads((bench_results_dir / "bench_phi_agreement.rule-only.json").read_text())
    assert doc["result"] == printed
    assert doc["command"].endswith(f"--streams {saved}")
    assert not (bench_results_dir / "bench_phi_agreement.json").exists()  # no agreement measured, no main record


BENCHMARKS = sorted(p for p in (ROOT / "benchmarks").glob("bench_*.py") if p.stem != "bench_policy_pool")


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.stem)
def test_every_benchmark_records_under_its_own_name(script: Path) -> None:
    calls = [
        node
        for node in ast.walk(ast.parse(script.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "write_result"
    ]
    assert calls, f"{script.name} never calls write_result"
    for call in calls:
        first = call.args[0]
        assert isinstance(first, ast.Constant) and first.value == script.stem, ast.unparse(call)


CITED = re.compile(r"benchmarks/results/([A-Za-z0-9_.-]+\.json)")


def test_every_cited_record_exists_and_names_its_benchmark() -> None:
    sources = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")]
    sources += [*(ROOT / "memprism_ray").rglob("*.py"), *(ROOT / "configs").glob("*.yaml")]
    cited = {
        (src.relative_to(ROOT).as_posix(), name)
        for src in sources
        if src.exists()
        for name in CITED.findall(src.read_text())
    }
    missing = sorted(
        f"{src} cites benchmarks/results/{name}"
        for src, name in cited
        if not (ROOT / "benchmarks" / "results" / name).exists()
    )
    assert not missing, "records cited but not in benchmarks/results/: " + "; ".join(missing)
    for record in (ROOT / "benchmarks" / "results").glob("*.json"):
        doc = json.loads(record.read_text())
        assert record.name.split(".")[0] == doc["benchmark"], record.name
        assert {"command", "date", "machine", "git", "result"} <= doc.keys(), record.name


def quoted_figures() -> list[tuple[str, str, str]]:
    """(record, key path, value) of every row of benchmarks/README.md "What the records say"."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    section = text.split("## What the records say", 1)[1]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`") and cells[0].endswith(".json`"):
            rows.append((cells[0].strip("`"), cells[1].strip("`"), cells[2]))
    return rows


def test_the_benchmarks_readme_quotes_each_figure_as_its_record_has_it() -> None:
    rows = quoted_figures()
    assert len(rows) >= 10
    wrong = []
    for record, key, shown in rows:
        value = json.loads((ROOT / "benchmarks" / "results" / record).read_text())["result"]
        for part in key.split(" / "):
            value = value[part]
        if shown in ("true", "false", "null"):
            ok = value == json.loads(shown)
        else:
            decimals = len(shown.split(".")[1]) if "." in shown else 0
            ok = isinstance(value, int | float) and round(value, decimals) == float(shown)
        if not ok:
            wrong.append(f"{record} {key}: README {shown}, record {value}")
    assert not wrong, "; ".join(wrong)
