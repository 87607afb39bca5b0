"""Task-policy settings (paper "Experiment Setup": frozen Qwen2.5-VL-7B-Instruct task
policy, greedy decoding at evaluation; appendix C: decoding settings go into the run
manifest; notes: 672x672 pixel cap per image).

A replica with ``gpus_per_replica > 0`` always asks Ray for its GPUs, whatever nodes have joined,
so the autoscaler provisions them; a CPU pool is said in the config, never a silent fallback."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from memprism_ray.config_tree import Seed, check_device, coerce_settings, field
from memprism_ray.llm_client import EndpointConfig
from memprism_ray.policy.tokens import VISUAL_TOKEN_FAMILIES

BACKENDS: tuple[str, ...] = ("vllm", "openai", "hf", "scripted")
DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
MAX_PIXELS_672 = 672 * 672
VLLM_LOAD_FORMATS: tuple[str, ...] = ("auto", "safetensors", "pt", "dummy")
#: Backends whose model lives in the policy pool's replicas (docs/gpu.md): a rollout,
#: labelling or evaluation worker never builds one itself.
POOL_BACKENDS: tuple[str, ...] = ("vllm", "hf")
#: vllm.LLM's ``dtype`` values (vLLM 0.24 ``vllm.config.model.ModelDType``): checked at load, not
#: when the replica starts its engine on a GPU node, after D1 and a fleet have run.
VLLM_DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")
#: vLLM 0.24's LLM-class scheduler defaults on a GPU of 70 GiB or more (EngineArgs.get_batch_defaults).
VLLM_MAX_NUM_BATCHED_TOKENS = 16384
VLLM_MAX_NUM_SEQS = 1024
#: ``policy.prompt_layout``: the paper's order, or the shared instructions first (policy/prompts.py).
PROMPT_LAYOUTS: tuple[str, ...] = ("paper", "instructions_first")


@dataclass
class Decoding:
    """The decoding every model backend shares (greedy at evaluation, the paper's "Experiment
    Setup"; the 672x672 pixel cap per image); a backend names its section in ``SECTION``."""

    SECTION: ClassVar[str] = "policy"

    temperature: float = field(0.0, help="sampling temperature; 0 = greedy")
    top_p: float = field(1.0, help="nucleus sampling mass (ignored when greedy)")
    max_tokens: int = field(512, help="most generated tokens per decision")
    min_pixels: int = field(3136, help="image processor min_pixels (Qwen2.5-VL default; openai: the server's)")
    max_pixels: int = field(MAX_PIXELS_672, help="image processor max_pixels (openai: the server's)")

    def check_decoding(self) -> None:
        s = self.SECTION
        if not self.temperature >= 0:  # also catches nan
            raise ValueError(f"{s}.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:  # vLLM's SamplingParams refused it on the GPU node, mid-run
            raise ValueError(f"{s}.top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"{s}.max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_pixels < 1 or self.max_pixels < self.min_pixels:
            raise ValueError(f"{s}: need 1 <= min_pixels <= max_pixels, got {self.min_pixels} and {self.max_pixels}")


@dataclass
class VLLMConfig(Decoding):
    """vLLM offline engine (``vllm.LLM``) for Qwen2.5-VL-style models."""

    SECTION: ClassVar[str] = "policy.vllm"

    model: str = field(DEFAULT_MODEL, help="model id or local path given to vllm.LLM")
    max_model_len: int = field(16384, help="context length the engine plans for")
    gpu_memory_utilization: float = field(0.85, help="fraction of GPU memory vLLM may take")
    tensor_parallel_size: int = field(1, help="GPUs one engine shards the model over")
    limit_mm_per_prompt: int = field(2, help="most images per prompt (EB-ALFRED sends camera + view)")
    seed: Seed = field(0, help="engine and sampling seed")
    chat_template: str = field("model", help="'model' = the checkpoint's chat template, 'qwen2_vl' = built-in")
    dtype: str = field("auto", help="weight dtype passed to vllm.LLM: auto, half, float16, bfloat16, float, float32")
    enforce_eager: bool = field(False, help="disable CUDA graphs (slower, less memory)")
    visual_token_family: str = field("qwen2.5-vl", help="rule used to count visual tokens")
    tokenizer: str = field("", help="tokenizer id or path ('' : the model's)")
    load_format: str = field("auto", help="vLLM load_format; 'dummy' = random weights from the config (GPU proofs)")
    # Explicit, not vLLM's defaults: those depend on the usage context (vLLM 0.24,
    # EngineArgs.get_batch_defaults): vllm.LLM gets 16,384 tokens and 1,024 sequences a step on
    # a GPU of 70 GiB or more, AsyncLLM.from_engine_args (the replica's engine) 2,048 and 128,
    # about one 1,400-token view prompt's prefill a step (issue 31; docs/gpu.md).
    max_num_seqs: int = field(
        VLLM_MAX_NUM_SEQS, help="most sequences per engine step (0: vLLM's default for the usage context)"
    )
    max_num_batched_tokens: int = field(
        VLLM_MAX_NUM_BATCHED_TOKENS,
        help="token budget per engine step, also vLLM's encoder budget for view images (0: vLLM's default)",
    )
    enable_prefix_caching: bool = field(True, help="share the KV cache of identical prompt prefixes")
    ignore_eos: bool = field(False, help="benchmarks: every completion runs to max_tokens (random weights)")
    frontend_threads: int = field(
        0,
        help="threads that decode view PNGs and build chat prompts off the replica's event loop (0: on the loop)",
    )

    def __post_init__(self) -> None:
        self.check_decoding()
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"policy.vllm.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1 or self.limit_mm_per_prompt < 1 or self.max_model_len < 1:
            raise ValueError("policy.vllm.tensor_parallel_size, limit_mm_per_prompt and max_model_len must be >= 1")
        if self.chat_template not in ("model", "qwen2_vl"):
            raise ValueError(f"policy.vllm.chat_template must be 'model' or 'qwen2_vl', got {self.chat_template!r}")
        if self.visual_token_family not in VISUAL_TOKEN_FAMILIES:
            raise ValueError(f"policy.vllm.visual_token_family must be one of {VISUAL_TOKEN_FAMILIES}")
        if self.dtype not in VLLM_DTYPES:
            raise ValueError(f"policy.vllm.dtype must be one of {', '.join(VLLM_DTYPES)}, got {self.dtype!r}")
        if self.load_format not in VLLM_LOAD_FORMATS:
            raise ValueError(
                f"policy.vllm.load_format must be one of {', '.join(VLLM_LOAD_FORMATS)}, got {self.load_format!r}"
            )
        if self.max_num_seqs < 0 or self.max_num_batched_tokens < 0:
            raise ValueError(
                "policy.vllm.max_num_seqs and policy.vllm.max_num_batched_tokens must be >= 0 (0: vLLM's default)"
            )
        if 0 < self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this at engine start, a minute later and on the GPU node.
            raise ValueError(
                f"policy.vllm.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"policy.vllm.max_num_seqs ({self.max_num_seqs}): every running sequence needs a token of the "
                "step's budget"
            )
        if self.frontend_threads < 0:
            raise ValueError(
                f"policy.vllm.frontend_threads must be >= 0 (0: on the event loop), got {self.frontend_threads}"
            )


@dataclass
class OpenAIConfig(EndpointConfig, Decoding):
    """Any OpenAI-compatible chat endpoint (e.g. ``vllm serve``) and the decoding of each decision."""

    SECTION: ClassVar[str] = "policy.openai"

    model: str = field(DEFAULT_MODEL, help="model name sent in each request")
    max_retries: int = field(
        4, help="retries after a timeout, connection error, HTTP 408/409/429/5xx or a reply that is no chat completion"
    )
    seed: Seed | None = field(0, help="per-request seed sent to the server (None: not sent)")
    max_concurrency: int = field(8, help="requests of one batch in flight at once")
    png_compress_level: int = field(1, help="zlib level of the PNG images sent (1 = fast)")
    visual_token_family: str = field("qwen2.5-vl", help="rule used to count visual tokens")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_decoding()
        if self.max_concurrency < 1:
            raise ValueError(f"policy.openai.max_concurrency must be >= 1, got {self.max_concurrency}")
        if not 0 <= self.png_compress_level <= 9:
            raise ValueError(f"policy.openai.png_compress_level must be 0..9, got {self.png_compress_level}")
        if self.visual_token_family not in VISUAL_TOKEN_FAMILIES:
            raise ValueError(f"policy.openai.visual_token_family must be one of {VISUAL_TOKEN_FAMILIES}")


@dataclass
class HFConfig(Decoding):
    """transformers on CPU or GPU from a local model directory (no downloads)."""

    SECTION: ClassVar[str] = "policy.hf"

    model_path: str = field("", help="local directory with config, weights, tokenizer and processor files")
    device: str = field("auto", help="'auto' (cuda if available), 'cpu', 'cuda' or 'cuda:N'")
    dtype: str = field("auto", help="'auto', 'float32', 'bfloat16' or 'float16'")
    seed: Seed = field(0, help="sampling seed (each call reseeds with seed + call index)")
    batch_size: int = field(8, help="inputs per generate call")
    trust_remote_code: bool = field(False, help="allow model code from the checkpoint directory (off: safer)")

    def __post_init__(self) -> None:
        self.check_decoding()
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"policy.hf.dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        check_device(self.device, "policy.hf.device", auto=True)
        if self.batch_size < 1:
            raise ValueError(f"policy.hf.batch_size must be >= 1, got {self.batch_size}")


@dataclass
class ScriptedSettings:
    """The keys ``policy.scripted`` accepts (``ScriptedPolicy``'s defaults apply to the others)."""

    temperature: float = field(1.0, help="softmax temperature over the scored actions; 0 = greedy")
    seed: Seed = field(0, help="sampling seed (combined with the episode id and step)")
    ebalfred_fixture: str = field("", help="EB-ALFRED fixture the stand-in replays (set by the EB-ALFRED jobs)")
    ebalfred_epsilon: float = field(0.2, help="EB-ALFRED stand-in: probability of a random skill per step")

    def __post_init__(self) -> None:
        if not 0.0 <= self.ebalfred_epsilon <= 1.0:
            raise ValueError(f"policy.scripted.ebalfred_epsilon must be in [0, 1], got {self.ebalfred_epsilon}")
        if not self.temperature >= 0:
            raise ValueError(f"policy.scripted.temperature must be >= 0 (0 = greedy), got {self.temperature}")


@dataclass
class PolicyConfig:
    """Which task policy runs, and each backend's settings."""

    backend: str = field("scripted", help="task-policy backend: vllm, openai, hf or scripted")
    num_replicas: int = field(
        1, help="policy replicas in the Ray policy pool (vllm, hf: >= 1; 0: openai/scripted in each worker)"
    )
    gpus_per_replica: float = field(
        0.0, help="GPUs each replica asks Ray for, even before a GPU node joined (0: a CPU replica; not for vllm)"
    )
    resources: dict[str, float] = field(
        default_factory=dict, help="custom Ray resources per replica, e.g. {vllm: 1} (clusters/ advertise it)"
    )
    max_concurrency: int = field(1024, help="requests one replica serves at once (async actor concurrency)")
    group_ttl_s: float = field(600.0, help="a group with no request for this long no longer counts as replica load")
    prompt_layout: str = field(
        "paper",
        help="ALFWorld prompt order: paper (view image, then instructions) or instructions_first (beyond the "
        "paper: the shared instructions lead, so vLLM's prefix cache shares them; vllm backend only)",
    )
    vllm: VLLMConfig = field(default_factory=VLLMConfig, help="vLLM offline engine settings")
    openai: OpenAIConfig = field(default_factory=OpenAIConfig, help="OpenAI-compatible endpoint settings")
    hf: HFConfig = field(default_factory=HFConfig, help="transformers backend settings")
    scripted: dict[str, Any] = field(
        default_factory=dict, help="keyword settings of the scripted policy", schema=ScriptedSettings
    )

    def __post_init__(self) -> None:
        # Typed like every other setting even when built in code: '0.5' -> 0.5, -1 rejected.
        self.scripted = coerce_settings(ScriptedSettings, self.scripted, "policy.scripted")
        if self.backend not in BACKENDS:
            raise ValueError(f"policy.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.num_replicas < 0:
            raise ValueError(f"policy.num_replicas must be >= 0, got {self.num_replicas}")
        if self.gpus_per_replica < 0:
            raise ValueError(f"policy.gpus_per_replica must be >= 0, got {self.gpus_per_replica}")
        resources, bad = {}, {}
        for k, v in self.resources.items():
            try:
                resources[str(k)] = float(v)  # CLI overrides arrive as strings
            except (TypeError, ValueError):
                bad[k] = v
                continue
            if not resources[str(k)] > 0:
                bad[k] = v
        self.resources = resources
        if bad:
            raise ValueError(f"policy.resources values must be positive numbers, got {bad}")
        if self.max_concurrency < 1 or self.group_ttl_s <= 0:
            raise ValueError("policy.max_concurrency must be >= 1 and policy.group_ttl_s > 0")
        if self.prompt_layout not in PROMPT_LAYOUTS:
            raise ValueError(
                f"policy.prompt_layout must be one of {', '.join(PROMPT_LAYOUTS)}, got {self.prompt_layout!r}"
            )
        if self.prompt_layout != "paper" and self.backend != "vllm":
            raise ValueError(
                f"policy.prompt_layout={self.prompt_layout} is implemented for policy.backend=vllm only, got "
                f"backend {self.backend}; set policy.prompt_layout: paper"
            )
        if self.backend in POOL_BACKENDS and self.num_replicas < 1:
            # D1 labelling and the evaluation refused it when they first asked the pool, after
            # the reference trajectories had been played.
            raise ValueError(
                f"policy.backend={self.backend} runs in the Ray policy pool: policy.num_replicas must be >= 1, "
                f"got {self.num_replicas}"
            )
        if self.backend == "vllm" and self.gpus_per_replica <= 0:
            raise ValueError("policy.backend=vllm needs policy.gpus_per_replica > 0 (vLLM has no CPU build)")
        tp = self.vllm.tensor_parallel_size
        if self.backend == "vllm" and tp > 1 and self.gpus_per_replica < tp:
            # A fraction is fine for one GPU (vLLM sizes itself by gpu_memory_utilization),
            # not for a replica sharded over several.
            raise ValueError(
                f"policy.backend=vllm needs gpus_per_replica >= vllm.tensor_parallel_size ({tp}), "
                f"got {self.gpus_per_replica}"
            )
        if self.backend in ("openai", "scripted") and self.gpus_per_replica > 0:
            raise ValueError(
                f"policy.backend={self.backend} uses no GPU, so policy.gpus_per_replica must be 0, "
                f"got {self.gpus_per_replica}"
            )
        if self.backend == "hf" and self.hf.device.startswith("cuda") and self.gpus_per_replica <= 0:
            raise ValueError(f"policy.hf.device={self.hf.device} needs policy.gpus_per_replica > 0 in the Ray pool")
        if self.backend == "hf" and not self.hf.model_path:
            raise ValueError("policy.backend=hf needs policy.hf.model_path (a local model directory)")

    def unavailable_here(self) -> str | None:
        """Why the selected backend cannot run in this process, or ``None``: a one-line error for
        a job to raise before any work. Call it only where the policy will run."""
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            return (
                "policy.backend=vllm needs vLLM, which is not importable here: install it on a GPU machine "
                "(clusters/node_setup.sh install gpu, or docker/Dockerfile.gpu; see clusters/README.md) or pick "
                "another backend (--policy.backend openai|hf|scripted)"
            )
        if self.backend == "hf" and not Path(self.hf.model_path).is_dir():
            return (
                f"policy.hf.model_path {self.hf.model_path!r} is not a local model directory here; "
                "point it at one or pick another backend (--policy.backend vllm|openai|scripted)"
            )
        return None

    def replica_options(self, cpus: float) -> dict[str, Any]:
        """Ray actor options of one replica. Never depends on what has joined the cluster: a
        pending GPU request is what makes the autoscaler add a GPU node."""
        opts: dict[str, Any] = {"num_cpus": cpus, "max_concurrency": self.max_concurrency}
        if self.gpus_per_replica > 0:
            opts["num_gpus"] = self.gpus_per_replica
        if self.resources:
            opts["resources"] = {k: float(v) for k, v in self.resources.items()}
        return opts

    def decoding(self) -> dict[str, Any]:
        """The decoding settings of the selected backend, for the run manifest."""
        if self.backend == "scripted":
            return {"backend": "scripted", **self.scripted}
        cfg = getattr(self, self.backend)
        keys = ("temperature", "top_p", "max_tokens", "seed", "min_pixels", "max_pixels")
        out = {"backend": self.backend, **{k: getattr(cfg, k) for k in keys}}
        out["model"] = cfg.model_path if self.backend == "hf" else cfg.model
        if self.prompt_layout != "paper":  # manifests of the paper's layout stay as they were
            out["prompt_layout"] = self.prompt_layout
        return out
