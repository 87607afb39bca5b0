"""The LLM Phi (appendix D.2, E.1, E "Parsing and validation") against a local test server:
answers parsed from the first { to the last }, validated against each benchmark's key set,
rules keeping the action and explicit failure, and every unusable answer falling back to the
rule extraction with its reason recorded and counted."""

from __future__ import annotations

import io
from collections.abc import Mapping

import pytest
from phi_stub_server import COMPLETION_TOKENS, PROMPT_TOKENS, PhiStubServer

from memprism_ray.benchmark.alfworld.phi import ALFWORLD_PHI, AlfworldPhi
from memprism_ray.benchmark.ebalfred.phi import EBALFRED_PHI
from memprism_ray.benchmark.mind2web.phi import MIND2WEB_PHI
from memprism_ray.recorder import EventStream, Outcome, RawEvent, StateDelta
from memprism_ray.recorder.phi import record_event
from memprism_ray.recorder.phi.base import Extraction, Phi
from memprism_ray.recorder.phi.config import PhiConfig
from memprism_ray.recorder.phi.factory import build_phi, extract_each, phi_id, phi_stats
from memprism_ray.recorder.phi.llm import LLMPhi, PhiAnswerError, parse_answer
from memprism_ray.recorder.phi.llm_client import PhiEndpoint

GO = RawEvent(
    "MODE=valid You are in the middle of a room.", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."
)


def cfg(url: str, **kw) -> PhiConfig:
    base = {"kind": "llm", "model": "stub", "base_url": url, "backoff_s": 0.0, "timeout_s": 5.0, "max_retries": 1}
    return PhiConfig(**{**base, **kw})


def with_mode(raw: RawEvent, mode: str) -> RawEvent:
    return RawEvent(raw.o_pre.replace("MODE=valid", f"MODE={mode}"), raw.action, raw.feedback, raw.reward, raw.meta)


@pytest.fixture()
def server():
    with PhiStubServer() as srv:
        yield srv


# --- ALFWorld over the endpoint ------------------------------------------------------------
def test_valid_answer_gives_model_entity_and_deltas_with_the_rules_act(server: PhiStubServer) -> None:
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(server.base_url)), AlfworldPhi())
    assert isinstance(phi, Phi)
    stream = EventStream()
    ev = record_event(stream, GO, phi)
    assert ev.entity == "drawer 1" and ev.act == "go"
    assert ev.delta == (StateDelta("location", "drawer 1"), StateDelta("drawer 1", "closed"))  # the model's keys
    assert ev.outcome is Outcome.STATE_UPDATE
    assert ev.evidence == {"feedback_kind": "arrive", "phi": "llm", "phi_act_type": "go"}
    # the paper's prompt went out, filled with this event
    prompt = server.bodies[0]["messages"][0]["content"]
    assert prompt.startswith("You are phi, a structured event annotator for MemPrism.")
    assert '"action": "go to drawer 1",' in prompt and "Existing tracked keys: []" in prompt


def test_json_wrapped_in_prose_and_a_fence_is_parsed(server: PhiStubServer) -> None:
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(server.base_url)), AlfworldPhi())
    ex = phi.extract(with_mode(GO, "prose"), {})
    assert ex.evidence["phi"] == "llm" and ex.delta[0] == StateDelta("location", "drawer 1")


