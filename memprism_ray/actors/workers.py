"""The stage actors: environments, Phi extractors, view composer/renderers and task-policy
replicas (docs/architecture.md "Distributed rollout"; docs/gpu.md for the policy pool), thin
shells around core objects. A call covers a whole batch so the per-call overhead is paid once
per decision step, not per trajectory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.actors.wire import PolicyRequest, from_request
from memprism_ray.agent import each_request
from memprism_ray.cluster.node_data import node_place, on_this_node
from memprism_ray.envs.base import GameRef, Observation, Transition
from memprism_ray.policy.base import PolicyInput, PolicyOutput
from memprism_ray.recorder.events import RawEvent
from memprism_ray.recorder.phi.base import Extraction
from memprism_ray.views import DeltaViewRequest, RenderedView

if TYPE_CHECKING:
    from memprism_ray.benchmark import Benchmark
    from memprism_ray.cluster.node_data import NodeData
    from memprism_ray.config import ExperimentConfig
    from memprism_ray.policy.config import PolicyConfig
    from memprism_ray.recorder.phi.config import PhiConfig
    from memprism_ray.render.config import RenderConfig


@ray.remote(max_restarts=3, max_task_retries=0)
class EnvWorker:
    """Many game slots of one benchmark in one process (fractional CPUs). After a restart the
    slots are empty; the trajectories that were running there are reported failed."""

    def __init__(self, num_slots: int, benchmark: Benchmark, options: dict[str, Any] | None = None) -> None:
        self.env = benchmark.make_env(num_slots, options)
        self._crash_after: int | None = None

    def inject_crash(self, after_steps: int) -> None:
        """Fault injection: the process exits abruptly during the ``after_steps``-th later ``step``."""
        self._crash_after = after_steps

    def reset(self, requests: Sequence[tuple[int, dict[str, Any]]]) -> list[Observation | BaseException]:
        return each_request(lambda r: self.env.reset(GameRef.from_dict(r[1]), slot=r[0]), requests)

    def step(self, requests: Sequence[tuple[int, str]]) -> list[Transition | BaseException]:
        if self._crash_after is not None:
            self._crash_after -= 1
            if self._crash_after <= 0:
                os._exit(1)
        return each_request(lambda r: self.env.step(r[1], slot=r[0]), requests)

    def pid(self) -> int:
        return os.getpid()


@ray.remote(max_restarts=3, max_task_retries=1)
class PhiWorker:
    """Runs the configured Phi over a batch of raw events (stateless, so retries are safe; an
    LLM Phi has the whole batch in flight at once, docs/phi.md)."""

    def __init__(
        self,
        benchmark: Benchmark,
        phi_config: PhiConfig | None = None,
        pool: list[Any] | None = None,
        key: str = "phi",
        timeout_s: float = 300.0,
    ) -> None:
        from memprism_ray.actors.services import build_actor_phi

        self.phi = build_actor_phi(benchmark, phi_config, pool, timeout_s=timeout_s, key=key)
        self.key = key

    def __repr__(self) -> str:
        return f"phi-worker {getattr(self, 'key', '?')}"

    def placed(self) -> dict[str, Any]:
        """Where this worker runs (``cluster.json``)."""
        return node_place()

    def extract(self, raws: Sequence[RawEvent], states: Sequence[dict[str, str]]) -> list[Extraction | BaseException]:
        from memprism_ray.recorder.phi.factory import extract_each

        return extract_each(self.phi, raws, states)

    def stats(self) -> dict[str, Any]:
        from memprism_ray.recorder.phi.factory import phi_stats

        return phi_stats(self.phi)


@ray.remote(max_restarts=3, max_task_retries=1)
class ViewWorker:
    """Compose + render from stream deltas: the worker keeps a replica of each stream it is
    sent (``views.StreamReplicas``) and receives only the records appended since; identical
    views of a group are drawn once (a content-addressed cache). Images travel as PNG."""

    def __init__(self, render_config: RenderConfig | None = None, cache_size: int = 2048) -> None:
        from memprism_ray.views import ViewService

        self.service = ViewService(render_config, cache_size=cache_size, encode_png=True)

    def __repr__(self) -> str:
        service = getattr(self, "service", None)
        return f"view-worker: {len(service.replicas) if service else 0} streams held"

    def placed(self) -> dict[str, Any]:
        """Where this worker runs (``cluster.json``)."""
        return node_place()

    def render_deltas(self, requests: Sequence[DeltaViewRequest]) -> list[RenderedView | BaseException]:
        return self.service.render_deltas(requests)

    def stats(self) -> dict[str, int]:
        replicas = self.service.replicas
        return {**self.service.stats(), "replicas": len(replicas), "resyncs": replicas.resyncs}


@ray.remote(max_restarts=3, max_task_retries=0)
class PolicyReplica:
    """One replica of the frozen task policy, serving many callers at once (docs/gpu.md); the
    only place a Ray job builds a vLLM engine. An async actor: with ``backend: vllm`` every
    caller's decision is its own engine request, so vLLM batches across callers; other backends
    run one batch at a time in a worker thread. View PNGs are decoded in the async policy's
    front end, so the event loop is not busy decoding 128 images while outputs wait (issue 31).
    ``engine_factory`` (a picklable ``VLLMConfig -> engine``) replaces vLLM's engine in tests.
    """

    @on_this_node  # the scripted stand-in's fixture, as this node has it
    def __init__(
        self,
        policy_config: PolicyConfig,
        engine_factory: Any = None,
        data: NodeData | None = None,
        benchmark: Benchmark | None = None,
    ) -> None:
        import asyncio

        from memprism_ray.policy.pool import GroupLoads

        self.config = policy_config
        self.loads = GroupLoads(policy_config.group_ttl_s)
        self.async_policy: Any = None
        self.policy: Any = None
        if benchmark is None:  # a replica started on its own (tests, benchmarks/): the default benchmark's
            from memprism_ray.benchmark import get_benchmark
            from memprism_ray.registry import DEFAULT_BENCHMARK

            benchmark = get_benchmark(DEFAULT_BENCHMARK)
        contract = benchmark.task_contract()  # the prompt and parser of the job's benchmark
        if policy_config.backend == "vllm":
            from memprism_ray.policy.vllm_async import AsyncVLLMPolicy

            engine = engine_factory(policy_config.vllm) if engine_factory is not None else None
            self.async_policy = AsyncVLLMPolicy(
                policy_config.vllm, contract, engine=engine, prompt_layout=policy_config.prompt_layout
            )
        else:
            from memprism_ray.policy.factory import make_policy

            self.policy = make_policy(policy_config, contract)
        self._sync_lock = asyncio.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    def __repr__(self) -> str:
        backend = getattr(getattr(self, "config", None), "backend", "?")
        return f"policy-replica ({backend}): {getattr(self, 'in_flight', 0)} requests in flight"

    async def _decode(self, req: PolicyRequest) -> PolicyInput:
        """The request's input with its view image decoded; the PNG reference is awaited, never
        a blocking ``ray.get`` in the event loop."""
        import functools

        if req.png_ref is not None:
            req = replace(req, png=await req.png_ref, png_ref=None)
        if self.async_policy is None:
            return from_request(req)
        return await self.async_policy.offload("decode", functools.partial(from_request, req))

    @contextlib.contextmanager
    def _serving(self, group: str, n: int) -> Any:
        """Counts ``n`` requests of ``group`` in flight (and towards the group's load) meanwhile."""
        if group:
            self.loads.touch(group, n)
        self.in_flight += n
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= n

    async def act(
        self, requests: Sequence[PolicyRequest], group: str = "", max_tokens: int | None = None
    ) -> list[PolicyOutput | BaseException]:
        """One result per request, in order; a failure is that request's value.
        ``max_tokens`` overrides the completion length for this call (benchmarks; vllm only)."""
        import asyncio

        self.calls += 1
        with self._serving(group, len(requests)):
            inputs = await asyncio.gather(*(self._decode(r) for r in requests), return_exceptions=True)
            ok = [i for i, x in enumerate(inputs) if not isinstance(x, BaseException)]
            results: list[Any] = list(inputs)
            if ok:
                good = [inputs[i] for i in ok]
                if self.async_policy is not None:
                    outs = await self.async_policy.act(good, tag=group, max_tokens=max_tokens)
                else:
                    async with self._sync_lock:  # the sync backends are not thread-safe
                        try:
                            outs = list(await asyncio.to_thread(self.policy.act, good))
                        except Exception as exc:
                            outs = [exc] * len(good)
                if len(outs) != len(good):  # a short or long answer fails its requests, never pairs wrongly
                    outs = [
                        RuntimeError(f"task policy returned {len(outs)} result(s) for {len(good)} request(s)")
                    ] * len(good)
                for i, out in zip(ok, outs, strict=True):
                    results[i] = out
            return results

    async def complete(
        self, prompts: Sequence[str], max_tokens: int, temperature: float = 0.0, group: str = ""
    ) -> list[str | BaseException]:
        """Text completions of single user messages (the D1 LLM view teacher on the pool)."""
        import asyncio

        if self.async_policy is None:
            raise ValueError(
                f"policy.backend={self.config.backend} cannot serve the LLM view teacher; use backend vllm, or "
                "label.llm.source: endpoint"
            )
        with self._serving(group, len(prompts)):
            return list(
                await asyncio.gather(
                    *(
                        self.async_policy.complete(p, max_tokens=max_tokens, temperature=temperature, tag=group)
                        for p in prompts
                    ),
                    return_exceptions=True,
                )
            )

    async def shutdown(self) -> bool:
        """Stop the engine (vLLM's core process) so its GPU memory is free before the actor
        is killed (see :func:`stop_policy_replicas`). True when there was an engine to stop."""
        import asyncio

        target = self.async_policy if self.async_policy is not None else self.policy
        stop = getattr(target, "shutdown", None)
        if not callable(stop):
            return False
        await asyncio.to_thread(stop)
        return True

    async def placed(self) -> dict[str, Any]:
        """Where this replica runs (``cluster.json``)."""
        return node_place()

    async def load(self) -> int:
        """Requests per step of this replica's live groups (what routing balances)."""
        return self.loads.load()

    async def claim(self, group: str, size: int, seen_load: int) -> tuple[bool, int]:
        return self.loads.claim(group, size, seen_load)

    async def release(self, group: str) -> bool:
        return self.loads.release(group)

    async def stats(self) -> dict[str, Any]:
        engine = self.async_policy.counters if self.async_policy is not None else {}
        frontend = dict(self.async_policy.frontend) if self.async_policy is not None else {}
        return {
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "calls": self.calls,
            "groups": self.loads.groups(),
            **engine,
            "frontend": frontend,
        }

    async def engine_settings(self) -> dict[str, Any]:
        """The scheduler settings the engine runs with (vLLM's resolved config, or the fake
        engine's requested keywords) and the front end's; ``{}`` without an async engine."""
        if self.async_policy is None:
            return {}
        from memprism_ray.policy.vllm_async import engine_settings

        return {
            **engine_settings(self.async_policy.engine, self.config.vllm),
            "prompt_layout": self.async_policy.prompt_layout,
            "frontend_threads": self.async_policy.frontend_threads,
        }

    async def configure_frontend(
        self, prompt_layout: str | None = None, frontend_threads: int | None = None
    ) -> dict[str, Any]:
        """Switch the prompt layout or front-end threads on the running engine (benchmarks
        compare them on one engine start; a job takes both from its config)."""
        if self.async_policy is None:
            raise ValueError(f"policy.backend={self.config.backend} has no async front end to configure")
        return self.async_policy.configure(prompt_layout=prompt_layout, frontend_threads=frontend_threads)

    async def engine_record(self) -> dict[str, Any]:
        """What a fake engine recorded (tests, the fake bench): steps and peak batch."""
        engine = getattr(self.async_policy, "engine", None)
        steps, max_running = list(getattr(engine, "steps", [])), getattr(engine, "max_running", 0)
        return {"steps": steps, "max_running": max_running, "stopped": getattr(engine, "stopped", None)}


def start_policy_replicas(
    cfg: ExperimentConfig,
    *,
    benchmark: Benchmark,
    engine_factory: Any = None,
    timeout_s: float | None = None,
    log: Any = print,
    data: NodeData | None = None,
) -> list[Any]:
    """``policy.num_replicas`` :class:`PolicyReplica` actors with the resources the config asks
    for (whatever has joined yet), returned once each answers. With ``backend: vllm`` one log
    line gives the scheduler settings replica 0's engine resolved (issue 31: vLLM's defaults
    differ by usage context, so the line says what actually runs)."""
    from memprism_ray.cluster.placement import actor_name, policy_replica_options, wait_placed

    opts = policy_replica_options(cfg)
    handles = [
        PolicyReplica.options(name=actor_name(cfg.run.name, f"policy-replica-{i}"), **opts).remote(
            cfg.policy, engine_factory, data, benchmark
        )
        for i in range(cfg.policy.num_replicas)
    ]
    try:
        wait_placed(
            [h.load.remote() for h in handles],
            "policy replicas",
            opts,
            timeout_s if timeout_s is not None else cfg.run.call_timeout_s * 4,
        )
    except BaseException:
        # Replicas still pending placement never answer: a short wait, then the kill.
        stop_policy_replicas(handles, timeout_s=10.0)
        raise
    if cfg.policy.backend == "vllm" and handles:
        settings = ray.get(handles[0].engine_settings.remote(), timeout=60)
        shown = ", ".join(f"{k} {v}" for k, v in settings.items() if k != "source")
        log(
            f"policy replicas: {len(handles)} x vLLM AsyncLLM engine ({settings.get('source')} settings of "
            f"replica 0: {shown})"
        )
    return handles


def stop_policy_replicas(handles: Sequence[Any], timeout_s: float = 60.0) -> int:
    """Stop each replica's engine, then kill the actor; returns how many engines stopped.

    ``ray.kill`` alone is not enough on a GPU: vLLM's engine core is a child process with no
    check for its parent's death (vLLM 0.24 source), so it can outlive a killed replica
    holding the GPU memory it reserved, and the next engine on that GPU then fails to
    start. A replica that does not answer within ``timeout_s`` (hung, dead, still
    starting) is killed all the same."""
    handles = list(handles)
    if not handles:
        return 0
    refs = [h.shutdown.remote() for h in handles]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    stopped = 0
    for ref in ready:
        with contextlib.suppress(Exception):  # a dead replica has no engine left to stop
            stopped += bool(ray.get(ref))
    for h in handles:
        ray.kill(h)
    return stopped


def replicas_for(
    cfg: ExperimentConfig,
    benchmark: Benchmark,
    pool: list[Any] | None,
    needed: bool,
    log: Any = print,
    why: str = "",
    data: NodeData | None = None,
) -> tuple[list[Any] | None, list[Any]]:
    """``(the policy replicas a stage uses, the ones started here for the caller to stop)``;
    ``None`` when the stage does not need the pool."""
    if not needed:
        return None, []
    if pool:
        return list(pool), []
    log(f"starting {cfg.policy.num_replicas} policy replicas{' for ' + why if why else ''}")
    started = start_policy_replicas(cfg, benchmark=benchmark, data=data)
    return started, started
