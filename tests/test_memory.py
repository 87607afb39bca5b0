"""MemPrism in any agent (memprism_ray/memory.py, issue 43): a session that replays an evaluated
episode gets the evaluation's Router choices and image bytes; bad input is one ``ValueError``
naming the field, with nothing recorded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memprism_ray.benchmark import get_benchmark
from memprism_ray.memory import Memory, MemoryView


@pytest.mark.ray
@pytest.mark.slow
def test_a_session_replaying_an_evaluated_episode_sees_what_the_evaluation_showed(
    ray_session, memprism_tiny_corpus: Path, actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    from memprism_ray.config import load_config
    from memprism_ray.recorder.stream import EventStream
    from memprism_ray.trainer.evaluate import evaluate, router_state_for

    cfg = load_config(
        "configs/local.yaml",
        ["--corpus.data_root", str(memprism_tiny_corpus), "--eval.episodes", "1", "--eval.workers", "1",
         "--eval.artifacts", "1", "--eval.conditions", "memprism", "--agent.max_steps", "6",
         "--rollout.env_cpus", "0.1", "--run.out_dir", str(tmp_path), "--run.name", "replay"],
    )  # fmt: skip
    alf = get_benchmark("alfworld")
    ckpt = str(actors_reference_ckpt)
    evaluate(cfg, alf, ("memprism",), router_state_for(cfg, ckpt), ckpt, tmp_path / "eval", log=lambda *_: None)
    (episode,) = (tmp_path / "eval" / "memprism" / "episodes").iterdir()
    recorded = EventStream.from_parquet(episode / "events.parquet")
    steps = pq.read_table(episode / "steps.parquet").to_pylist()
    assert len(steps) == len(recorded) >= 3

    memory = Memory(alf.phi_spec(), checkpoint=ckpt, render=cfg.render, encoder=cfg.encoder)
    meta = json.loads((episode / "episode.json").read_text())
    session = memory.session(recorded.meta["goal"], session_id=meta["episode_id"], task_type=meta["task_type"])
    for t, (rec, row) in enumerate(zip(recorded.records, steps, strict=True)):
        view = session.view(rec.raw.o_pre)
        assert (view.step, view.index, view.view) == (t, row["view_index"], row["view"])
        assert 0.0 < view.probability <= 1.0 and view.visual_tokens == row["visual_tokens"]
        assert view.png == (episode / "views" / f"step_{t:03d}.png").read_bytes(), f"step {t}: other image bytes"
        assert view.text and view.text_tokens > 0
        raw = rec.raw
        session.record(raw.o_pre, str(raw.action), raw.feedback, raw.reward, meta=dict(raw.meta))
    assert session.stream.content_digest == recorded.content_digest  # the same events, through the same Phi


def test_bad_input_is_one_error_naming_the_field_and_records_nothing(tmp_path: Path) -> None:
    alf = get_benchmark("alfworld")
    memory = Memory(alf.phi_spec(), view="fixed:TemporalTrace", max_events=2)
    session = memory.session("put a clean mug in coffeemachine.", session_id="s1")
    first = session.view("You are in the middle of a room.")
    assert isinstance(first, MemoryView) and first.view.startswith("TemporalTrace") and first.probability == 1.0
    assert first.png is not None and first.png.startswith(b"\x89PNG") and first.visual_tokens > 0
    session.record("You are in the middle of a room.", "go to countertop 1", "On the countertop 1, you see a mug 1.")
    cases = [
        (dict(observation=3), "observation must be text"),
        (dict(action=None), "action must be text"),
        (dict(feedback="x" * 100_001), "feedback is 100001 characters"),
        (dict(reward=float("nan")), "reward must be a finite number"),
        (dict(reward=True), "reward must be a finite number"),
        (dict(image=b"GIF89a"), "image must be PNG bytes"),
        (dict(meta=["step"]), "meta must be a dict"),
    ]
    good = dict(observation="o", action="take mug 1 from countertop 1", feedback="You pick up the mug 1.")
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            session.record(**{**good, **bad})
        assert session.steps == 1  # nothing recorded
    session.record(**good)
    with pytest.raises(ValueError, match="session s1 holds 2 steps, the most one session records"):
        session.record(**good)
    assert session.steps == 2
    with pytest.raises(ValueError, match="give exactly one of checkpoint, view or marginal"):
        Memory(alf.phi_spec(), view="fixed:TemporalTrace", marginal=[1.0] * 144)
    with pytest.raises(ValueError, match="unknown"):
        Memory(alf.phi_spec(), view="fixed:NoSuchView")
    with pytest.raises(ValueError, match="name a fixed view"):
        Memory(alf.phi_spec(), view="no_memory")
    with pytest.raises(ValueError, match="the view marginal needs 144 probabilities"):
        Memory(alf.phi_spec(), marginal=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"no config\.json; not a memprism Router checkpoint"):
        Memory(alf.phi_spec(), checkpoint=tmp_path)
    with pytest.raises(ValueError, match="goal must be the task's text"):
        memory.session("  ")
    with pytest.raises(ValueError, match="session_id must be a name of 1 to 256 characters"):
        memory.session("g", session_id="")
    other = Memory(alf.phi_spec(), view="fixed:TemporalTrace").session("g")
    with pytest.raises(ValueError, match="each session must be one this Memory made"):
        memory.views([(other, "o")])
    # Records kept elsewhere (Session.records) come back checked: a KeyError and a TypeError before.
    kept = session.records()
    for bad, message in (([{"event": kept[0]["event"]}], "got ['event']"), (["x"], "got str")):
        with pytest.raises(
            ValueError,
            match=re.escape(f"record 0: expected a dict with 'raw' and 'event' (Session.records), {message}"),
        ):
            memory.restore("s2", "g", bad)
    assert memory.restore("s2", "g", kept).records() == kept


def test_a_checkpoint_that_does_not_verify_is_refused(actors_reference_ckpt: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(actors_reference_ckpt, copy)
    weights = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ValueError, match=r"does not verify: .*SHA-256"):
        Memory(get_benchmark("alfworld").phi_spec(), checkpoint=copy)


def test_a_router_used_otherwise_than_trained_is_a_warning(tmp_path: Path) -> None:
    """``Memory(phi, checkpoint=...)`` with another benchmark's Phi or another text encoder than
    the Router's checkpoint records went on silently."""
    import warnings

    import torch

    from memprism_ray.adapter.checkpoint import save_checkpoint
    from memprism_ray.router.encoder import EncoderConfig
    from memprism_ray.router.model import RouterConfig, ViewPolicyModel

    torch.manual_seed(0)
    small = RouterConfig(d_model=32, n_heads=2, n_layers=1, ff_dim=64, planner_hidden=64)
    recorded = {"corpus.benchmark": "mind2web", "encoder.model_name_or_path": None, "encoder.max_length": 256}
    ckpt = save_checkpoint(tmp_path / "c", ViewPolicyModel(small), stage="d1", extra={"config": recorded})
    with pytest.warns(UserWarning) as caught:
        Memory(get_benchmark("alfworld").phi_spec(), checkpoint=ckpt, encoder=EncoderConfig(max_length=64))
    assert [str(w.message) for w in caught] == [
        f"the Router {ckpt} was trained on mind2web; this use is alfworld",
        f"the Router {ckpt} was trained with encoder.max_length 256; this use encodes with 64: its features differ "
        "from its training's",
    ]
    assert caught[0].filename == __file__  # pointed at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as trained: no warning
        Memory(get_benchmark("mind2web").phi_spec(), checkpoint=ckpt)


