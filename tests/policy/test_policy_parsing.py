"""Action parsers of appendix E.5 against well-formed and adversarial model outputs."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memprism_ray.benchmark import get_benchmark
from memprism_ray.benchmark.alfworld import contract as alfworld
from memprism_ray.benchmark.alfworld.contract import ALFWORLD, parse_alfworld
from memprism_ray.benchmark.ebalfred import contract as ebalfred
from memprism_ray.benchmark.ebalfred.contract import EBALFRED_PUT_DOWN, parse_ebalfred
from memprism_ray.benchmark.mind2web import contract as mind2web
from memprism_ray.benchmark.mind2web.contract import MIND2WEB_OPS, decode_mind2web_action, parse_mind2web
from memprism_ray.policy import parsing
from memprism_ray.policy.base import PolicyInput
from memprism_ray.policy.parsing import extract_action_tag


def parse_action(inp: PolicyInput, text: str) -> parsing.ParseResult:
    """The parse of ``text`` under the task contract of ``inp``'s benchmark."""
    return get_benchmark(inp.benchmark).task_contract().parse_action(inp, text)


ADMISSIBLE = ("go to desk 1", "go to drawer 2", "take mug 1 from desk 1", "look", "inventory")
SKILLS = ("find a Pan", "pick up the Pan", "find a CounterTop", EBALFRED_PUT_DOWN, "drop the object in hand")
REFS = ("e1", "e7", "e9", "e12")

INJECTIONS = (
    "__import__('os').system('touch /tmp/pwned')",
    "eval('1+1')",
    "{{7*7}}",
    "${jndi:ldap://x}",
    "'; DROP TABLE episodes; --",
    "go to desk 1'); import os; os.system('id'); ('",
)