@pytest.mark.parametrize(
    ("mode", "counter", "reason"),
    [
        ("malformed", "fallback_invalid", "invalid answer: malformed JSON"),
        ("nojson", "fallback_invalid", "invalid answer: no JSON object in the answer"),
        ("down", "fallback_request", "request failed: LLMUnavailable: http://127.0.0.1:"),
    ],
)
def test_unusable_answer_falls_back_to_the_rules_with_the_reason(
    server: PhiStubServer, mode: str, counter: str, reason: str
) -> None:
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(server.base_url)), AlfworldPhi())
    raw = with_mode(GO, mode)
    ex = phi.extract(raw, {})
    rule = AlfworldPhi().extract(raw, {})
    assert (ex.entity, ex.act, ex.delta, ex.failed) == (rule.entity, rule.act, rule.delta, rule.failed)
    assert ex.delta == (StateDelta("agent.location", "drawer 1"), StateDelta("drawer 1.open", "closed"))
    assert ex.evidence["phi"] == "rules" and ex.evidence["phi_fallback"].startswith(reason)
    assert ex.evidence["feedback_kind"] == "arrive"  # the rule's own evidence is kept
    assert phi.counters[counter] == 1 and phi.counters["fallback"] == 1 and phi.counters["llm"] == 0


def test_a_500_then_ok_is_retried_and_used(server: PhiStubServer) -> None:
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(server.base_url, max_retries=1)), AlfworldPhi())
    ex = phi.extract(with_mode(GO, "flaky"), {})
    assert ex.evidence["phi"] == "llm"
    assert phi.stats()["backend_retries"] == 1 and phi.stats()["backend_requests"] == 2


def test_timeout_falls_back_once_the_retries_are_spent() -> None:
    with PhiStubServer(slow_s=1.5) as srv:
        phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(srv.base_url, max_retries=0, timeout_s=0.3)), AlfworldPhi())
        ex = phi.extract(with_mode(GO, "slow"), {})
    assert "timeout after 0.3s" in ex.evidence["phi_fallback"]
    assert phi.counters["fallback_request"] == 1


def test_explicit_failure_forces_exception_and_clears_the_models_delta(server: PhiStubServer) -> None:
    phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(server.base_url)), AlfworldPhi())
    raw = RawEvent("MODE=valid room", "open drawer 1", "Nothing happens.")
    stream = EventStream()
    ev = record_event(stream, raw, phi)
    assert ev.outcome is Outcome.EXCEPTION and ev.delta == () and ev.act == "open"
    assert ev.entity == "drawer 1" and ev.evidence["phi"] == "llm"  # the entity still comes from the model
    assert stream.state == {}


def test_a_batch_is_sent_concurrently_and_failures_stay_per_event() -> None:
    with PhiStubServer(delay_s=0.2) as srv:
        phi = LLMPhi(ALFWORLD_PHI, PhiEndpoint(cfg(srv.base_url, concurrency=8)), AlfworldPhi())
        raws = [with_mode(GO, m) for m in ("valid", "malformed", "valid", "down", "prose", "valid")]
        out = phi.extract_many(raws, [{}] * len(raws))
    assert srv.max_active >= 4  # all six were in flight together (one batch), not one at a time
    assert [x.evidence["phi"] for x in out] == ["llm", "rules", "llm", "rules", "llm", "llm"]
    s = phi.stats()
    assert s["events"] == 6 and s["llm"] == 4 and s["fallback"] == 2
    assert s["fallback_invalid"] == 1 and s["fallback_request"] == 1
    assert s["backend_prompt_tokens"] == 5 * PROMPT_TOKENS and s["backend_completion_tokens"] == 5 * COMPLETION_TOKENS


# --- batching and accounting with a recording backend --------------------------------------
class Recorder:
    def __init__(self, answers: list[object]) -> None:
        self.answers = answers
        self.calls: list[list[tuple[str, list[bytes]]]] = []

    def __call__(self, requests):
        self.calls.append(list(requests))
        return list(self.answers[: len(requests)])


class Breaks:
    name = "breaks"

    def extract(self, raw: RawEvent, known: Mapping[str, str]) -> Extraction:
        if "boom" in raw.action_text:
            raise RuntimeError("rule extractor broke")
        return Extraction("x", "other")


