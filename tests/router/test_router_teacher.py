"""View teachers: verbatim appendix-E.2 prompts, adversarial reply parsing, HTTP retries and the
counterfactual teacher's cost tie-break."""

from __future__ import annotations

import json
import math
import random

import httpx
import numpy as np
import pytest
from json_endpoint import Reply, Request, json_endpoint

from memprism_ray.benchmark.mind2web.benchmark import MIND2WEB_TEACHER_PROMPT, Mind2WebLLMTeacher
from memprism_ray.recorder import EventStream, RawEvent, StateDelta
from memprism_ray.router.teacher import (
    GENERIC_PROMPT,
    CounterfactualConfig,
    CounterfactualTeacher,
    LLMTeacherConfig,
    LLMViewTeacher,
    TeacherPrompt,
    TeacherRequestError,
    TeacherResponseError,
    parse_teacher_response,
)
from memprism_ray.view_space import ALL_ACTIONS, ViewAction, cost


def item(tau: str, window: str, flt: str, gamma: str, score: object) -> dict:
    return {"a_view": {"tau": tau, "window": window, "filter": flt, "gamma": gamma}, "score": score, "rationale": "r"}


def idx(tau: str, window: str, flt: str, gamma: str) -> int:
    return ViewAction(tau, window, flt, gamma).index


# --- prompts ------------------------------------------------------------------------------
def test_prompts_are_the_verbatim_appendix_e2_texts() -> None:
    generic = GENERIC_PROMPT.load()
    assert generic.startswith(
        "You are a view teacher for MemPrism. Your job: select a view action (tau, window, filter,\n"
    )
    assert "Phase 2 -- COST TIE-BREAK: only after Phase 1 identifies multiple equally discriminative" in generic
    assert "  shorter window < longer window\n  more selective filter < all\n  coarse < medium < fine\n" in generic
    assert generic.rstrip().endswith("Return at most {top_k} items.")
    m2w = MIND2WEB_TEACHER_PROMPT.load()  # the Mind2Web benchmark's own (benchmark/mind2web/benchmark.py)
    assert m2w.startswith("You are a Mind2Web view teacher for MemPrism.")
    assert "You are given compact summaries, not raw HTML." in m2w
    assert '"observation_stats": {observation_stats},' in m2w
    assert (LLMViewTeacher.prompt, Mind2WebLLMTeacher.prompt) == (GENERIC_PROMPT, MIND2WEB_TEACHER_PROMPT)


def test_build_prompt_fills_placeholders_as_json_only() -> None:
    teacher = LLMViewTeacher(LLMTeacherConfig(model="m", top_k=3))
    s = EventStream()
    s.record(
        RawEvent("o", "go to drawer 1", "You arrive."),
        entity="drawer 1",
        act="go",
        delta=[StateDelta("agent.location", "drawer 1")],
    )
    tricky_goal = 'put {goal} "mug" in {top_k}'
    prompt = teacher.build_prompt(teacher.generic_inputs(s, "You see a drawer.", tricky_goal, "open drawer 1"))
    assert "Return top-3 soft labels as a distribution." in prompt and "Return at most 3 items." in prompt
    assert f'"goal": {json.dumps(tricky_goal)},' in prompt  # inserted once, never re-substituted
    assert '"observation": "You see a drawer.",' in prompt
    assert '"reference_next_action": "open drawer 1",' in prompt
    assert '"tau": "ActionEffect",' in prompt  # the literal schema braces are untouched
    start = prompt.index('"event_stream": ') + len('"event_stream": ')
    stream_json = json.JSONDecoder().raw_decode(prompt[start:])[0]
    assert stream_json[0]["action"] == "go to drawer 1" and stream_json[0]["outcome"] == "state_update"
    assert '"view_action_space": {"tau": ["TemporalTrace"' in prompt
    with pytest.raises(ValueError, match="missing \\['observation'\\]"):
        teacher.build_prompt({"goal": "g", "event_stream": [], "reference_next_action": "x"})
    with pytest.raises(ValueError, match="unknown \\['html'\\]"):
        teacher.build_prompt({**teacher.generic_inputs(s, "o", "g", "x"), "html": "<p>"})
    with pytest.raises(ValueError, match="top_k comes from"):
        teacher.build_prompt({**teacher.generic_inputs(s, "o", "g", "x"), "top_k": 9})
    assert TeacherPrompt("t", ("a",), text="{a} {b} {{c}}").fill({"a": "{b}"}) == "{b} {b} {{c}}"


