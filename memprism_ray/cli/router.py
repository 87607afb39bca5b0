"""``memprism router``: inspect, create and D1-train Router checkpoints (paper: "Router",
"Adapter"; appendix A.2 checkpoints and hashes, A.4 D1 settings).

    memprism router info CKPT [--json]          parameter counts per group, SHA-256, settings
    memprism router init OUT [--seed 7]         a freshly initialised ViewPolicyModel
    memprism router sft DATA.parquet OUT        D1 on a labelled dataset (Table A.4 presets)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from memprism_ray.benchmark import get_benchmark
from memprism_ray.config_tree import seed_arg
from memprism_ray.registry import DEFAULT_BENCHMARK, known_benchmarks


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("router", help="inspect, create and D1-train Router checkpoints")
    sub = parser.add_subparsers(dest="router_command", metavar="ACTION")

    info = sub.add_parser("info", help="parameter counts per group and the weight hash of a checkpoint")
    info.add_argument("checkpoint", help="checkpoint directory (config.json + model.safetensors)")
    info.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    info.set_defaults(func=_info)

    init = sub.add_parser("init", help="write a freshly initialised ViewPolicyModel checkpoint")
    init.add_argument("out", help="output checkpoint directory")
    init.add_argument("--seed", type=seed_arg, default=7, help="torch seed of the initial weights (default 7)")
    init.set_defaults(func=_init)

    sft = sub.add_parser("sft", help="D1: train on a labelled Parquet dataset (KL to the teacher + cost)")
    sft.add_argument("dataset", help="Parquet file of an SFTDataset (D1 writes <run>/d1/<key>/labels.parquet)")
    sft.add_argument("out", help="output checkpoint directory (saved after every epoch; resumable)")
    rows = [get_benchmark(name).table_a4_row for name in known_benchmarks()]
    sft.add_argument(
        "--preset", default=get_benchmark(DEFAULT_BENCHMARK).table_a4_row, help=f"Table A.4 D1 row: {', '.join(rows)}"
    )
    sft.add_argument("--init", dest="init_ckpt", help="start from this checkpoint instead of a fresh model")
    sft.add_argument("--epochs", type=int, help="override the preset's epochs")
    sft.add_argument("--batch-size", type=int, help="override the batch size (256)")
    sft.add_argument("--lambda-cost", type=float, help="override lambda_cost")
    sft.add_argument("--resume", action="store_true", help="continue the run saved in OUT")
    sft.set_defaults(func=_sft)

    parser.set_defaults(func=lambda args: parser.print_help() or 2)


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """What ``router info`` prints, as a dict (counts read from the weight file itself)."""
    from safetensors import SafetensorError, safe_open

    from memprism_ray.adapter.checkpoint import read_checkpoint_meta, router_config_of, verify_weights
    from memprism_ray.router.model import parameter_group_of

    root = Path(path)
    meta = read_checkpoint_meta(root)
    router_config = router_config_of(root, meta)  # a checkpoint without one is an error, not "None"
    digest = verify_weights(root, meta)
    counts = {"encoder": 0, "planner": 0, "entity_hint": 0}
    weights = root / meta.get("weights_file", "model.safetensors")
    try:
        with safe_open(str(weights), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                counts[parameter_group_of(key)] += math.prod(int(d) for d in fh.get_slice(key).get_shape())
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{weights}: not a readable safetensors file ({exc})") from None
    counts["total"] = sum(counts.values())
    return {
        "checkpoint": str(root),
        "stage": meta.get("stage"),
        "iteration": meta.get("iteration"),
        "weights_sha256": digest,
        "hash_verified": True,
        "parameter_counts": counts,
        "router_config": router_config,
        "train_config_type": meta.get("train_config_type"),
        "train_config": meta.get("train_config"),
        "resumable": bool(meta.get("has_state")) and (root / "state.pt").exists(),
        "metrics": meta.get("metrics", {}),
    }


def _info(args: argparse.Namespace) -> int:
    info = checkpoint_info(args.checkpoint)
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    c = info["parameter_counts"]
    rc = info["router_config"]
    print(f"checkpoint   {info['checkpoint']}")
    print(f"stage        {info['stage']} (iteration {info['iteration']})")
    print(f"sha256       {info['weights_sha256']} (model.safetensors, matches config.json)")
    print(f"encoder      {c['encoder']:>12,d} parameters (trained by D1)")
    print(f"planner      {c['planner']:>12,d} parameters (trained by D1 and D2)")
    print(f"entity_hint  {c['entity_hint']:>12,d} parameters (frozen)")
    print(f"total        {c['total']:>12,d} parameters")
    print(
        f"architecture d_model {rc.get('d_model')}, {rc.get('n_layers')} layers x {rc.get('n_heads')} heads, "
        f"ff {rc.get('ff_dim')}, planner {rc.get('planner_blocks')}x{rc.get('planner_hidden')}, "
        f"dropout {rc.get('dropout')}"
    )
    tc = info["train_config"]
    if tc:
        print(f"training     {info['train_config_type']} preset {tc.get('preset_name')}")
    print(f"resumable    {'yes' if info['resumable'] else 'no (weights only)'}")
    for k, v in sorted((info["metrics"] or {}).items()):
        print(f"metric       {k} = {v}")
    return 0


def _fresh_out(out: Path, resume: str = "") -> Path:
    """``out`` for a new checkpoint: never a file, never a checkpoint already there (``router
    init`` overwrote a trained Router with fresh weights); checked before any work."""
    from memprism_ray.cli import CliError

    if out.exists() and not out.is_dir():
        raise CliError(f"OUT {out} is a file, not a checkpoint directory: choose a new OUT")
    if (out / "config.json").exists():
        raise CliError(f"{out} already holds a checkpoint; {resume}choose a new OUT")
    return out


def _check_resumed_sft(out: Path, meta: dict[str, Any], data: dict[str, str], settings: dict[str, Any]) -> None:
    """``router sft --resume`` goes on only as the run in ``out`` was trained: on the same dataset
    (its SHA-256) with the same settings but ``epochs`` (a longer run may continue a shorter one);
    it went on silently on another dataset or ``lambda_cost``, a model of neither run."""
    from memprism_ray.cli import CliError

    recorded = meta.get("extra") or {}
    fresh = f"start a new OUT from these weights with --init {out}"
    if recorded.get("dataset_sha256", data["dataset_sha256"]) != data["dataset_sha256"]:
        raise CliError(
            f"--resume {out}: it was trained on {recorded.get('dataset')} (sha256 {recorded['dataset_sha256'][:12]}), "
            f"and {data['dataset']} is another dataset (sha256 {data['dataset_sha256'][:12]}): resume with that "
            f"dataset, or {fresh}"
        )
    was = meta.get("train_config") or {}
    changed = [f"{k} {was[k]!r} -> {v!r}" for k, v in settings.items() if k != "epochs" and k in was and was[k] != v]
    if changed:
        raise CliError(
            f"--resume {out}: its settings differ from this run's ({', '.join(changed)}): resume with the same "
            f"--preset/--batch-size/--lambda-cost (only --epochs may change), or {fresh}"
        )


def _init(args: argparse.Namespace) -> int:
    import torch

    from memprism_ray.adapter.checkpoint import save_checkpoint
    from memprism_ray.router.model import RouterConfig, ViewPolicyModel

    _fresh_out(Path(args.out))
    torch.manual_seed(args.seed)
    model = ViewPolicyModel(RouterConfig())
    out = save_checkpoint(args.out, model, stage="init", extra={"seed": args.seed})
    print(f"wrote {out} ({model.parameter_counts()['total']:,d} parameters)")
    return 0


def _sft(args: argparse.Namespace) -> int:
    import torch

    from memprism_ray.adapter.checkpoint import load_checkpoint, resume_trainer, save_checkpoint
    from memprism_ray.adapter.sft import SFTDataset, SFTTrainer, train_sft
    from memprism_ray.benchmark import sft_preset
    from memprism_ray.cli import CliError
    from memprism_ray.io_atomic import sha256_file
    from memprism_ray.router.model import RouterConfig, ViewPolicyModel

    overrides = {k: getattr(args, k) for k in ("epochs", "batch_size", "lambda_cost") if getattr(args, k) is not None}
    config = sft_preset(args.preset, **overrides)
    dataset = SFTDataset.read_parquet(args.dataset)
    data = {"dataset": str(args.dataset), "dataset_sha256": sha256_file(args.dataset)}
    out = Path(args.out)
    if args.resume:
        ckpt = load_checkpoint(out)
        if ckpt.state is None:
            raise CliError(f"{out} holds no trainer state; cannot --resume")
        _check_resumed_sft(out, ckpt.meta, data, config.to_dict())
        model = ckpt.model
        trainer = SFTTrainer(model, dataset, config)
        resume_trainer(trainer, ckpt)
    else:
        _fresh_out(out, "pass --resume to continue it or ")
        if args.init_ckpt:
            model = load_checkpoint(args.init_ckpt).model
        else:
            torch.manual_seed(config.seed)
            model = ViewPolicyModel(RouterConfig())
        trainer = SFTTrainer(model, dataset, config)

    def save(tr: SFTTrainer, metrics: dict[str, float]) -> None:
        save_checkpoint(out, model, trainer=tr, stage="d1", metrics=metrics, extra=data)
        print(f"epoch {tr.epoch}/{config.epochs} loss {metrics['loss']:.4f} kl {metrics['kl']:.4f} -> {out}")

    result = train_sft(model, dataset, config, on_epoch=save, trainer=trainer)
    print(f"D1 done: {result['epochs']} epochs, {result['steps']} steps, final loss {result['final']['loss']:.4f}")
    return 0
