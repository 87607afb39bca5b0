"""EB-ALFRED Phi: stage 1 rules, stage 2 grounding, and both on fixture episodes."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from memprism_ray.benchmark.ebalfred.phi import (
    PROMPT_PATH,
    EbAlfredPhi,
    EbAlfredRulePhi,
    Frame,
    GroundingStage,
    frame_from_meta,
    parse_skill,
    validate_boxes,
)
from memprism_ray.recorder.events import Outcome, RawEvent
from memprism_ray.recorder.phi.base import Extraction, Phi, record_event
from memprism_ray.recorder.stream import EventStream

OK = "Last action executed successfully."
PAPER = Path("/work/shared/seeds/000_e8ab49c9613c1996.txt")
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def raw(
    action: str, feedback: str = OK, o_pre: str = "Visible objects: Ladle. Held objects: none.", **meta
) -> RawEvent:
    return RawEvent(o_pre=o_pre, action=action, feedback=feedback, meta=meta)


@pytest.mark.parametrize(
    ("action", "act", "target"),
    [
        ("find a Sink", "find", "sink"),
        ("pick up the Ladle", "pick up", "ladle"),
        ("put down the object in hand", "put down", None),
        ("drop the object in hand", "drop", None),
        ("open the Cabinet_2", "open", "cabinet_2"),
        ("close the Fridge", "close", "fridge"),
        ("turn on the Faucet", "turn on", "faucet"),
        ("turn off the DeskLamp", "turn off", "desklamp"),
        ("slice the Apple", "slice", "apple"),
        ("dance", "other", None),
    ],
)
def test_parse_skill(action: str, act: str, target: str | None) -> None:
    assert parse_skill(action) == (act, target)


def test_stage1_is_a_plain_phi_with_sparse_updates() -> None:
    phi = EbAlfredRulePhi()
    assert isinstance(phi, Phi)
    s = EventStream()
    record_event(s, raw("find a Ladle"), phi)
    e = record_event(s, raw("pick up the Ladle"), phi)
    assert (e.entity, e.act, e.outcome) == ("ladle", "pick up", Outcome.STATE_UPDATE)
    assert s.state["agent.held_object"] == "ladle" and s.state["ladle.location"] == "held"
    record_event(s, raw("find a DiningTable", o_pre="Held objects: Ladle (held)."), phi)
    e = record_event(s, raw("put down the object in hand", o_pre="Held objects: Ladle (held)."), phi)
    assert e.entity == "ladle" and s.state["ladle.location"] == "diningtable"
    assert s.state["agent.held_object"] == "none"
    e = record_event(s, raw("turn on the Faucet"), phi)
    assert s.state["faucet.power"] == "on" and e.outcome == Outcome.STATE_UPDATE
    e = record_event(s, raw("turn on the Faucet"), phi)
    assert e.outcome == Outcome.NO_OBSERVED_CHANGE  # same value again: the stream says so
    record_event(s, raw("open the Fridge"), phi)
    record_event(s, raw("slice the Apple"), phi)
    assert s.state["fridge.open"] == "open" and s.state["apple.sliced"] == "true"


def test_simulator_failure_forces_exception_and_clears_delta() -> None:
    phi = EbAlfredRulePhi()
    bad = "Last action is invalid. Robot is currently holding Mug"
    ex = phi.extract(raw("pick up the Pen", bad, "Held objects: Mug (held)."), {})
    assert ex.failed and ex.delta == () and (ex.entity, ex.act) == ("pen", "pick up")
    # the success flag in metadata is hard evidence too, even if the text looks fine
    ex = phi.extract(raw("open the Fridge", OK, last_action_success=False), {})
    assert ex.failed and ex.delta == ()
    s = EventStream()
    assert record_event(s, raw("pick up the Pen", bad), phi).outcome == Outcome.EXCEPTION
    # unexplained feedback: nothing is made up
    ex = phi.extract(raw("open the Fridge", "something odd"), {})
    assert not ex.failed and ex.delta == () and ex.evidence["feedback_kind"] == "unknown"


def test_grounding_prompt_is_the_papers_verbatim() -> None:
    if not PAPER.is_file():
        pytest.skip("paper text not available")
    text = PAPER.read_text()
    block = re.search(r"\{EB-ALFRED Phi Grounding Stage\}\n\\begin\{PromptText\}\n(.*?)\\end\{PromptText\}", text, re.S)
    assert block is not None
    assert PROMPT_PATH.read_text() == block.group(1)


def test_validate_boxes_keeps_only_valid_ones() -> None:
    answer = {
        "entities": [
            {"entity": "ladle", "bbox_2d": [10, 20, 300, 400]},
            {"entity": "ladle", "bbox_2d": [10, 20, 300, 400]},  # second box for one entity
            {"entity": "sink", "bbox_2d": [0, 0, 1200, 10]},  # outside
            {"entity": "faucet", "bbox_2d": [50, 50, 50, 60]},  # degenerate
            {"entity": "spoon", "bbox_2d": [1, 1, 2, 2]},  # not a candidate
            {"entity": "table", "bbox_2d": [1, 1, 2]},  # three numbers
            {"entity": "bowl", "bbox_2d": [1, 1, 2, 2], "score": 0.9},  # extra field
            {"entity": "sink", "bbox_2d": [0, 0, 10, 10]},
            {"entity": "faucet", "bbox_2d": [5, 5, 10, 10]},
            {"entity": "table", "bbox_2d": [5, 5, 10, 10]},  # a fourth valid box
        ]
    }
    ok, bad = validate_boxes(answer, ["ladle", "sink", "faucet", "table", "bowl"])
    assert [b["entity"] for b in ok] == ["ladle", "sink", "faucet"]
    reasons = [r["reason"] for r in bad]
    assert reasons == [
        "second box for the same entity",
        "outside the frame (0-1000 scale)",
        "degenerate box",
        "not a candidate entity",
        "bbox_2d must be four numbers",
        "an item must hold exactly 'entity' and 'bbox_2d'",
        "more than 3 boxes",
    ]
    with pytest.raises(ValueError, match="exactly one field"):
        validate_boxes({"entities": [], "extra": 1}, ["ladle"])


class Vision:
    """A scripted vision model: records prompts, answers from a queue."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, list[bytes]]] = []

    def __call__(self, items):
        self.calls.extend((p, list(ims)) for p, ims in items)
        return [self.answers.pop(0) for _ in items]


