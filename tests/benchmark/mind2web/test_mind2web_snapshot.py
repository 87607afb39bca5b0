"""The paper's Mind2Web snapshot (appendix D.2): cleaned_html near candidate ids, compact
snippets as fallback, ``[ref=eN]`` markers the parser accepts."""

from __future__ import annotations

from memprism_ray.benchmark.mind2web.contract import snapshot_refs
from memprism_ray.benchmark.mind2web.data import Candidate, Step
from memprism_ray.benchmark.mind2web.snapshot import SnapshotConfig, build_snapshot, human_refs
from memprism_ray.benchmark.mind2web.snapshot_format import describe, parse_snapshot

HTML = (
    '<html><body><a backend_node_id="1" href="/home">Home</a>'
    '<label>Departure city</label><input backend_node_id="2" type="text" placeholder="From">'
    '<div><button backend_node_id="3" type="submit"><span>Search</span> flights</button></div>'
    '<select backend_node_id="4" name="cabin"><option backend_node_id="5">Economy</option>'
    "<option>Business</option></select></body></html>"
)


def _c(node: str, tag: str = "a", **attrs: str) -> Candidate:
    return Candidate(node, tag, {"backend_node_id": node, **attrs})


def _step(pos=("3",), neg=("1", "2", "4", "99"), html: str = HTML) -> Step:
    return Step(
        "uid-1",
        html,
        "CLICK",
        "",
        "CLICK",
        tuple(_c(n, "button") for n in pos),
        tuple(_c(n, "span", aria_label="Cart") if n == "99" else _c(n) for n in neg),
    )


def test_lines_follow_page_order_with_text_near_the_element() -> None:
    snap = build_snapshot(_step())
    assert snap.refs == ("e1", "e2", "e3", "e4", "e99")  # page order; off-page candidate last
    lines = snap.text.splitlines()
    assert lines[0] == '[ref=e1] <a href="/home"> Home'
    assert lines[1] == '[ref=e2] <input type="text" placeholder="From"> Departure city'  # the label before it
    assert lines[2] == '[ref=e3] <button type="submit"> Search flights'
    assert lines[3] == '[ref=e4] <select name="cabin"> Economy Business'
    assert snap.elements["e99"].source == "snippet" and lines[4] == '[ref=e99] <span aria_label="Cart"> Cart'
    assert snap.source == "mixed"
    assert snapshot_refs(snap.text) == snap.refs  # the policy parser finds every ref


def test_without_cleaned_html_every_line_is_a_snippet() -> None:
    snap = build_snapshot(_step(html=""))
    assert snap.source == "snippets"
    assert {e.source for e in snap.elements.values()} == {"snippet"}
    assert set(snap.refs) == {"e1", "e2", "e3", "e4", "e99"}


def test_positives_always_shown_negatives_capped_reproducibly() -> None:
    negs = tuple(str(n) for n in range(100, 160))
    html = "<html>" + "".join(f'<a backend_node_id="{n}">link {n}</a>' for n in ("3", *negs)) + "</html>"
    cfg = SnapshotConfig(max_candidates=5)
    a = build_snapshot(_step(neg=negs, html=html), cfg)
    b = build_snapshot(_step(neg=tuple(reversed(negs)), html=html), cfg)
    assert len(a.refs) == 5 and "e3" in a.refs
    assert a.refs == b.refs  # the choice does not depend on the file's order
    other = Step("uid-2", html, "CLICK", "", "CLICK", (_c("3", "button"),), tuple(_c(n) for n in negs))
    assert build_snapshot(other, cfg).refs != a.refs  # hashed per step


def test_parse_snapshot_and_human_refs() -> None:
    snap = build_snapshot(_step(pos=("3", "7")))
    parsed = parse_snapshot(snap.text)
    assert list(parsed) == list(snap.refs)
    assert parsed["e2"].attrs == {"type": "text", "placeholder": "From"} and parsed["e2"].tag == "input"
    assert human_refs(_step(pos=("3", "7")), snap) == ("e3", "e7")
    assert describe(parsed["e3"], "e3") == "button 'Search flights'"
    assert describe(None, "e42") == "e42"


def test_long_lines_are_bounded() -> None:
    html = f'<html><a backend_node_id="3">{"word " * 200}</a></html>'
    snap = build_snapshot(_step(neg=(), html=html), SnapshotConfig(max_line_chars=60))
    assert len(snap.text) == 60 and snap.text.endswith("...")