# --- parsing ---------------------------------------------------------------------------------
def test_parse_well_formed_reply_with_prose_and_fences() -> None:
    payload = {
        "teacher_distribution": [
            item("ActionEffect", "recent_short", "exception", "fine", 0.6),
            item("EntityState", "all", "state_update", "medium", 0.3),
        ]
    }
    text = "Sure! Here it is:\n```json\n" + json.dumps(payload) + "\n```\nHope that helps."
    label = parse_teacher_response(text, top_k=5)
    q = label.distribution
    assert q.shape == (144,) and q.dtype == np.float32
    assert q[idx("ActionEffect", "recent_short", "exception", "fine")] == pytest.approx(2 / 3)
    assert q[idx("EntityState", "all", "state_update", "medium")] == pytest.approx(1 / 3)
    assert np.count_nonzero(q) == 2 and label.stats["accepted"] == 2


def test_parse_adversarial_items_are_counted_dropped_and_renormalised() -> None:
    items = [
        item("timeline", "recent_long", "all", "coarse", 0.4),  # legacy alias
        item("entitystate", "ALL", "Exception", "Fine", "0.2"),  # case + numeric string
        item("SpatialMap", "recent_short", "all", "fine", 0.9),  # unknown tau
        item("TemporalTrace", "last_3", "all", "fine", 0.9),  # unknown window
        item("ActionEffect", "recent_short", "all", "fine", -0.5),  # negative
        item("ActionEffect", "recent_long", "all", "fine", "NaN"),  # not finite
        item("ActionEffect", "all", "all", "fine", True),  # bool is not a score
        item("ActionEffect", "all", "all", "coarse", None),
        item("ActionEffect", "all", "all", "medium", {"v": 1}),
        {"a_view": {"tau": "ActionEffect", "window": "all"}, "score": 0.5},  # incomplete view
        "ActionEffect/all/all/fine",  # not an object
        {"a_view": "TemporalTrace/recent_long/all/coarse", "score": 0.1},  # duplicate (string form)
        {"tau": "DependencyChain", "window": "all", "filter": "exception", "gamma": "medium", "score": 0.3},
        {
            "a_view": {"tau": "ActionEffect", "window": "recent_short", "filter": "all", "gamma": "fine"},
            "score": 1e400,
        },  # parses as inf
    ]
    text = json.dumps({"teacher_distribution": items}).replace("Infinity", "1e400")
    label = parse_teacher_response(text)
    s = label.stats
    assert (s["items"], s["unknown_name"], s["bad_score"], s["malformed_item"], s["duplicate"]) == (14, 2, 6, 2, 1)
    q = label.distribution
    total = 0.5 + 0.2 + 0.3
    assert q[idx("TemporalTrace", "recent_long", "all", "coarse")] == pytest.approx(0.5 / total)
    assert q[idx("EntityState", "all", "exception", "fine")] == pytest.approx(0.2 / total)
    assert q[idx("DependencyChain", "all", "exception", "medium")] == pytest.approx(0.3 / total)
    assert float(q.sum()) == pytest.approx(1.0, abs=1e-6)


def test_parse_keeps_only_top_k_and_unnormalised_scores() -> None:
    items = [item("TemporalTrace", "recent_short", "all", g, s) for g, s in (("coarse", 5), ("medium", 3), ("fine", 2))]
    label = parse_teacher_response(json.dumps({"teacher_distribution": items}), top_k=2)
    assert label.stats["over_top_k"] == 1
    q = label.distribution
    assert q[idx("TemporalTrace", "recent_short", "all", "coarse")] == pytest.approx(5 / 8)
    assert q[idx("TemporalTrace", "recent_short", "all", "fine")] == 0.0