def test_grounding_never_alters_stage1_and_flags_stale_frames() -> None:
    vision = Vision(
        [
            '```json\n{"entities": [{"entity": "ladle", "bbox_2d": [1, 2, 30, 40]}]}\n```',
            "not json at all",
            RuntimeError("vision server down"),
        ]
    )
    stage = GroundingStage(vision)
    phi = EbAlfredPhi(EbAlfredRulePhi(), stage)
    b64 = base64.b64encode(PNG).decode()
    raws = [
        raw("pick up the Ladle", step=0, frame_step=1, frame_png_b64=b64, frame_changed=True),
        raw("find a Sink", step=1, frame_step=2, frame_png_b64=b64, frame_changed=True),
        raw("turn on the Faucet", step=2, frame_step=3, frame_png_b64=b64, frame_changed=True),
        raw("find a Mug", step=3, frame_step=2, frame_png_b64=b64, frame_changed=True),  # older frame
        raw("find a Cup", step=4, frame_step=5, frame_png_b64=b64, frame_changed=False),  # unchanged frame
        raw("find a Pot", step=5),  # no frame
    ]
    plain = [EbAlfredRulePhi().extract(r, {}) for r in raws]
    got = phi.extract_many(raws, [{}] * len(raws))
    for p, g in zip(plain, got, strict=True):
        assert (g.entity, g.act, g.delta, g.failed, g.outcome) == (p.entity, p.act, p.delta, p.failed, p.outcome)
    status = [g.evidence["grounding"]["status"] for g in got]
    assert status == ["ok", "parse_error", "model_error", "stale_frame", "stale_frame", "no_frame"]
    assert got[0].evidence["grounding"]["boxes"] == [{"entity": "ladle", "bbox_2d": [1.0, 2.0, 30.0, 40.0]}]
    assert [g.evidence["grounding"]["stale_frame"] for g in got] == [False, False, False, True, True, True]
    assert len(vision.calls) == 3  # stale or missing frames never reach the model
    prompt, images = vision.calls[0]
    assert prompt.endswith('Candidate entities from semantic stage: ["ladle"]\n') and images == [PNG]
    assert "{candidate_list}" not in prompt
    json.dumps([g.evidence for g in got])  # evidence stays JSON


def test_frame_from_meta_reads_paths_and_rejects_non_png(tmp_path: Path) -> None:
    p = tmp_path / "f.png"
    p.write_bytes(PNG)
    assert frame_from_meta(raw("x", frame_path=str(p), frame_step=3, frame_changed=True)) == Frame(PNG, 3, True)
    p.write_bytes(b"GIF89a")
    assert frame_from_meta(raw("x", frame_path=str(p))).png is None
    assert frame_from_meta(raw("x", frame_path=str(tmp_path / "missing.png"))).png is None
    assert frame_from_meta(raw("x", frame_png_b64="%%%")).png is None


