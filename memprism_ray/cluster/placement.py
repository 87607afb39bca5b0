"""Ray start-up and resource placement shared by the actors and jobs (docs/gpu.md
"Placement": GPU actors ask for what the config says, whatever has joined the cluster yet;
that pending demand is what the autoscaler acts on, so :func:`wait_placed` bounds the wait).
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from memprism_ray.cluster.waits import WaitTimeout
from memprism_ray.config import joins_cluster

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig

log = logging.getLogger(__name__)

#: The Ray and Hugging Face settings of every entry point, Ray process and job (never silently on).
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def set_ray_env() -> None:
    """:data:`RAY_ENV` where the environment does not say otherwise."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)


def check_cluster_address(address: str, timeout_s: float = 10.0) -> None:
    """For a job that joins a cluster (``address`` ``"auto"`` with ``RAY_ADDRESS`` set): a
    one-line ``ValueError`` when nothing answers at ``RAY_ADDRESS``'s ``host:port``. ``ray.init``
    waits for such a cluster without end (Ray 2.60: still retrying after 5 min, a warning every
    30 s), which a stale ``RAY_ADDRESS`` from a stopped cluster turned into a hung job."""
    if not joins_cluster(address):
        return
    target = os.environ["RAY_ADDRESS"]
    host, sep, port = target.rpartition(":")
    if not sep or "://" in target or not port.isdigit():  # "auto", a Ray Client URL: Ray's own lookup
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ValueError(
            f"no Ray cluster answers at RAY_ADDRESS={target} ({exc.strerror or exc}): start it or correct the "
            "address, or unset RAY_ADDRESS to run on a local Ray"
        ) from None


def ray_working_dir_copy(path: Path) -> Path | None:
    """The root of Ray's temporary copy of a job's working_dir that ``path`` lies in, if any.
    ``ray job submit --working-dir DIR`` unpacks DIR to
    ``<session>/runtime_resources/working_dir_files/<package>`` and starts the driver there
    (Ray 2.60, ``ray/_private/runtime_env/working_dir.py``; tests/e2e/test_job_submit.py
    submits to a real head to re-check the layout)."""
    parts = path.resolve().parts
    for i in range(len(parts) - 2):
        if parts[i : i + 2] == ("runtime_resources", "working_dir_files"):
            return Path(*parts[: i + 3])
    return None


def check_outlives_job(path: Path, what: str) -> None:
    """A one-line ``ValueError`` when the output directory ``path`` (``what`` names its setting)
    lies in Ray's copy of the job's working_dir: a relative ``run.out_dir`` under ``ray job
    submit --working-dir .``. Ray deletes that copy when its cache of working dirs is full, a
    head restart starts another session directory, and a job resubmitted with any file changed
    gets another copy: the run would be lost to ``--resume auto`` and to its user, who finds no
    ``runs/`` in the checkout."""
    copy = ray_working_dir_copy(path)
    if copy is not None:
        raise ValueError(
            f"{what} {str(path)!r} is inside Ray's temporary copy of this job's working_dir ({copy}), which "
            f"Ray deletes: give {what} an absolute path on storage that outlives the job, e.g. {Path.home() / 'runs'}"
        )


def check_uploaded(value: str, what: str) -> None:
    """A one-line ``ValueError`` when the relative path ``value`` (``what`` names its option) is
    missing and the job runs in Ray's copy of its working_dir: relative paths resolve there, and
    the copy holds only what ``ray job submit`` uploaded (no ``runs/``: .gitignore keeps it out)."""
    copy = ray_working_dir_copy(Path.cwd())
    if value and copy is not None and not os.path.isabs(value) and not Path(value).exists():
        raise ValueError(
            f"{what} {value!r}: no such path in Ray's temporary copy of this job's working_dir ({copy}), "
            f"which holds only the files ray job submit uploaded: give its path on the node the job runs on, "
            f"e.g. '~/runs/...'"
        )