@pytest.mark.parametrize(
    "text, message",
    [
        ("I cannot help with that.", "no JSON object"),
        ('{"teacher_distribution": [', "no JSON object"),
        ('{"teacher_distribution": [}', "not valid JSON"),
        ('[{"a": 1}, {"b": 2}]', "not valid JSON"),
        ('{"views": []}', "no 'teacher_distribution' list"),
        ('{"teacher_distribution": {"a_view": "x"}}', "no 'teacher_distribution' list"),
        ('{"teacher_distribution": []}', "no valid view"),
        (json.dumps({"teacher_distribution": [item("TemporalTrace", "all", "all", "fine", 0)]}), "no valid view"),
        ("{" * 5000 + "}" * 5000, "not valid JSON"),
    ],
)
def test_parse_rejects_replies_without_a_distribution(text: str, message: str) -> None:
    with pytest.raises(TeacherResponseError, match=message):
        parse_teacher_response(text)


# --- HTTP ------------------------------------------------------------------------------------
def completion(content: str) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


GOOD = json.dumps({"teacher_distribution": [item("EntityState", "all", "all", "medium", 1.0)]})


def make_teacher(handler, **cfg) -> LLMViewTeacher:
    config = LLMTeacherConfig(model="teacher-model", backoff_s=0.0, **cfg)
    return LLMViewTeacher(config, transport=httpx.MockTransport(handler))


def generic_inputs() -> dict:
    return {"observation": "o", "goal": "g", "event_stream": [], "reference_next_action": "look"}


def test_http_retries_then_succeeds_and_sends_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMPRISM_TEST_KEY", "sk-test")
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            raise httpx.ConnectError("refused")
        if len(seen) == 2:
            return httpx.Response(503, text="busy")
        return httpx.Response(200, json=completion("```" + GOOD + "```"))

    teacher = make_teacher(handler, api_key_env="MEMPRISM_TEST_KEY", max_retries=2)
    label = teacher.label(generic_inputs())
    assert label.distribution[idx("EntityState", "all", "all", "medium")] == pytest.approx(1.0)
    c = teacher.counters
    assert (c["requests"], c["retries"], c["failures"], c["no_usage"]) == (3, 2, 0, 1)
    req = seen[-1]
    assert req.url.path.endswith("/v1/chat/completions") and req.headers["authorization"] == "Bearer sk-test"
    body = json.loads(req.content)
    assert body["model"] == "teacher-model" and body["temperature"] == 0.0
    assert body["messages"][0]["content"].startswith("You are a view teacher for MemPrism.")


def test_http_waits_as_long_as_retry_after_asks() -> None:
    """The teacher shares the one client (memprism_ray/llm_client.py): a 429's Retry-After is
    honoured even with no backoff of its own (the old teacher retried at once)."""
    import time

    seen: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(time.monotonic())
        if len(seen) == 1:
            return httpx.Response(429, headers={"Retry-After": "0.3"}, text="slow down")
        return httpx.Response(200, json={**completion(GOOD), "usage": {"prompt_tokens": 40, "completion_tokens": 9}})

    teacher = make_teacher(handler, max_retries=1)
    teacher.label(generic_inputs())
    assert seen[1] - seen[0] >= 0.3
    assert (teacher.counters["retries"], teacher.counters["prompt_tokens"], teacher.counters["completion_tokens"]) == (
        1,
        40,
        9,
    )


