"""Checkpoints: safetensors weights + JSON config + safely loaded state; SHA-256 recorded and
checked; D1 and D2 resume bit-identically."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from memprism_ray.adapter.checkpoint import (
    capture_rng,
    checkpoint_sha256,
    load_checkpoint,
    load_model,
    read_checkpoint_meta,
    restore_rng,
    resume_trainer,
    save_checkpoint,
)
from memprism_ray.adapter.grpo_update import GRPOBatch, GRPOConfig, GRPOUpdater
from memprism_ray.adapter.sft import SFTConfig, SFTDataset, SFTTrainer
from memprism_ray.router.model import RouterConfig, ViewPolicyModel

TINY = RouterConfig(d_model=32, n_heads=4, n_layers=1, ff_dim=64, planner_hidden=64, entity_hint_dim=8)


def dataset(n: int = 40) -> SFTDataset:
    rng = np.random.default_rng(5)
    q = rng.random((n, 144)) ** 4
    q /= q.sum(1, keepdims=True)
    return SFTDataset(rng.normal(size=(n, 384)), rng.normal(size=(n, 384)), rng.random((n, 128)), rng.random((n, 8)), q)


def batch(seed: int) -> GRPOBatch:
    g = torch.Generator().manual_seed(seed)
    s = 48
    traj = torch.arange(16).repeat_interleave(3)
    rets = torch.randint(0, 2, (16,), generator=g).float()
    return GRPOBatch(
        torch.randn(s, 384, generator=g),
        torch.randn(s, 384, generator=g),
        torch.rand(s, 128, generator=g),
        torch.rand(s, 8, generator=g),
        torch.randint(0, 144, (s,), generator=g),
        -torch.rand(s, generator=g) * 5 - 0.1,
        traj,
        traj // 4,
        rets[traj],
        torch.zeros(s, dtype=torch.bool),
    )


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_sft_resume_is_bit_identical(tmp_path: Path) -> None:
    data = dataset()
    config = SFTConfig(epochs=4, lr=1e-3, batch_size=16)
    torch.manual_seed(0)
    straight = ViewPolicyModel(TINY)
    trainer = SFTTrainer(straight, data, config)
    for _ in range(4):
        trainer.train_epoch()

    torch.manual_seed(0)
    first = ViewPolicyModel(TINY)
    half = SFTTrainer(first, data, config)
    for _ in range(2):
        half.train_epoch()
    save_checkpoint(tmp_path / "ckpt", first, trainer=half, stage="d1")
    torch.manual_seed(123)  # a different process would start from another RNG state
    random.random()
    np.random.rand()
    ckpt = load_checkpoint(tmp_path / "ckpt")
    resumed = SFTTrainer(ckpt.model, data, config)
    resume_trainer(resumed, ckpt)
    assert resumed.epoch == 2 and resumed.step == 6
    while not resumed.done:
        resumed.train_epoch()
    assert_same_params(straight, ckpt.model)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in trainer.history]


def test_grpo_resume_is_bit_identical(tmp_path: Path) -> None:
    config = GRPOConfig(lr=1e-3, update_batch_size=16)
    batches = [batch(s) for s in range(4)]
    torch.manual_seed(0)
    d1 = ViewPolicyModel(TINY)
    save_checkpoint(tmp_path / "ref", d1, stage="d1")

    straight = copy.deepcopy(d1)
    trainer = GRPOUpdater(straight, copy.deepcopy(d1), config)
    stats = [trainer.update(b) for b in batches]

    model = copy.deepcopy(d1)
    half = GRPOUpdater(model, copy.deepcopy(d1), config)
    for b in batches[:2]:
        half.update(b)
    save_checkpoint(tmp_path / "it2", model, trainer=half, stage="d2")
    torch.manual_seed(99)
    ckpt = load_checkpoint(tmp_path / "it2")
    assert ckpt.meta["iteration"] == 2 and ckpt.meta["train_config_type"] == "GRPOConfig"
    resumed = GRPOUpdater(ckpt.model, load_checkpoint(tmp_path / "ref").model, config)
    resume_trainer(resumed, ckpt)
    later = [resumed.update(b) for b in batches[2:]]
    assert_same_params(straight, ckpt.model)
    assert [s["loss"] for s in later] == [s["loss"] for s in stats[2:]]
    assert resumed.iteration == 4


def test_files_hash_and_config(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    out = save_checkpoint(tmp_path / "c", model, stage="export", metrics={"sr": 0.4})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    meta = json.loads((out / "config.json").read_text())
    assert meta["weights_sha256"] == hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert meta["router_config"]["d_model"] == 32 and meta["metrics"] == {"sr": 0.4}
    assert meta["parameter_counts"] == model.parameter_counts() and not meta["has_state"]
    loaded = load_checkpoint(out)
    assert_same_params(model, loaded.model)
    assert_same_params(model, load_model(out))
    assert checkpoint_sha256(out) == meta["weights_sha256"]
    x = [torch.randn(2, d) for d in (384, 384, 128, 8)]
    torch.testing.assert_close(model.eval()(*x), loaded.model.eval()(*x), rtol=0, atol=0)
    assert not any(p.requires_grad for p in loaded.model.frozen_parameters())
    with pytest.raises(ValueError, match="weights only"):
        resume_trainer(SFTTrainer(loaded.model, dataset(4), SFTConfig(epochs=1)), loaded)


def test_tampered_weights_and_bad_files_are_rejected(tmp_path: Path) -> None:
    torch.manual_seed(0)
    out = save_checkpoint(tmp_path / "c", ViewPolicyModel(TINY))
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the recorded"):
        load_checkpoint(out)
    with pytest.raises(ValueError, match="does not match the recorded"):
        load_model(out)
    with pytest.raises(ValueError, match="does not match the recorded"):
        checkpoint_sha256(out)
    load_checkpoint(out, verify=False)  # the user may opt out explicitly
    with pytest.raises(ValueError, match=r"no config\.json"):
        read_checkpoint_meta(tmp_path)
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        read_checkpoint_meta(tmp_path / "nope")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "config.json").write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="not a memprism-router-checkpoint"):
        read_checkpoint_meta(tmp_path / "x")


class Payload:
    """Not a tensor/primitive: a weights_only load must refuse it."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("this must never run",))


