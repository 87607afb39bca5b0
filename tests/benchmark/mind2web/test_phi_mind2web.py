"""The Mind2Web rule Phi (paper appendix D.2): normalised op as act, target element as
entity, keys restricted to the six semantic keys, state_update kept for a valid human
step with no key, explicit failure -> exception."""

from __future__ import annotations

from memprism_ray.benchmark.mind2web.phi import KEYS, Mind2WebPhi
from memprism_ray.recorder.events import Outcome, RawEvent
from memprism_ray.recorder.phi.base import Phi, record_event
from memprism_ray.recorder.stream import EventStream

FORM = "\n".join(
    [
        '[ref=e1] <a href="/deals"> Deals',
        '[ref=e2] <input type="text" placeholder="From"> From',
        '[ref=e3] <select name="cabin"> Economy Business',
        '[ref=e4] <input type="checkbox" name="direct"> Direct only',
        '[ref=e5] <button type="submit"> Search flights',
    ]
)
RESULTS = "\n".join(
    [
        "[ref=e9] <h1> Results",
        "[ref=e10] <li> Flight 1",
        "[ref=e11] <li> Flight 2",
        "[ref=e12] <li> Flight 3",
    ]
)


def _extract(action: str, before: str = FORM, after: str = FORM) -> object:
    return Mind2WebPhi().extract(RawEvent(before, action, after, 1.0), {})


def test_is_a_phi() -> None:
    assert isinstance(Mind2WebPhi(), Phi)


def test_type_and_select_give_field_and_choice_values() -> None:
    ex = _extract('{"op":"TYPE","ref":"e2","value":"Columbus"}')
    assert (ex.act, ex.entity, ex.failed) == ("type", "input 'From'", False)
    assert [(d.key, d.new_value) for d in ex.delta] == [("field_value", "Columbus")]
    assert ex.outcome is None  # with a key, the stream classifies the outcome
    ex = _extract('{"op":"SELECT","ref":"e3","value":"Business"}')
    assert ex.act == "select" and [(d.key, d.new_value) for d in ex.delta] == [("choice_value", "Business")]
    ex = _extract('{"op":"CLICK","ref":"e4","value":null}')
    assert [(d.key, d.new_value) for d in ex.delta] == [("choice_value", "input 'Direct only'")]


def test_click_submit_navigates_and_changes_results() -> None:
    ex = _extract('{"op":"CLICK","ref":"e5","value":null}', FORM, RESULTS)
    keys = {d.key: d.new_value for d in ex.delta}
    assert ex.act == "click" and ex.entity == "button 'Search flights'"
    assert keys["workflow_state"] == "button 'Search flights'"
    assert keys["page_state"].startswith("h1 'Results'")
    assert keys["result_state"] == "3 results"


def test_overlay_open_and_close() -> None:
    opened = FORM + '\n[ref=e20] <div role="dialog"> Sign in to continue'
    ex = _extract('{"op":"CLICK","ref":"e1","value":null}', FORM, opened)
    assert {d.key: d.new_value for d in ex.delta}["overlay_state"] == "open: div 'Sign in to continue'"
    ex = _extract('{"op":"CLICK","ref":"e1","value":null}', opened, FORM)
    assert {d.key: d.new_value for d in ex.delta}["overlay_state"] == "closed"


def test_valid_human_step_without_a_key_stays_state_update() -> None:
    ex = _extract('{"op":"CLICK","ref":"e1","value":null}')
    assert ex.delta == () and ex.outcome == Outcome.STATE_UPDATE and not ex.failed
    stream = EventStream({"goal": "g"})
    ev = record_event(stream, RawEvent(FORM, '{"op":"CLICK","ref":"e1","value":null}', FORM, 1.0), Mind2WebPhi())
    assert ev.outcome == Outcome.STATE_UPDATE  # not no_observed_change


def test_explicit_failure_is_an_exception_without_deltas() -> None:
    ex = _extract('{"op":"TYPE","ref":"e2","value":"x"}', FORM, "Action failed: element detached")
    assert ex.failed and ex.delta == ()
    stream = EventStream({"goal": "g"})
    raw = RawEvent(FORM, '{"op":"TYPE","ref":"e2","value":"x"}', "Action failed: element detached", 0.0)
    assert record_event(stream, raw, Mind2WebPhi()).outcome == Outcome.EXCEPTION


def test_keys_are_always_the_six_and_mapping_actions_work() -> None:
    pages = [FORM, RESULTS, FORM + '\n[ref=e20] <div role="menu"> Menu', ""]
    actions = [
        {"op": "CLICK", "ref": "e5", "value": None},
        {"op": "TYPE", "ref": "e2", "value": "Denver"},
        {"op": "SELECT", "ref": "e3", "value": "Economy"},
        {"op": "CLICK", "ref": "e404", "value": None},
    ]
    for before in pages:
        for after in pages:
            for action in actions:
                ex = Mind2WebPhi().extract(RawEvent(before, action, after, 1.0), {})
                assert {d.key for d in ex.delta} <= set(KEYS)
    ex = Mind2WebPhi().extract(RawEvent(FORM, {"op": "CLICK", "ref": "e404", "value": None}, FORM, 1.0), {})
    assert ex.entity == "e404" and ex.evidence["target_found"] is False


def test_unreadable_action_is_other_and_not_forced() -> None:
    ex = _extract("not json")
    assert ex.act == "other" and ex.outcome is None
