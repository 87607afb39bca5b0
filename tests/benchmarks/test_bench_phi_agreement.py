"""benchmarks/bench_phi_agreement.py: the agreement it prints is computed, not assumed.

A local server that answers with the rule extraction itself must agree 100%; one that
answers nothing useful must fall back everywhere; without an endpoint the bench loads the
transcripts and exits 0.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from json_endpoint import Reply, Request, chat_reply, json_endpoint

from memprism_ray.benchmark.alfworld.phi import AlfworldPhi
from memprism_ray.recorder import EventStream, RawEvent

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_phi_agreement", ROOT / "benchmarks" / "bench_phi_agreement.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

EPISODE = [
    ("You are in the middle of a room.", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
    (
        "You arrive at drawer 1. The drawer 1 is closed.",
        "open drawer 1",
        "You open the drawer 1. The drawer 1 is open. In it, you see a mug 1.",
    ),
    (
        "You open the drawer 1. The drawer 1 is open. In it, you see a mug 1.",
        "take mug 1 from drawer 1",
        "You take the mug 1 from the drawer 1.",
    ),
    ("You take the mug 1 from the drawer 1.", "close drawer 1", "Nothing happens."),
]


def saved_stream(tmp_path: Path) -> str:
    s = EventStream()
    for o, a, f in EPISODE:
        s.record(RawEvent(o, a, f), entity="x", act="y")
    path = tmp_path / "episode.jsonl"
    s.save(path)
    return str(path)


@contextlib.contextmanager
def echo_server(echo: bool, paper: bool = False) -> Iterator[str]:
    """Answers every Phi prompt with what the rule Phi reads off its EVENT (``echo``), the same in
    the paper prompt's key names for location/hand/open state only (``paper``), or with prose."""
    rule = AlfworldPhi()

    def respond(request: Request) -> Reply:
        prompt = request.json()["messages"][0]["content"]
        keys = json.loads(prompt.split("Existing tracked keys: ", 1)[1].split("\n", 1)[0])
        event = json.loads(prompt[prompt.rindex("EVENT:") + len("EVENT:") :])
        # the rule Phi needs the known contents for take/put; the bench's streams match
        known = {k: "" for k in keys}
        ex = rule.extract(RawEvent(event["observation"], event["action"], event["result"]), known)
        deltas = [(d.key, d.new_value) for d in ex.delta]
        if paper:
            names = {"agent.location": "location", "agent.holding": "held_object"}
            deltas = [(names.get(k, k.removesuffix(".open")), v) for k, v in deltas]
            deltas = [(k, v) for k, v in deltas if "." not in k]
        answer = {"entity": ex.entity, "act_type": ex.act, "delta_s": [{"key": k, "new_value": v} for k, v in deltas]}
        return 200, chat_reply(json.dumps(answer) if echo else "no idea")

    with json_endpoint(respond) as url:
        yield url


def result_line(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1].removeprefix("RESULT "))


def test_without_an_endpoint_it_loads_the_transcripts_and_exits_0(tmp_path: Path, capsys) -> None:
    assert bench.main(["--streams", saved_stream(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no --base-url given" in out
    res = result_line(out)
    assert res["events"] == 4 and res["llm"] is None
    assert res["rule_outcomes"] == {"state_update": 3, "exception": 1}


def test_an_llm_that_answers_like_the_rules_agrees_fully(tmp_path: Path, capsys) -> None:
    path = saved_stream(tmp_path)
    with echo_server(echo=True) as url:
        assert bench.main(["--streams", path, "--base-url", url, "--model", "echo", "--retries", "0"]) == 0
    llm = result_line(capsys.readouterr().out)["llm"]
    assert llm["events_answered_by_llm"] == 4
    assert llm["entity_agreement"] == 1.0 and llm["act_type_agreement"] == 1.0 and llm["outcome_agreement"] == 1.0
    assert llm["delta_precision"] == llm["delta_recall"] == llm["delta_exact_key_match"] == 1.0


def test_paper_key_names_match_by_entity_and_value_and_missing_keys_lower_recall(tmp_path: Path, capsys) -> None:
    path = saved_stream(tmp_path)
    with echo_server(echo=True, paper=True) as url:
        assert bench.main(["--streams", path, "--base-url", url, "--model", "paper", "--retries", "0"]) == 0
    llm = result_line(capsys.readouterr().out)["llm"]
    by_attr = llm["delta_recall_by_rule_attribute"]
    # rule pairs: go (agent, drawer 1) (drawer 1, closed); open (drawer 1, open) (drawer 1, mug 1) (mug 1, drawer 1);
    # take (agent, mug 1) (mug 1, agent) (drawer 1, nothing). The paper-named answers carry the hand, the agent's
    # location and the open state under other key names: 4 of 8 pairs, none of the contents or object locations.
    assert by_attr["holding"] == by_attr["open"] == 1.0 and by_attr["contents"] == 0.0
    assert by_attr["location"] == pytest.approx(1 / 3, abs=1e-4)  # agent.location only, not mug 1.location
    assert llm["delta_precision"] == 1.0 and llm["delta_recall"] == 0.5
    assert llm["delta_exact_key_match"] == 0.0


def test_an_llm_without_usable_answers_falls_back_everywhere(tmp_path: Path, capsys) -> None:
    path = saved_stream(tmp_path)
    with echo_server(echo=False) as url:
        assert bench.main(["--streams", path, "--base-url", url, "--model", "mute", "--retries", "0"]) == 0
    out = capsys.readouterr().out
    llm = result_line(out)["llm"]
    assert llm["events_answered_by_llm"] == 0 and llm["stats"]["fallback_invalid"] == 4
    assert "fallbacks: 4 ({'invalid answer': 4})" in out
    # the fallback is the rule extraction: the streams are identical
    assert llm["delta_exact_key_match"] == 1.0 and llm["entity_agreement"] == 1.0


@pytest.mark.parametrize("argv", [["--streams"]])
def test_no_events_is_an_error(argv: list[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    EventStream().save(empty)
    assert bench.main([*argv, str(empty)]) == 1