def test_state_file_is_loaded_with_weights_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    trainer = SFTTrainer(model, dataset(8), SFTConfig(epochs=1, batch_size=8))
    out = save_checkpoint(tmp_path / "c", model, trainer=trainer)
    assert load_checkpoint(out).state is not None
    torch.save({"trainer": Payload(), "rng": capture_rng()}, out / "state.pt")
    with pytest.raises(ValueError, match="cannot load trainer state safely"):
        load_checkpoint(out)
    assert "this must never run" not in capsys.readouterr().out


def test_rng_capture_restore_roundtrip() -> None:
    state = capture_rng()
    a = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize("kind", ["grpo", "sft"])
def test_resume_with_a_new_lr_uses_it(tmp_path: Path, kind: str) -> None:
    """optimizer.load_state_dict restores the saved lr: the resumed trainer's config must win."""
    torch.manual_seed(0)
    model = ViewPolicyModel(TINY)
    if kind == "grpo":
        first = GRPOUpdater(model, copy.deepcopy(model), GRPOConfig(lr=1e-3, update_batch_size=16))
        first.update(batch(0))
    else:
        first = SFTTrainer(model, dataset(), SFTConfig(epochs=4, lr=1e-3, batch_size=16))
        first.train_epoch()
    save_checkpoint(tmp_path / "c", model, trainer=first)
    ckpt = load_checkpoint(tmp_path / "c")
    if kind == "grpo":
        resumed = GRPOUpdater(ckpt.model, copy.deepcopy(ckpt.model), GRPOConfig(lr=5e-4, update_batch_size=16))
    else:
        resumed = SFTTrainer(ckpt.model, dataset(), SFTConfig(epochs=4, lr=5e-4, batch_size=16))
    resume_trainer(resumed, ckpt)
    factor = first.scheduler.get_last_lr()[0] / 1e-3  # the schedule's position is kept
    assert resumed.scheduler.last_epoch == first.scheduler.last_epoch
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4 * factor)
    assert resumed.scheduler.get_last_lr()[0] == pytest.approx(5e-4 * factor)
    if kind == "grpo":
        assert resumed.update(batch(1))["lr"] == pytest.approx(5e-4)
    else:
        resumed.train_epoch()
        assert resumed.scheduler.base_lrs == [5e-4]
        assert resumed.optimizer.param_groups[0]["lr"] < 5e-4 * factor  # cosine keeps decaying from the new base


def test_a_run_directory_given_for_a_checkpoint_names_the_checkpoints_below_it(tmp_path: Path) -> None:
    """``--checkpoint runs/X`` (the run, not one of its checkpoints) said only "no config.json"."""
    model = ViewPolicyModel(TINY)
    run = tmp_path / "run"
    for it in (2, 4, 6, 8):
        save_checkpoint(run / "checkpoints" / f"iter_{it:04d}", model, stage="d2")
    save_checkpoint(run / "d1" / "abc" / "checkpoint", model, stage="d1")
    with pytest.raises(ValueError) as err:
        read_checkpoint_meta(run)
    assert str(err.value) == (
        f"{run}: no config.json; not a memprism Router checkpoint; the checkpoints below it: "
        f"{run / 'checkpoints' / 'iter_0006'}, {run / 'checkpoints' / 'iter_0008'}, "
        f"{run / 'd1' / 'abc' / 'checkpoint'} (the last 3 of 5)"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: no config\.json; not a memprism Router checkpoint$"):
        read_checkpoint_meta(tmp_path / "empty")