def test_one_backend_call_per_batch_and_a_rule_error_is_that_events_result() -> None:
    ok = '{"entity": "x", "act_type": "other", "delta_s": []}'
    rec = Recorder([ok, ok])
    phi = LLMPhi(ALFWORLD_PHI, rec, Breaks())
    raws = [RawEvent("a", "look", "f"), RawEvent("b", "boom", "f"), RawEvent("c", "look", "f")]
    out = phi.extract_many(raws, [{}, {}, {}])
    assert len(rec.calls) == 1 and len(rec.calls[0]) == 2  # the broken event sends no prompt
    assert isinstance(out[1], RuntimeError) and isinstance(out[0], Extraction) and isinstance(out[2], Extraction)
    assert phi.counters["rule_error"] == 1 and phi.counters["llm"] == 2
    assert extract_each(phi, raws, [{}, {}, {}])[1].args == ("rule extractor broke",)


def test_a_backend_that_answers_short_or_raises_fails_over_to_rules() -> None:
    phi = LLMPhi(ALFWORLD_PHI, Recorder([]), AlfworldPhi())
    ex = phi.extract(GO, {})
    assert "backend answered 0 for 1" in ex.evidence["phi_fallback"]

    def raises(requests):
        raise ConnectionError("gone")

    ex = LLMPhi(ALFWORLD_PHI, raises, AlfworldPhi()).extract(GO, {})
    assert ex.evidence["phi_fallback"] == "request failed: ConnectionError: gone"


def test_old_values_are_ignored_and_exact_duplicates_are_left_to_the_stream() -> None:
    answer = (
        '{"entity": "mug 1", "act_type": "put", "delta_s": ['
        '{"key": "mug 1", "old_value": "held", "new_value": "inside cabinet 1"},'
        '{"key": "mug 1", "new_value": "inside cabinet 1"}]}'
    )
    phi = LLMPhi(ALFWORLD_PHI, Recorder([answer]), AlfworldPhi())
    stream = EventStream()
    ev = record_event(stream, RawEvent("o", "move mug 1 to cabinet 1", "You move the mug 1 to the cabinet 1."), phi)
    assert ev.delta == (StateDelta("mug 1", "inside cabinet 1"),)
    assert stream.dropped["duplicate"] == 1 and phi.counters["ignored_old_values"] == 1


# --- parsing and validation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "msg"),
    [
        ('{"entity": "a", "delta_s": []}', r"missing \['act_type'\]"),
        ('{"entity": "a", "act_type": "go", "delta_s": [], "outcome": "x"}', r"not allowed \['outcome'\]"),
        ('{"entity": "", "act_type": "go", "delta_s": []}', "entity must be a non-empty string"),
        ('{"entity": 3, "act_type": "go", "delta_s": []}', "entity must be a non-empty string"),
        ('{"entity": "a", "act_type": ["go"], "delta_s": []}', "act_type must be a string"),
        ('{"entity": "a", "act_type": "go", "delta_s": {"key": "k"}}', "delta_s must be a list"),
        ('{"entity": "a", "act_type": "go", "delta_s": ["k=v"]}', r"delta_s\[0\] must be an object"),
        ('{"entity": "a", "act_type": "go", "delta_s": [{"key": "k"}]}', r"delta_s\[0\] must hold exactly"),
        ('{"entity": "a", "act_type": "go", "delta_s": [{"key": "k", "new_value": "v", "why": 1}]}', "exactly"),
        ('{"entity": "a", "act_type": "go", "delta_s": [{"key": 1, "new_value": "v"}]}', "key must be a string"),
        ('{"entity": "a", "act_type": "go", "delta_s": [{"key": "k", "new_value": null}]}', "new_value must be"),
        (
            '{"entity": "a", "act_type": "go", "delta_s": '
            '[{"key": "k", "new_value": "1"}, {"key": "k", "new_value": "2"}]}',
            "occurs twice with different values",
        ),
        ("[1, 2]", "no JSON object"),
        ("{entity: a}", "malformed JSON"),
        ("__import__('os').system('true') {}", r"missing \['act_type', 'delta_s', 'entity'\]"),
    ],
)
def test_alfworld_answers_that_break_the_schema_are_rejected(answer: str, msg: str) -> None:
    with pytest.raises(PhiAnswerError, match=msg):
        parse_answer(answer, ALFWORLD_PHI.answer)