def test_http_gives_up_after_bounded_retries_and_on_client_errors() -> None:
    calls = {"n": 0}

    def timeout(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        raise httpx.ReadTimeout("slow", request=request)

    teacher = make_teacher(timeout, max_retries=2)
    with pytest.raises(TeacherRequestError, match="failed 3 time\\(s\\); last error: timeout"):
        teacher.label(generic_inputs())
    assert calls["n"] == 3

    calls["n"] = 0

    def bad_request(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        return httpx.Response(400, text="model not found")

    with pytest.raises(TeacherRequestError, match="HTTP 400: model not found"):
        make_teacher(bad_request, max_retries=5).label(generic_inputs())
    assert calls["n"] == 1  # 4xx is not retried

    with pytest.raises(TeacherResponseError, match="not an OpenAI chat completion"):
        make_teacher(lambda r: httpx.Response(200, json={"result": GOOD})).label(generic_inputs())
    with pytest.raises(ValueError, match="model is empty"):
        LLMViewTeacher(LLMTeacherConfig(model="")).complete("hi")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="top_k"):
        LLMTeacherConfig(top_k=0)
    with pytest.raises(ValueError, match="http"):
        LLMTeacherConfig(base_url="ftp://x")


def test_local_stub_server_end_to_end_mind2web_prompt() -> None:
    received: list[dict] = []

    def respond(request: Request) -> Reply:
        received.append(request.json())
        reply = json.dumps(
            {
                "teacher_distribution": [
                    item("TemporalTrace", "recent_short", "all", "fine", 0.7),
                    item("EntityState", "recent_long", "all", "medium", 0.3),
                ]
            }
        )
        return 200, completion("Answer: " + reply)

    with json_endpoint(respond) as url:
        config = LLMTeacherConfig(base_url=url, model="stub", timeout_s=10)
        with Mind2WebLLMTeacher(config) as teacher:
            label = teacher.label(
                {
                    "goal": "Book a table",
                    "current_summary": {"page_topic": "home"},
                    "prior_summary_events": [],
                    "summary_diffs": [],
                    "reference_next_action": {"op": "CLICK", "ref": "e3"},
                    "observation_stats": {"elements": 40},
                }
            )
    assert received[0]["messages"][0]["content"].startswith("You are a Mind2Web view teacher for MemPrism.")
    assert label.distribution[idx("TemporalTrace", "recent_short", "all", "fine")] == pytest.approx(0.7)
    assert label.stats["prompt"] == "mind2web"


# --- counterfactual teacher ---------------------------------------------------------------------
def state_policy(state: dict, view: ViewAction) -> str:
    """Finds the mug only in an EntityState view that reaches back beyond 6 steps."""
    if view.tau == "EntityState" and view.window != "recent_short":
        return "  Go To Countertop 1 "
    return "go to drawer 1"


def test_counterfactual_exact_distribution_and_tie_break() -> None:
    teacher = CounterfactualTeacher(state_policy, CounterfactualConfig(samples_per_view=1, cost_temperature=0.2))
    label = teacher.label({"obs": "..."}, "go to countertop 1")
    q = label.distribution
    good = [a for a in ALL_ACTIONS if a.tau == "EntityState" and a.window != "recent_short"]
    weights = {a.index: math.exp(-cost(a) / 0.2) for a in good}
    z = sum(weights.values())
    for a in ALL_ACTIONS:
        assert q[a.index] == pytest.approx(weights.get(a.index, 0.0) / z, rel=1e-5, abs=1e-7)
    cheap = ViewAction("EntityState", "recent_long", "exception", "coarse")
    dear = ViewAction("EntityState", "all", "all", "fine")
    assert q[cheap.index] > q[dear.index] > 0
    assert label.stats["matched_views"] == len(good) == 24 and label.stats["policy_calls"] == 144
    assert not label.stats["fallback"]


def test_counterfactual_stochastic_policy_rules_and_candidates() -> None:
    rng = random.Random(0)
    rates = {"TemporalTrace": 1.0, "ActionEffect": 0.5, "EntityState": 0.0, "DependencyChain": 0.0}

    def noisy(state: object, view: ViewAction) -> dict:
        ok = rng.random() < rates[view.tau]
        return {"op": "CLICK", "ref": "e1" if ok else "e2"}

    cands = (
        idx("TemporalTrace", "all", "all", "fine"),
        idx("ActionEffect", "all", "all", "fine"),
        idx("EntityState", "recent_short", "all", "coarse"),
    )
    teacher = CounterfactualTeacher(noisy, CounterfactualConfig(samples_per_view=200, candidates=cands))
    m = teacher.match_rates(None, {"op": "click", "ref": "E1"})
    assert m[cands[0]] == 1.0 and 0.4 < m[cands[1]] < 0.6 and m[cands[2]] == 0.0
    label = CounterfactualTeacher(
        noisy, CounterfactualConfig(samples_per_view=50, candidates=cands, rule="best")
    ).label(None, '{"op": "CLICK", "ref": "e1"}')
    assert label.distribution[cands[0]] == pytest.approx(1.0)
    assert np.count_nonzero(label.distribution) == 1


def test_counterfactual_no_match_fallback_or_raise() -> None:
    cands = (idx("TemporalTrace", "recent_short", "exception", "coarse"), idx("TemporalTrace", "all", "all", "fine"))
    teacher = CounterfactualTeacher(lambda s, v: "look", CounterfactualConfig(candidates=cands))
    label = teacher.label(None, "open drawer 1")
    assert label.stats["fallback"] and label.stats["matched_views"] == 0
    assert label.distribution[cands[0]] > label.distribution[cands[1]] > 0
    assert float(label.distribution.sum()) == pytest.approx(1.0)
    strict = CounterfactualTeacher(lambda s, v: "look", CounterfactualConfig(no_match="raise"))
    with pytest.raises(TeacherResponseError, match="no candidate view"):
        strict.label(None, "open drawer 1")
    with pytest.raises(ValueError, match="distinct indices"):
        CounterfactualConfig(candidates=(1, 1))
    with pytest.raises(ValueError, match="rule"):
        CounterfactualConfig(rule="softmax")


def test_complete_fn_replaces_the_endpoint_and_wraps_its_failures() -> None:
    sent: list[str] = []

    def serve(prompt: str) -> str:
        sent.append(prompt)
        if len(sent) == 2:
            raise RuntimeError("replica died")
        return json.dumps({"teacher_distribution": [item("EntityState", "all", "all", "medium", 1.0)]})

    teacher = LLMViewTeacher(LLMTeacherConfig(model=""), complete_fn=serve)  # no model name needed
    label = teacher.label(generic_inputs())
    assert label.distribution[idx("EntityState", "all", "all", "medium")] == pytest.approx(1.0)
    assert sent[0].startswith("You are a view teacher for MemPrism.")
    with pytest.raises(TeacherRequestError, match="teacher backend failed: RuntimeError: replica died"):
        teacher.label(generic_inputs())
    assert (teacher.counters["requests"], teacher.counters["retries"], teacher.counters["failures"]) == (2, 0, 1)


def test_counterfactual_margin_rule_keeps_near_best_views_and_cost_only_shades() -> None:
    """Phase 1 keeps views within ``margin`` of the best match rate; Phase 2 (cost) only
    shades mass among them: with the default T_c the dearest kept view keeps >= e^-1 of
    the cheapest one's weight per unit of match rate (T_c = 0.1 gave e^-10)."""
    rates = {"TemporalTrace": 1.0, "ActionEffect": 0.95, "EntityState": 0.5, "DependencyChain": 0.0}
    teacher = CounterfactualTeacher(None, probs=lambda s, v: {"go to countertop 1": rates[v.tau], "look": 0.0})
    label = teacher.label(None, "Go to countertop 1")
    q = label.distribution
    kept = {a.index for a in ALL_ACTIONS if a.tau in ("TemporalTrace", "ActionEffect")}
    assert {i for i in range(len(q)) if q[i] > 0} == kept
    cheap_tt = ViewAction("TemporalTrace", "recent_short", "exception", "coarse")
    dear_tt = ViewAction("TemporalTrace", "all", "all", "fine")
    ratio = q[dear_tt.index] / q[cheap_tt.index]
    assert ratio == pytest.approx(math.exp(-(cost(dear_tt) - cost(cheap_tt)) / 1.0), rel=1e-5)
    assert ratio >= math.exp(-1.0) - 1e-9
    # Same cost, lower match rate: proportionally less mass.
    same_ae = ViewAction("ActionEffect", "recent_short", "exception", "coarse")
    assert q[same_ae.index] / q[cheap_tt.index] == pytest.approx(0.95)
    # The marginal over relation types is not decided by the cost: both kept taus hold mass.
    by_tau = {t: sum(q[a.index] for a in ALL_ACTIONS if a.tau == t) for t in rates}
    assert by_tau["TemporalTrace"] > 0.4 and by_tau["ActionEffect"] > 0.4
    assert label.stats["policy_calls"] == 144 and label.stats["match_spread"] == pytest.approx(1.0)


def test_counterfactual_state_where_every_view_agrees_is_uninformative() -> None:
    """If the policy takes u_ref whatever it is shown, the label would be the cost prior
    alone (what collapsed the Router to the cheapest view): it is marked and skipped."""
    teacher = CounterfactualTeacher(None, probs=lambda s, v: {"take mug 1 from desk 1": 0.9, "look": 0.1})
    label = teacher.label(None, "take mug 1 from desk 1")
    assert label.stats["uninformative"] and label.stats["fallback"]
    assert label.stats["best_match_rate"] == pytest.approx(0.9) and label.stats["match_spread"] == 0.0
    keep_all = CounterfactualTeacher(
        None, CounterfactualConfig(min_spread=0.0), probs=lambda s, v: {"take mug 1 from desk 1": 0.9}
    ).label(None, "take mug 1 from desk 1")
    assert not keep_all.stats["fallback"] and not keep_all.stats["uninformative"]
    with pytest.raises(ValueError, match="margin"):
        CounterfactualConfig(margin=1.5)
    with pytest.raises(ValueError, match="act"):
        CounterfactualTeacher(None)


def test_counterfactual_uninformative_tie_break_labels_the_cheap_views() -> None:
    """``uninformative="tie_break"``: all views are equally discriminative, so the label is
    Phase 2 over all of them, q ∝ exp(-C/T), kept (not a fallback) and still marked."""
    probs = lambda s, v: {"take mug 1 from desk 1": 0.9, "look": 0.1}  # noqa: E731
    cfg = CounterfactualConfig(uninformative="tie_break", tie_break_temperature=0.1)
    label = CounterfactualTeacher(None, cfg, probs=probs).label(None, "take mug 1 from desk 1")
    assert label.stats["uninformative"] and not label.stats["fallback"]
    q = np.asarray(label.distribution)
    cheap = ViewAction("EntityState", "recent_short", "exception", "coarse")
    dear = ViewAction("EntityState", "all", "all", "fine")
    assert q[cheap.index] / q[dear.index] == pytest.approx(math.exp((cost(dear) - cost(cheap)) / 0.1), rel=1e-5)
    # Every relation type keeps equal mass: the cost never names tau.
    by_tau = {t: sum(q[a.index] for a in ALL_ACTIONS if a.tau == t) for t in ("TemporalTrace", "EntityState")}
    assert by_tau["TemporalTrace"] == pytest.approx(by_tau["EntityState"]) == pytest.approx(0.25)
    # Without its own temperature the tie-break uses T_c.
    soft = CounterfactualTeacher(None, CounterfactualConfig(uninformative="tie_break"), probs=probs)
    qs = np.asarray(soft.label(None, "take mug 1 from desk 1").distribution)
    assert qs[cheap.index] / qs[dear.index] == pytest.approx(math.exp(cost(dear) - cost(cheap)), rel=1e-5)
    # An informative state is labelled as before.
    informative = CounterfactualTeacher(
        None, cfg, probs=lambda s, v: {"take mug 1 from desk 1": 0.9 if v.tau == "EntityState" else 0.1}
    ).label(None, "take mug 1 from desk 1")
    assert not informative.stats["uninformative"]
    assert all(w == 0 for a, w in zip(ALL_ACTIONS, informative.distribution, strict=True) if a.tau != "EntityState")
    with pytest.raises(ValueError, match="uninformative"):
        CounterfactualConfig(uninformative="drop")
    with pytest.raises(ValueError, match="tie_break_temperature"):
        CounterfactualConfig(tie_break_temperature=-1.0)


def test_counterfactual_page_token_shading_prefers_the_smaller_page_among_kept_views() -> None:
    """``page_token_temperature``: Phase 2 shades the views Phase 1 kept by their page's
    visual tokens, exp(-tokens/T), in place of the structural cost; a view Phase 1 dropped
    stays at 0 however small its page."""
    ref = "go to drawer 2"
    # EntityState and TemporalTrace are equally discriminative, ActionEffect is not.
    m = {"EntityState": 0.5, "TemporalTrace": 0.48, "ActionEffect": 0.1, "DependencyChain": 0.1}
    probs = lambda s, v: {ref: m[v.tau], "look": 1 - m[v.tau]}  # noqa: E731
    pages = {"EntityState": 400, "TemporalTrace": 300, "ActionEffect": 100, "DependencyChain": 500}
    seen: list[ViewAction] = []

    def page_tokens(state: object, view: ViewAction) -> int:
        seen.append(view)
        return pages[view.tau] + 10 * (view.gamma == "fine")

    cfg = CounterfactualConfig(page_token_temperature=50.0)
    q = np.asarray(CounterfactualTeacher(None, cfg, probs=probs, page_tokens=page_tokens).label(None, ref).distribution)
    es = ViewAction("EntityState", "all", "all", "fine")
    tt = ViewAction("TemporalTrace", "all", "all", "fine")
    tt_coarse = ViewAction("TemporalTrace", "recent_short", "exception", "coarse")
    assert q[tt.index] / q[es.index] == pytest.approx((0.48 / 0.5) * math.exp(100 / 50), rel=1e-6)
    assert q[tt_coarse.index] / q[tt.index] == pytest.approx(math.exp(10 / 50), rel=1e-6)
    assert all(q[a.index] == 0 for a in ALL_ACTIONS if a.tau in ("ActionEffect", "DependencyChain"))
    assert len(seen) == 144
    # The structural cost (the default) gives equal-cost views of two taus the m ratio alone.
    q0 = np.asarray(CounterfactualTeacher(None, probs=probs, page_tokens=page_tokens).label(None, ref).distribution)
    assert q0[tt.index] / q0[es.index] == pytest.approx(0.48 / 0.5, rel=1e-6)
    with pytest.raises(ValueError, match="page_tokens"):
        CounterfactualTeacher(None, cfg, probs=probs)
    with pytest.raises(ValueError, match="page_token_temperature"):
        CounterfactualConfig(page_token_temperature=-1.0)


def test_counterfactual_exact_probabilities_match_many_samples() -> None:
    """``probs`` gives the limit that ``samples_per_view`` samples estimate."""
    rng = random.Random(1)
    p = {"TemporalTrace": 0.8, "ActionEffect": 0.3, "EntityState": 0.55, "DependencyChain": 0.1}
    cands = tuple(idx(t, "all", "all", "fine") for t in p)
    exact = CounterfactualTeacher(
        None, CounterfactualConfig(candidates=cands), probs=lambda s, v: {"a": p[v.tau], "b": 1 - p[v.tau]}
    ).match_rates(None, "a")
    sampled = CounterfactualTeacher(
        lambda s, v: "a" if rng.random() < p[v.tau] else "b",
        CounterfactualConfig(samples_per_view=4000, candidates=cands),
    ).match_rates(None, "a")
    for i in cands:
        assert exact[i] == pytest.approx(p[ALL_ACTIONS[i].tau])
        assert sampled[i] == pytest.approx(exact[i], abs=0.03)