def test_fixture_episode_grounds_with_exact_boxes(tmp_path: Path) -> None:
    """Both stages over a played fixture episode: a vision model that answers with the
    fixture's ground-truth boxes gets every one accepted."""
    from memprism_ray.agent import Agent, AgentConfig, EpisodeSpec, LocalServices
    from memprism_ray.baselines import make_selector
    from memprism_ray.benchmark.ebalfred.data import game_ref
    from memprism_ray.benchmark.ebalfred.env import EbAlfredConfig, EbAlfredEnv
    from memprism_ray.benchmark.ebalfred.fixture import build_fixture
    from memprism_ray.benchmark.ebalfred.fixture_format import load_transcripts
    from memprism_ray.benchmark.ebalfred.stand_in import FixturePolicy

    root = build_fixture(tmp_path / "fx", episodes_per_subset=2)
    ep = load_transcripts(root)["episodes"]["base/1"]
    truth = iter(ep["steps"])

    def vision(items):
        out = []
        for prompt, _ in items:
            boxes = next(truth)["boxes"]
            cands = json.loads(prompt.rsplit(": ", 1)[1])
            out.append(json.dumps({"entities": [{"entity": c, "bbox_2d": boxes[c]} for c in cands if c in boxes]}))
        return out

    env = EbAlfredEnv(1, EbAlfredConfig(controller="fake", fixture=str(root), frame_dir=str(tmp_path / "frames")))
    phi = EbAlfredPhi(grounding=GroundingStage(vision))
    agent = Agent(
        LocalServices(env, phi, FixturePolicy(root)),
        make_selector("no_memory"),
        AgentConfig(max_steps=30, token_counter="words"),
    )
    (res,) = agent.run([EpisodeSpec("e0", game_ref("base", 1))])
    assert res.won and res.steps == len(ep["steps"]) and res.reward == pytest.approx(1.2)
    grounding = [e.evidence["grounding"] for e in res.stream.events]
    assert all(g["status"] == "ok" and not g["rejected"] for g in grounding)
    first = grounding[0]
    assert first["boxes"] == [{"entity": "ladle", "bbox_2d": [float(v) for v in ep["steps"][0]["boxes"]["ladle"]]}]
    assert all(r["camera_visual_tokens"] > 0 for r in res.rows)


def test_composes_with_any_stage1() -> None:
    class Fixed:
        name = "fixed"

        def extract(self, raw, known_state):
            return Extraction("mug", "pick up", ())

    phi = EbAlfredPhi(Fixed())
    assert phi.extract(raw("pick up the Mug"), {}).entity == "mug" and "fixed" in phi.name


def test_llm_kind_builds_both_stages_on_one_backend() -> None:
    """phi.kind: llm on EB-ALFRED: the LLM semantic stage over the stage-1 rules, and the
    grounding stage, both on the configured backend (images only to the grounding prompt)."""
    from memprism_ray.benchmark.ebalfred.phi import EBALFRED_PHI
    from memprism_ray.recorder.phi.config import PhiConfig
    from memprism_ray.recorder.phi.factory import build_phi, phi_stats

    calls: list[tuple[str, list[bytes]]] = []

    def backend(items):
        out = []
        for prompt, images in items:
            calls.append((prompt, list(images)))
            if images:
                out.append('{"entities": [{"entity": "ladle", "bbox_2d": [10, 20, 300, 400]}]}')
            else:
                out.append(
                    '{"entity": "ladle", "act_type": "pick up", "delta_s": [{"key": "held", "new_value": "ladle"}]}'
                )
        return out

    b64 = base64.b64encode(PNG).decode()
    phi = build_phi(EBALFRED_PHI, PhiConfig(kind="llm", model="m"), complete=backend)
    assert "grounding" in phi.name
    (ex,) = phi.extract_many(
        [raw("pick up the Ladle", step=0, frame_step=1, frame_png_b64=b64, frame_changed=True)], [{}]
    )
    assert ex.evidence["phi"] == "llm" and ex.act == "pick up"
    assert ex.evidence["grounding"]["status"] == "ok"
    assert [bool(images) for _, images in calls] == [False, True]
    stats = phi_stats(phi)
    assert stats["llm"] == 1 and stats["grounding_ok"] == 1
    # the text-only pool: no grounding stage
    pool_phi = build_phi(EBALFRED_PHI, PhiConfig(kind="llm", llm_source="pool"), complete=backend)
    assert "grounding" not in pool_phi.name