def test_first_brace_to_last_brace_and_number_values() -> None:
    got = parse_answer(
        'Answer: {"entity":"a","act_type":"go","delta_s":[{"key":"k","new_value":2}]} done', ALFWORLD_PHI.answer
    )
    assert got.delta == (StateDelta("k", "2"),) and got.entity == "a" and got.act_type == "go"
    assert parse_answer({"entity": "a", "act_type": "go", "delta_s": []}, ALFWORLD_PHI.answer).delta == ()


# --- Mind2Web and EB-ALFRED with tiny local rule fallbacks ---------------------------------
class FakeMind2WebRules:
    """Stands in for the Mind2Web rule Phi: normalised op/target, a valid human step stays a state update."""

    name = "mind2web-fake-rule"

    def extract(self, raw: RawEvent, known: Mapping[str, str]) -> Extraction:
        act = dict(raw.action) if isinstance(raw.action, Mapping) else {}
        return Extraction(
            entity=str(act.get("target", "")),
            act=str(act.get("op", "")).lower(),
            delta=(StateDelta("page_state", "rule page"),),
            outcome=Outcome.STATE_UPDATE,
            evidence={"rule": "m2w"},
        )


def m2w_raw(mode: str, tag: str = "m") -> RawEvent:
    return RawEvent(
        f"<form MODE={mode} TAG={tag}><input placeholder='zip'></form>",
        {"op": "TYPE", "target": "input zip", "value": "60602"},
        "<form><input placeholder='zip' value='60602'></form>",
    )


def test_mind2web_keeps_the_rule_entity_act_and_forced_outcome(server: PhiStubServer) -> None:
    server.answers["m"] = {"delta_s": [{"key": "field_value", "new_value": "60602"}]}
    server.answers["none"] = {"delta_s": []}
    phi = LLMPhi(MIND2WEB_PHI, PhiEndpoint(cfg(server.base_url)), FakeMind2WebRules())
    stream = EventStream()
    ev = record_event(stream, m2w_raw("valid"), phi)
    assert (ev.entity, ev.act, ev.delta) == ("input zip", "type", (StateDelta("field_value", "60602"),))
    assert ev.evidence == {"rule": "m2w", "phi": "llm"}
    # no restricted key extracted: still a state update (replay of a valid human step)
    ev2 = record_event(stream, m2w_raw("valid", "none"), phi)
    assert ev2.delta == () and ev2.outcome is Outcome.STATE_UPDATE
    prompt = server.bodies[0]["messages"][0]["content"]
    assert prompt.startswith("You are phi, a delta extractor for Mind2Web web-agent trajectories.")
    assert '"action": {"op": "TYPE", "target": "input zip", "value": "60602"},' in prompt


def test_mind2web_key_outside_the_six_is_rejected_and_falls_back(server: PhiStubServer) -> None:
    phi = LLMPhi(MIND2WEB_PHI, PhiEndpoint(cfg(server.base_url)), FakeMind2WebRules())
    ex = phi.extract(m2w_raw("badkey"), {})
    assert ex.delta == (StateDelta("page_state", "rule page"),) and ex.evidence["phi"] == "rules"
    assert (
        "'price' is not allowed; allowed: choice_value, field_value, overlay_state, page_state"
        in (ex.evidence["phi_fallback"])
    )
    assert phi.counters["fallback_invalid"] == 1


@pytest.mark.parametrize(
    "answer",
    [
        {"entity": "zip", "delta_s": []},  # Mind2Web's schema has delta_s only
        {"delta_s": [{"key": "form_state", "new_value": "x"}]},
        {"delta_s": []},
    ],
)
def test_mind2web_spec(answer: dict) -> None:
    if answer == {"delta_s": []}:
        assert parse_answer(answer, MIND2WEB_PHI.answer).delta == ()
        return
    with pytest.raises(PhiAnswerError):
        parse_answer(answer, MIND2WEB_PHI.answer)