def init_ray(address: str = "auto", num_cpus: int = 0, **kwargs: Any) -> dict[str, Any]:
    """Join the cluster a job runs on (``address="auto"`` under ``ray job submit``), or start a
    local, in-process instance with every listener on 127.0.0.1; ``ray.cluster_resources()``."""
    set_ray_env()
    if ray.is_initialized():
        return ray.cluster_resources()
    local = not joins_cluster(address)
    if local:
        # Ray picks the node address (and so where GCS, raylet and agents listen: `*` and the
        # machine's interface address) from ray_constants.ENABLE_RAY_CLUSTER, read from
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when `ray` is first imported; `_node_ip_address`
        # alone does not move them. Measured with Ray 2.60 (`ss -ltnp`, docs/cluster.md): the
        # setting off keeps every listener on 127.0.0.1. The environment variable carries it
        # to Ray's child processes; the constant covers a `ray` this process already imported.
        # Internal to Ray: tests/cluster/test_local_listeners.py re-checks it on upgrades.
        import ray._private.ray_constants as ray_constants

        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    keys = [k for k in RAY_ENV if k != "TOKENIZERS_PARALLELISM"] + ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    runtime_env = {"env_vars": {k: os.environ[k] for k in keys if k in os.environ}}
    if not local:
        # Under `ray job submit` the job's runtime env already applies (merging would conflict).
        ray.init(address="auto", log_to_driver=True, **kwargs)
    else:
        opts: dict[str, Any] = {"address": "local", "include_dashboard": False, "runtime_env": runtime_env}
        if num_cpus:
            opts["num_cpus"] = num_cpus
        ray.init(**opts, **kwargs)
    return ray.cluster_resources()


def learner_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """Ray options of the Learner and the D1 SFT task (a GPU fraction: the Router has 12.7M parameters)."""
    gpus = float(cfg.rollout.learner_gpus)
    if gpus > 0:
        return {"num_gpus": gpus, "num_cpus": cfg.rollout.learner_cpus}
    return {"num_cpus": cfg.rollout.learner_cpus}


def policy_replica_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """Ray options of one policy replica."""
    opts = cfg.policy.replica_options(cfg.rollout.policy_cpus)
    opts["max_restarts"] = cfg.rollout.max_restarts
    return opts


def placement_summary(requests: dict[str, dict[str, Any]], available: dict[str, float]) -> list[str]:
    """One line per resource the run asks for that the cluster does not have yet (what the
    autoscaler has to provide; never a reason to fall back)."""
    need: dict[str, float] = {}
    for opts in requests.values():
        if opts.get("num_gpus"):
            need["GPU"] = need.get("GPU", 0.0) + float(opts["num_gpus"]) * int(opts.get("count", 1))
        for k, v in (opts.get("resources") or {}).items():
            need[k] = need.get(k, 0.0) + float(v) * int(opts.get("count", 1))
    return [
        f"asking for {v:g} {k}; the cluster has {available.get(k, 0.0):g} now: waiting for the autoscaler to add nodes"
        for k, v in sorted(need.items())
        if available.get(k, 0.0) < v
    ]


def wait_placed(refs: list[Any], what: str, options: dict[str, Any], timeout_s: float) -> list[Any]:
    """``ray.get(refs)`` with a deadline; on timeout a one-line error naming the resource request
    (a :class:`~memprism_ray.cluster.waits.WaitTimeout`: the job ends in that line)."""
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        asked = {k: v for k, v in options.items() if k in ("num_gpus", "num_cpus", "resources")}
        for bundle in pending_demand():
            log.warning("pending resource demand: %s", bundle)
        raise WaitTimeout(
            f"{len(pending)} of {len(refs)} {what} not placed within {timeout_s:.0f}s; they ask for {asked} and the "
            f"cluster has {dict(ray.cluster_resources())}: add GPU nodes (or let the autoscaler), or lower the request"
        )
    return ray.get(ready)


def pending_demand() -> list[dict[str, float]]:
    """The resource bundles waiting for resources, as Ray's autoscaler v2 sees them ([] if unknown)."""
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
    except Exception:  # an internal API: report nothing rather than fail the job
        return []
    out: list[dict[str, float]] = []
    for demand in status.resource_demands.ray_task_actor_demand:
        for req in demand.bundles_by_count:
            out.extend([dict(req.bundle)] * int(req.count))
    return out


_NAMES_USED: dict[str, int] = {}


def actor_name(run: str, role: str) -> str:
    """The name an actor shows in the dashboard, ``<run>-<role>``, with ``.N`` appended when
    this driver already named one so: Ray refuses a name that is taken, and a killed actor's
    name is released only once it is dead."""
    base = f"{run}-{role}"
    n = _NAMES_USED.get(base, 0)
    _NAMES_USED[base] = n + 1
    return base if n == 0 else f"{base}.{n}"