def test_a_run_directory_given_as_the_checkpoint_names_its_checkpoints(
    actors_reference_ckpt: Path, tmp_path: Path
) -> None:
    """``Memory(checkpoint=<a run directory>)`` said "not a Router checkpoint (no config.json)",
    and so did a path that does not exist; the evaluation names the checkpoints below a run."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(actors_reference_ckpt, run / "checkpoints" / "iter_0002")
    with pytest.raises(ValueError, match=r"no config.json; .*the checkpoints below it: .*checkpoints/iter_0002"):
        Memory(get_benchmark("alfworld").phi_spec(), checkpoint=run)
    with pytest.raises(ValueError, match=r"^checkpoint .*missing: no such directory$"):
        Memory(get_benchmark("alfworld").phi_spec(), checkpoint=tmp_path / "missing")


def test_an_llm_phi_that_fails_is_said_once_a_session_and_counted() -> None:
    """``Memory(phi_config=PhiConfig(kind="llm", ...))`` whose endpoint fails records each step by
    the rules (the evidence says why), which a library user was never told."""
    import socket
    import warnings

    from memprism_ray.recorder.phi.config import PhiConfig

    with socket.socket() as s:  # nobody listens: every request refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = PhiConfig(kind="llm", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    memory = Memory(get_benchmark("alfworld").phi_spec(), view="fixed:TemporalTrace", phi_config=cfg)
    session = memory.session("put a clean mug in coffeemachine.", session_id="s1")
    with pytest.warns(UserWarning) as caught:
        for step in range(3):
            session.record(f"You are in the middle of a room {step}.", "go to countertop 1", "You see a mug 1.")
    assert len(caught) == 1 and caught[0].filename == __file__
    assert str(caught[0].message).startswith("session s1: 1 step by the rules after an LLM failure (first: request ")
    assert session.phi_fallbacks == 3 and session.steps == 3
    rules = Memory(get_benchmark("alfworld").phi_spec(), view="fixed:TemporalTrace").session("g")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rule Phi: nothing to say
        rules.record("o", "go to countertop 1", "You see a mug 1.")
    assert rules.phi_fallbacks == 0