class FakeEbAlfredRules:
    name = "ebalfred-fake-rule"

    def extract(self, raw: RawEvent, known: Mapping[str, str]) -> Extraction:
        failed = raw.meta.get("last_action_success") is False
        return Extraction("pen", raw.action_text.split(" the ")[0], failed=failed, evidence={"rule": "eb"})


def png_file(tmp_path) -> tuple[str, bytes]:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (1, 2, 3)).save(buf, format="PNG")
    path = tmp_path / "post.png"
    path.write_bytes(buf.getvalue())
    return str(path), buf.getvalue()


def test_ebalfred_stage1_sends_the_post_frame_lowercases_the_entity_and_forces_failure(
    server: PhiStubServer, tmp_path
) -> None:
    import base64

    path, data = png_file(tmp_path)
    server.answers["eb"] = {
        "entity": "Pen",
        "act_type": "pick up",
        "delta_s": [{"key": "held_object", "new_value": "pen"}],
    }
    phi = LLMPhi(EBALFRED_PHI, PhiEndpoint(cfg(server.base_url)), FakeEbAlfredRules())
    ok = RawEvent(
        "MODE=valid TAG=eb Visible objects: Pen.",
        "pick up the Pen",
        "Held objects: Pen (held).",
        meta={"last_action_success": True, "env_feedback": "", "post_frame_path": path},
    )
    ex = phi.extract(ok, {})
    assert (ex.entity, ex.act, ex.delta) == ("pen", "pick up", (StateDelta("held_object", "pen"),))
    assert ex.evidence["phi_act_type"] == "pick up"
    parts = server.bodies[0]["messages"][0]["content"]
    assert parts[0]["text"].startswith(
        "You are phi, a structured event annotator for MemPrism. Extract only observable"
    )
    assert "CURRENT last action success:\n1" in parts[0]["text"]
    assert base64.b64decode(parts[1]["image_url"]["url"].split(",", 1)[1]) == data
    failed = RawEvent(ok.o_pre, ok.action, ok.feedback, meta={**ok.meta, "last_action_success": False})
    ex = phi.extract(failed, {})
    assert ex.failed and ex.delta == ()


def test_ebalfred_rejects_extra_fields_such_as_boxes(server: PhiStubServer) -> None:
    server.answers["box"] = {
        "entity": "pen",
        "act_type": "find",
        "delta_s": [],
        "entities": [{"bbox_2d": [1, 2, 3, 4]}],
    }
    phi = LLMPhi(EBALFRED_PHI, PhiEndpoint(cfg(server.base_url)), FakeEbAlfredRules())
    ex = phi.extract(RawEvent("MODE=valid TAG=box", "find a Pen", "Visible objects: Pen."), {})
    assert ex.evidence["phi"] == "rules" and "not allowed ['entities']" in ex.evidence["phi_fallback"]


def test_a_missing_frame_file_falls_back_with_the_reason() -> None:
    phi = LLMPhi(EBALFRED_PHI, Recorder([]), FakeEbAlfredRules())
    ex = phi.extract(RawEvent("o", "find a Pen", "r", meta={"post_frame_path": "/nonexistent/post.png"}), {})
    assert ex.evidence["phi_fallback"].startswith("prompt not built: FileNotFoundError")


# --- choosing the Phi from the config ------------------------------------------------------
def test_build_phi_follows_the_config(server: PhiStubServer) -> None:
    assert isinstance(build_phi(ALFWORLD_PHI), AlfworldPhi)
    assert isinstance(build_phi(ALFWORLD_PHI, PhiConfig()), AlfworldPhi)
    llm = build_phi(ALFWORLD_PHI, cfg(server.base_url))
    assert isinstance(llm, LLMPhi) and isinstance(llm.fallback, AlfworldPhi)
    out = extract_each(llm, [GO, with_mode(GO, "nojson")], [{}, {}])
    assert [x.evidence["phi"] for x in out] == ["llm", "rules"]
    assert phi_stats(llm)["phi"] == "alfworld-llm" and phi_stats(llm)["fallback_invalid"] == 1
    assert phi_stats(AlfworldPhi()) == {"phi": "alfworld-rule"}