@pytest.fixture(autouse=True)
def _no_eval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model output is data: a parser that evaluates it fails every test here."""

    def refuse(*args, **kwargs):
        raise AssertionError("parser evaluated model output")

    # Module globals shadow builtins: a parser calling eval/exec/compile hits these.
    for module in (parsing, alfworld, ebalfred, mind2web):
        for name in ("eval", "exec", "compile"):
            monkeypatch.setattr(module, name, refuse, raising=False)


# --- ALFWorld ------------------------------------------------------------------------------


def test_alfworld_exact_and_normalised_matches() -> None:
    assert parse_alfworld("<think>desk first</think><action>go to desk 1</action>", ADMISSIBLE).action == "go to desk 1"
    assert parse_alfworld("<action>  Go   To\tDESK 1 \n</action>", ADMISSIBLE).action == "go to desk 1"
    assert parse_alfworld("<ACTION>look</Action>", ADMISSIBLE).action == "look"
    assert parse_alfworld("<action>go\u00a0to\u3000desk 1</action>", ADMISSIBLE).action == "go to desk 1"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("go to desk 1", "no <action>"),
        ("<action>go to desk 1", "unclosed"),
        ("go to desk 1</action>", "without a matching"),
        ("<action>look</action><action>inventory</action>", "exactly one"),
        ("<action><action>look</action></action>", "nested"),
        ("<action>   </action>", "empty"),
        ("<action>go to desk 3</action>", "not in the admissible"),
        ("<action>go to desk 1.</action>", "not in the admissible"),
        ("<action>'go to desk 1'</action>", "not in the admissible"),
        ("<action>" + "x" * 5000 + "</action>", "too long"),
    ],
)
def test_alfworld_invalid_outputs_carry_a_reason(text: str, reason: str) -> None:
    result = parse_alfworld(text, ADMISSIBLE)
    assert not result.valid and result.action is None
    assert reason in result.error


def test_action_tags_inside_closed_think_are_ignored() -> None:
    text = (
        "<think>I must answer in <action></action> tags, e.g. <action>look</action>.</think><action>inventory</action>"
    )
    assert parse_alfworld(text, ADMISSIBLE).action == "inventory"
    # An unclosed think block hides nothing.
    assert parse_alfworld("<think>hmm <action>look</action>", ADMISSIBLE).action == "look"
    assert (
        "exactly one" in parse_alfworld("<think>x</think><action>look</action> <action>look</action>", ADMISSIBLE).error
    )


def test_ambiguous_normalised_match_is_invalid() -> None:
    result = parse_alfworld("<action>GO TO DESK 1</action>", ("go to desk 1", "Go to desk 1"))
    assert not result.valid and "several" in result.error
    assert parse_alfworld("<action>Go to desk 1</action>", ("go to desk 1", "Go to desk 1")).action == "Go to desk 1"


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_strings_are_plain_invalid_text(payload: str) -> None:
    for text in (payload, f"<action>{payload}</action>"):
        assert not parse_alfworld(text, ADMISSIBLE).valid
        assert not parse_ebalfred(text, SKILLS).valid
        assert not parse_mind2web(text, REFS).valid


@pytest.mark.timeout(30)
def test_huge_adversarial_outputs_are_linear() -> None:
    for text in (
        "<action>" * 100_000,
        "</action>" * 100_000,
        "<think>" * 100_000 + "<action>look</action>",
        "<action>" + "a" * 2_000_000 + "</action>",
    ):
        result = parse_alfworld(text, ADMISSIBLE)
        assert result.error is not None or result.action == "look"
    deep = "<action>" + "[" * 100_000 + "]" * 100_000 + "</action>"
    assert not parse_mind2web(deep, REFS).valid
    nested = "<action>" + '{"a":' * 5_000 + "1" + "}" * 5_000 + "</action>"
    assert not parse_mind2web(nested, REFS).valid


admissible_lists = st.lists(
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"), min_size=1, max_size=30)
    .map(str.strip)
    .filter(bool),
    min_size=1,
    max_size=8,
    unique=True,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=3000))
def test_any_output_yields_a_result_never_an_exception(text: str) -> None:
    for result in (parse_alfworld(text, ADMISSIBLE), parse_ebalfred(text, SKILLS), parse_mind2web(text, REFS)):
        assert result.valid == (result.error is None)
    alf = parse_alfworld(text, ADMISSIBLE)
    if alf.valid:
        assert alf.action in ADMISSIBLE
    ebr = parse_ebalfred(text, SKILLS)
    if ebr.valid:
        assert ebr.action in SKILLS
    m2w = parse_mind2web(text, REFS)
    if m2w.valid:
        data = decode_mind2web_action(m2w.action)
        assert data["op"] in MIND2WEB_OPS and data["ref"] in REFS


@settings(max_examples=200, deadline=None)
@given(admissible=admissible_lists, data=st.data())
def test_tagged_admissible_action_round_trips(admissible: list[str], data: st.DataObject) -> None:
    action = data.draw(st.sampled_from(admissible))
    prefix = data.draw(
        st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)), max_size=50)
    )
    result = parse_alfworld(f"<think>{prefix}</think>\n<action>{action}</action>", tuple(admissible))
    assert result.action == action


@settings(max_examples=100, deadline=None)
@given(admissible=admissible_lists, data=st.data())
def test_several_or_nested_tags_are_always_invalid(admissible: list[str], data: st.DataObject) -> None:
    a, b = data.draw(st.sampled_from(admissible)), data.draw(st.sampled_from(admissible))
    assert "exactly one" in parse_alfworld(f"<action>{a}</action> then <action>{b}</action>", tuple(admissible)).error
    assert "nested" in parse_alfworld(f"<action><action>{a}</action></action>", tuple(admissible)).error


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_case_and_whitespace_noise_is_normalised(data: st.DataObject) -> None:
    action = data.draw(st.sampled_from(ADMISSIBLE))
    words = action.split(" ")
    seps = data.draw(
        st.lists(st.sampled_from([" ", "  ", "\t", "\n", "\u00a0"]), min_size=len(words) - 1, max_size=len(words) - 1)
    )
    noisy = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=False))
    noisy = "".join(c.upper() if data.draw(st.booleans()) else c for c in noisy)
    assert parse_alfworld(f"<action> {noisy} </action>", ADMISSIBLE).action == action


# --- EB-ALFRED -----------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_ebalfred_case_noise_matches_the_skill(data: st.DataObject) -> None:
    skill = data.draw(st.sampled_from(SKILLS))
    noisy = "".join(c.swapcase() if data.draw(st.booleans()) else c for c in skill)
    assert parse_ebalfred(f"<action>{noisy}</action>", SKILLS).action == skill


def test_ebalfred_matching_order_and_put_down_canonicalisation() -> None:
    assert parse_ebalfred("<action>find a Pan</action>", SKILLS).action == "find a Pan"
    assert parse_ebalfred("<action>FIND A PAN</action>", SKILLS).action == "find a Pan"
    assert parse_ebalfred("<action>find  a\nPan</action>", SKILLS).action == "find a Pan"
    assert parse_ebalfred("<action>put down the Pan on the CounterTop</action>", SKILLS).action == EBALFRED_PUT_DOWN
    assert parse_ebalfred("<action>Put  Down pan</action>", SKILLS).action == EBALFRED_PUT_DOWN
    no_put = tuple(s for s in SKILLS if s != EBALFRED_PUT_DOWN)
    assert not parse_ebalfred("<action>put down the Pan</action>", no_put).valid
    assert not parse_ebalfred("<action>find a Knife</action>", SKILLS).valid
    assert not parse_ebalfred("<action>3</action>", SKILLS).valid


# --- Mind2Web ------------------------------------------------------------------------------


def test_mind2web_valid_actions_are_canonical() -> None:
    r = parse_mind2web('<reasoning>x</reasoning><action>{"op":"click","ref":"e12","value":"ignored"}</action>', REFS)
    assert r.action == '{"op":"CLICK","ref":"e12","value":null}'
    r = parse_mind2web('<action>```json\n{"op": "TYPE", "ref": " e7 ", "value": "New York"}\n```</action>', REFS)
    assert json.loads(r.action) == {"op": "TYPE", "ref": "e7", "value": "New York"}
    r = parse_mind2web('<action>{"op":"SELECT","ref":"e9","value":"Economy","why":"cheap","n":[1,2]}</action>', REFS)
    assert json.loads(r.action) == {"op": "SELECT", "ref": "e9", "value": "Economy"}
    assert decode_mind2web_action(r.action)["value"] == "Economy"
    # An empty value is a value (Mind2Web records TYPE steps with one; issue 35 item 5).
    r = parse_mind2web('<action>{"op":"TYPE","ref":"e7","value":""}</action>', REFS)
    assert json.loads(r.action) == {"op": "TYPE", "ref": "e7", "value": ""}


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ('{"op":"HOVER","ref":"e1"}', "unknown op"),
        ('{"op":"CLICK","ref":"e99"}', "not in the current snapshot"),
        ('{"op":"CLICK"}', "non-empty string 'ref'"),
        ('{"ref":"e1"}', "string 'op'"),
        ('{"op":"TYPE","ref":"e7"}', "needs a string 'value'"),
        ('{"op":"SELECT","ref":"e9","value":null}', "needs a string 'value'"),
        ('{"op":"TYPE","ref":"e7","value":5}', "needs a string 'value'"),
        ('{"op":"CLICK","ref":"e1","op":"TYPE"}', "duplicate JSON key"),
        ('{"op":"TYPE","ref":"e7","value":NaN}', "invalid JSON"),
        ("{'op':'CLICK','ref':'e1'}", "invalid JSON"),
        ("CLICK e1", "no JSON object"),
        ('[{"op":"CLICK","ref":"e1"}, {"op":"CLICK","ref":"e7"}]', "invalid JSON"),
        ('{"op":"CLICK","ref":["e1"]}', "non-empty string 'ref'"),
    ],
)
def test_mind2web_rejections(body: str, reason: str) -> None:
    result = parse_mind2web(f"<action>{body}</action>", REFS)
    assert not result.valid and reason in result.error


def test_mind2web_needs_exactly_one_tagged_action() -> None:
    one = '{"op":"CLICK","ref":"e1"}'
    assert "exactly one" in parse_mind2web(f"<action>{one}</action><action>{one}</action>", REFS).error
    assert "no <action>" in parse_mind2web(one, REFS).error


def test_parse_action_dispatch_uses_snapshot_refs_when_admissible_is_empty() -> None:
    inp = PolicyInput("mind2web", "book", "<button [ref=e3]>Go</button> <input [ref=e4]>")
    assert parse_action(inp, '<action>{"op":"CLICK","ref":"e3"}</action>').valid
    assert not parse_action(inp, '<action>{"op":"CLICK","ref":"e1"}</action>').valid
    inp2 = PolicyInput("mind2web", "book", "[ref=e3]", admissible=("e1",))
    assert parse_action(inp2, '<action>{"op":"CLICK","ref":"e1"}</action>').valid


def test_to_output_counts_invalid_outputs_without_raising() -> None:
    inp = PolicyInput("alfworld", "g", "o", admissible=ADMISSIBLE)
    good = ALFWORLD.to_output(inp, "<action>look</action>", prompt_tokens=12, completion_tokens=4, visual_tokens=578)
    assert good.valid and good.action == "look" and good.prompt_tokens == 12 and good.visual_tokens == 578
    bad = ALFWORLD.to_output(inp, None)  # type: ignore[arg-type]
    assert not bad.valid and bad.text == "" and "no <action>" in bad.error
    assert extract_action_tag(b"<action>x</action>")[1] is not None  # type: ignore[arg-type]


json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
extra_fields = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in ("op", "ref", "value")),
    json_scalars | st.lists(json_scalars, max_size=3),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    op=st.sampled_from(["CLICK", "TYPE", "SELECT", "click", " Type "]),
    ref=st.sampled_from(REFS),
    value=st.text(min_size=1, max_size=40).filter(lambda v: v.strip()),
    extra=extra_fields,
    noise=st.text(alphabet=st.characters(blacklist_characters="<>{}", blacklist_categories=("Cs",)), max_size=40),
)
def test_mind2web_json_with_extra_fields_and_unicode(op: str, ref: str, value: str, extra: dict, noise: str) -> None:
    body = json.dumps({**extra, "op": op, "ref": ref, "value": value}, ensure_ascii=bool(len(value) % 2))
    result = parse_mind2web(f"<reasoning>{noise}</reasoning><action>{noise}{body}{noise}</action>", REFS)
    assert result.valid, result.error
    canonical = decode_mind2web_action(result.action)
    assert set(canonical) == {"op", "ref", "value"}
    assert canonical["op"] == op.strip().upper() and canonical["ref"] == ref
    assert canonical["value"] == (None if canonical["op"] == "CLICK" else value)
