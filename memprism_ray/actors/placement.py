"""Ray start-up and resource placement shared by the actors and jobs.

Two facts from running Ray 2.60 on CPU machines shape this module (shared/notes/ray.md):
an actor that asks for ``num_gpus`` on a cluster without GPUs is never placed and raises
nothing, so GPU requests are made only when the cluster has GPUs; and every entry point
must set ``RAY_USAGE_STATS_ENABLED`` and ``RAY_AUTH_MODE`` explicitly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

log = logging.getLogger(__name__)


def set_ray_env() -> None:
    """Explicit Ray settings for every entry point (never silently on)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def init_ray(address: str = "auto", num_cpus: int = 0, **kwargs: Any) -> dict[str, Any]:
    """Join the cluster a job runs on, or start a local one.

    ``address="auto"``: under ``ray job submit`` (``RAY_ADDRESS`` set) join that cluster;
    otherwise start a local, in-process instance (``python jobs/x.py``). ``"local"`` always
    starts a local instance, every listener of which (GCS, raylet, object manager, dashboard
    and runtime-env agents, workers) is bound to 127.0.0.1. Returns ``ray.cluster_resources()``.
    """
    set_ray_env()
    if ray.is_initialized():
        return ray.cluster_resources()
    local = not (address == "auto" and os.environ.get("RAY_ADDRESS"))
    if local:
        # Ray picks the node address (and so where GCS, raylet and agents listen: `*` and the
        # machine's interface address) from ray_constants.ENABLE_RAY_CLUSTER, read from
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when `ray` is first imported; `_node_ip_address`
        # alone does not move them. Measured with Ray 2.60 (`ss -ltnp`, docs/cluster.md): the
        # setting off keeps every listener on 127.0.0.1. The environment variable carries it
        # to Ray's child processes; the constant covers a `ray` this process already imported.
        # Internal to Ray: tests/actors/test_local_listeners.py re-checks it on upgrades.
        import ray._private.ray_constants as ray_constants

        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    runtime_env = {
        "env_vars": {
            k: os.environ[k]
            for k in (
                "RAY_USAGE_STATS_ENABLED",
                "RAY_AUTH_MODE",
                "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE",
                "HF_HUB_DISABLE_PROGRESS_BARS",
                "TRANSFORMERS_VERBOSITY",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
            )
            if k in os.environ
        }
    }
    if not local:
        # Under `ray job submit` the job's runtime env already applies (merging would conflict).
        ray.init(address="auto", log_to_driver=True, **kwargs)
    else:
        opts: dict[str, Any] = {"address": "local", "include_dashboard": False, "runtime_env": runtime_env}
        if num_cpus:
            opts["num_cpus"] = num_cpus
        ray.init(**opts, **kwargs)
    return ray.cluster_resources()


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


def gpu_request(wanted: float) -> float:
    """``wanted`` GPUs if the cluster has any, else 0 (with a warning): a GPU request on a
    CPU-only cluster would wait forever."""
    if wanted <= 0:
        return 0.0
    have = cluster_gpus()
    if have <= 0:
        log.warning("asked for %s GPU(s) but the cluster has none: placing on CPU", wanted)
        return 0.0
    return wanted