def test_the_benchmarks_phi_and_phi_id_read_the_experiment_config(server: PhiStubServer) -> None:
    from memprism_ray.benchmark import get_benchmark
    from memprism_ray.config import load_config

    rules = load_config(None, [])
    spec = get_benchmark(rules.corpus.benchmark).phi_spec()
    assert isinstance(build_phi(spec, rules.phi), AlfworldPhi) and phi_id(rules) == "rule:alfworld"
    llm = load_config(None, ["--phi.kind", "llm", "--phi.model", "stub", "--phi.base_url", server.base_url])
    assert isinstance(build_phi(spec, llm.phi), LLMPhi) and phi_id(llm) == "llm:stub+rule:alfworld"
    injected = build_phi(spec, llm.phi, complete=Recorder(['{"entity":"e","act_type":"go","delta_s":[]}']))
    assert injected.extract(GO, {}).entity == "e"


def test_rerecord_re_extracts_kept_raw_events_a_step_of_every_stream_per_batch() -> None:
    from memprism_ray.recorder.phi.factory import rerecord

    rule = AlfworldPhi()
    streams = []
    for n, gid in ((2, "g1"), (3, "g2")):
        s = EventStream({"game_id": gid})
        for k in range(n):
            record_event(s, RawEvent(f"o{k}", f"go to drawer {k + 1}", f"You arrive at drawer {k + 1}."), rule)
        streams.append(s)
    answer = '{"entity": "drawer", "act_type": "go", "delta_s": [{"key": "location", "new_value": "somewhere"}]}'
    rec = Recorder([answer] * 2)
    again = rerecord(streams, LLMPhi(ALFWORLD_PHI, rec, rule))
    assert [len(c) for c in rec.calls] == [2, 2, 1]  # lockstep: one batch per step
    assert [s.meta for s in again] == [{"game_id": "g1"}, {"game_id": "g2"}]
    assert [s.raws for s in again] == [s.raws for s in streams]
    assert all(e.entity == "drawer" and e.evidence["phi"] == "llm" for s in again for e in s.events)
    # the second event repeats the known value: the stream, not the extractor, classifies it
    assert [e.outcome.value for e in again[1].events] == ["state_update", "no_observed_change", "no_observed_change"]
    # the prompt of step 2 lists the keys the LLM stream tracks, not the rule stream's
    assert 'Existing tracked keys: ["location"]' in rec.calls[1][0][0]

    with pytest.raises(
        RuntimeError, match="alfworld-llm failed on episode 0 step 1: RuntimeError: rule extractor broke"
    ):
        rerecord([_boom_stream()], LLMPhi(ALFWORLD_PHI, rec, Breaks()))


def _boom_stream() -> EventStream:
    s = EventStream()
    s.record(RawEvent("o", "boom", "f"), entity="x", act="y")
    return s


def test_the_event_act_is_the_rules_even_when_the_model_names_it_otherwise() -> None:
    # the paper's own example answers act_type "pick" for a take command
    answer = '{"entity": "toiletpaper 1", "act_type": "pick", "delta_s": [{"key": "held_object", "new_value": "x"}]}'
    phi = LLMPhi(ALFWORLD_PHI, Recorder([answer]), AlfworldPhi())
    raw = RawEvent("o", "take toiletpaper 1 from drawer 2", "You take the toiletpaper 1 from the drawer 2.")
    ex = phi.extract(raw, {})
    assert (ex.act, ex.evidence["phi_act_type"], ex.entity) == ("take", "pick", "toiletpaper 1")
    assert ex.delta == (StateDelta("held_object", "x"),)
