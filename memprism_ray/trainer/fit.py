"""One trainer for every benchmark (paper "Adapter": D1 decision-conditioned initialisation,
then D2 grouped GRPO; appendix C for the final evaluation): :func:`fit` reads top to bottom.
A start that cannot succeed ends in one line and exit status 2; a dead Learner in one line
naming the last checkpoint and the command that continues, and so does a stop (Ctrl-C, SIGTERM,
SIGHUP).
"""

from __future__ import annotations

import contextlib
import errno
import re
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memprism_ray.adapter.checkpoint import read_checkpoint_meta, trained_otherwise
from memprism_ray.benchmark import Benchmark, get_benchmark
from memprism_ray.config import joins_cluster
from memprism_ray.trainer.job_args import parse_job_args
from memprism_ray.trainer.run_dir import (
    RunDirError,
    RunLogger,
    checkpoint_dir,
    checkpoint_extra,
    checkpoint_iteration,
    d1_dir,
    latest_checkpoint,
    prepare_run_dir,
)

if TYPE_CHECKING:
    from memprism_ray.config import ExperimentConfig


def _printer(prefix: str, *, err: bool = False) -> Callable[[str], None]:
    """Prints ``prefix msg`` at once, on stdout or (``err``) stderr as they are at the call."""

    def show(msg: str) -> None:
        if err:  # after what stdout holds (a progress bar's last draw), in a log that merges both
            sys.stdout.flush()
        print(f"{prefix} {msg}", file=sys.stderr if err else None, flush=True)

    return show


say = _printer("[grpo]")
error = _printer("[grpo] error:", err=True)
_eval_say = _printer("[eval]")
_eval_error = _printer("[eval] error:", err=True)
_d1_say = _printer("[d1]")
_d1_error = _printer("[d1] error:", err=True)


def prepare_benchmark(cfg: ExperimentConfig, benchmark: Benchmark, log: Any = say, *, trains: bool = True) -> Any:
    """The config with the benchmark's data resolved, refused (``BenchmarkConfigError``) when it
    names another benchmark or, for a job that ``trains``, when its evaluation episodes are
    training tasks (an evaluation job's data root may hold the test splits only)."""
    benchmark.check(cfg)
    cfg = benchmark.prepare(cfg, log)
    if trains:
        benchmark.check_disjoint(cfg)
    return cfg


def fit(cfg: ExperimentConfig, benchmark: Benchmark, argv: Sequence[str] | None = None) -> int:
    """D1, GRPO and the final evaluation of ``cfg`` on ``benchmark``; the exit status.
    ``argv``: the job's arguments, for the ``--resume auto`` command printed on a failure."""

    from memprism_ray.cluster.placement import init_ray
    from memprism_ray.cluster.placement_record import PlacementRecord

    # 1-2. Run directory and data: every refusal before any work, in one line; a run directory
    # made by this call is removed again when the start is refused.
    ck_extra = checkpoint_extra(cfg)  # the config as given (before data paths are resolved)
    run_dir = cfg.run.dir
    fresh = not run_dir.exists()
    held = contextlib.ExitStack()  # the run directory's lock, for the whole job
    try:
        with job_start(cfg.run.ray_address, run_dir.parent, "run.out_dir"):
            benchmark.check(cfg)
            resume_from = prepare_run_dir(run_dir, cfg.run.resume, cfg, hold=held)
            # A fresh run without --init_checkpoint runs D1.
            check_endpoints(cfg, label=fresh and not cfg.init_checkpoint, evaluates=cfg.eval.enabled)
            if cfg.eval.enabled:  # a missing extra crashed the final evaluation's episodes after training
                from memprism_ray.trainer.evaluate import check_memory_conditions

                check_memory_conditions(cfg, cfg.eval.conditions)
            cfg = benchmark.prepare(cfg, say)  # EB-ALFRED's default fixture lives in the run directory
            benchmark.check_disjoint(cfg)
            # A resumed run whose D1 has not labelled yet labels now (D1's key needs the prepared data).
            if not fresh and not cfg.init_checkpoint and resume_from is None:
                from memprism_ray.trainer.d1 import labelled

                if not labelled(d1_dir(run_dir, cfg, benchmark, create=False)):
                    check_endpoints(cfg, policy=False, label=True)
    except (ValueError, OSError, KeyboardInterrupt) as exc:  # RunDirError, BenchmarkConfigError: ValueErrors
        if fresh and run_dir.is_dir() and not isinstance(exc, RunDirError):
            shutil.rmtree(run_dir)
        held.close()
        return start_refused(exc, error)
    if cfg.run.resume == "auto" and resume_from is None:  # a misspelt --run.name would start over unsaid
        say(
            f"--resume auto: {'no run directory' if fresh else 'no checkpoint yet'} at {run_dir}: "
            f"training starts at iteration 1{'' if fresh else ' (finished D1 stages are reused)'}"
        )
    resources = init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    say(f"run directory {run_dir}; cluster {dict(resources)}")
    record = PlacementRecord(run_dir / "cluster.json")  # where each actor ran

    def resume_line() -> str:
        latest = latest_checkpoint(run_dir)
        args = list(argv if argv is not None else sys.argv[1:])
        return (
            f"last checkpoint: {latest if latest else 'none yet (a resume reuses the finished D1 stages)'}; "
            f"continue with: python {shlex.quote(sys.argv[0])} {shlex.join(_without_resume(args))} --resume auto"
        )

    def train() -> int:  # once Ray is up
        from ray.exceptions import RayActorError

        from memprism_ray.actors.workers import stop_policy_replicas
        from memprism_ray.cluster.node_data import ship
        from memprism_ray.eval.report import PROGRESS
        from memprism_ray.trainer.d1 import d1_cost_line, run_d1
        from memprism_ray.trainer.evaluate import evaluate
        from memprism_ray.trainer.grpo import (
            final_eval_dir,
            run_grpo_iterations,
            start_training_actors,
            stop_training_actors,
        )

        data = ship(benchmark.data_trees(cfg), say)  # what every actor reads, on whichever node it lands
        resumed_at = checkpoint_iteration(resume_from) if resume_from is not None else 0
        logger = RunLogger(run_dir, cfg.run.tensorboard, resume_step=resumed_at if cfg.run.resume else None)
        if resume_from is not None:
            logger.note_checkpoint(resumed_at, resume_from)
        games = benchmark.train_games(cfg)
        say(f"{len(games)} training {benchmark.task_noun} ({benchmark.name})")

        # 3. The D1 reference policy (also GRPO's starting point).
        if cfg.init_checkpoint:
            reference = Path(cfg.init_checkpoint)
            # a warm start from another benchmark's Router, or with another text encoder: said
            for how in trained_otherwise(read_checkpoint_meta(reference), benchmark.name, cfg.encoder, "this run"):
                say(f"note: init_checkpoint {reference} {how}")
        else:
            say(d1_cost_line(cfg, benchmark))
            reference = run_d1(cfg, benchmark, d1_dir(run_dir, cfg, benchmark), say, data=data)

        # 4. Actors and GRPO iterations; a lost Learner is started again inside (run.learner_restarts).
        actors = None
        try:
            actors = start_training_actors(
                cfg, benchmark, reference, resume_from, resources, say, data=data, record=record
            )
            final = run_grpo_iterations(cfg, actors, games, logger, run_dir, ck_extra)
            stop_training_actors(actors)
        except RayActorError as exc:  # rollout workers are replaced inside; what ends here is the learner
            if exc.actor_init_failed:
                raise  # its creation error is the cause to name (run_failure), not a resume
            restarts = actors.learner.restarts if actors is not None else 0
            again = (
                f" after {restarts} restart(s) (run.learner_restarts={cfg.run.learner_restarts})" if restarts else ""
            )
            error(f"the Learner actor died ({type(exc).__name__}){again}; {resume_line()}")
            return 1

        # 5. Final evaluation: every condition of eval.conditions on the same episodes.
        eval_dir = final_eval_dir(run_dir, cfg, say, benchmark.success_label)
        if cfg.eval.enabled and eval_dir is not None:
            latest = checkpoint_dir(run_dir, cfg.grpo.iterations)
            # The replicas stay up for the evaluation: one engine start (60-75 s on an H100) saved.
            summary = evaluate(
                cfg,
                benchmark,
                cfg.eval.conditions,
                final,
                str(latest),
                eval_dir,
                log=say,
                pool=actors.replicas or None,
                data=data,
                record=record,
                resume=True,  # an evaluation a stop interrupted is continued: what it finished is kept
            )
            for row in benchmark.eval_metrics(summary):
                logger.log("eval", cfg.grpo.iterations, row)
            print(benchmark.printed_summary(eval_dir).read_text())
            problem = benchmark.failures(summary)
            if problem:
                again = (
                    f"; a resume plays them again (only they): {resume_line()}"
                    if (eval_dir / PROGRESS).exists()
                    else ""
                )
                say(f"warning: {problem}; see {eval_dir}{again}")
        stop_policy_replicas(actors.replicas)
        logger.close()
        say(f"done: {run_dir}")
        return 0

    with held:
        return explained(train, error, resume_line)


class Stopped(KeyboardInterrupt):
    """SIGTERM (``ray job stop``, a preempted machine, ``kill``) or SIGHUP (its terminal closed)
    raised in the job's main thread, so that the job unwinds as on Ctrl-C and ends in the same
    one line (and its Ray stops at once: after SIGHUP, its agents outlived it by about a minute)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signal :func:`stop_signals` last raised :class:`Stopped` for: inside ``ray.get`` Ray's
#: signal check turns it into a plain ``KeyboardInterrupt`` (a SIGTERM during D1 was told "SIGINT").
_received: list[int] = []


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raised as :class:`Stopped` in the main thread while the block runs
    (Ray's driver handler for SIGTERM dumps a stack and exits; ours unwinds to the job's line)."""

    def stop(signum: int, _frame: object) -> None:
        _received[:] = [signum]
        raise Stopped(signum)

    _received.clear()
    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def job_start(address: str, out_dir: Path, what: str) -> Iterator[None]:
    """What every job checks and how it may be stopped before Ray starts: under
    :func:`stop_signals`, a cluster answers at ``RAY_ADDRESS`` and the output directory
    ``out_dir`` (``what`` names its setting) outlives the job; the block then runs (the job's
    own refusals, its data built). Its failures go to :func:`start_refused`."""
    from memprism_ray.cluster.placement import check_cluster_address, check_outlives_job

    with stop_signals():
        check_cluster_address(address)
        check_outlives_job(out_dir, what)
        yield


def check_endpoints(
    cfg: ExperimentConfig, *, policy: bool = True, label: bool = False, evaluates: bool = False
) -> None:
    """Every OpenAI-compatible endpoint the job will call answers, asked once before Ray starts
    (:func:`memprism_ray.llm_client.probe`): the task policy's (``policy``: the job plays
    episodes or asks the counterfactual teacher), the LLM Phi's, the LLM view teacher's
    (``label``: D1 labels in this job) and the memory baselines' (``evaluates``: the job
    evaluates a condition that calls it). One on the driver's loopback is not asked when the job
    joins a cluster: its actors on other nodes call their own."""
    from urllib.parse import urlsplit

    from memprism_ray.baselines.conditions import condition_needs
    from memprism_ray.llm_client import probe

    memory = evaluates and any("memory_llm" in condition_needs(c) for c in cfg.eval.conditions)
    wanted = [
        ("policy.openai", cfg.policy.openai, policy and cfg.policy.backend == "openai"),
        ("phi", cfg.phi, cfg.phi.kind == "llm" and cfg.phi.llm_source == "endpoint"),
        ("label.llm", cfg.label.llm, label and cfg.label.teacher == "llm" and cfg.label.llm.source == "endpoint"),
        ("eval.memory", cfg.eval.memory, memory),
    ]
    for key, endpoint, used in wanted:
        host = urlsplit(endpoint.base_url).hostname or ""
        if not used or (joins_cluster(cfg.run.ray_address) and (host == "localhost" or host.startswith("127."))):
            continue
        problem = probe(endpoint)
        if problem:
            raise ValueError(f"{key}.base_url {endpoint.base_url}: {problem} (asked before any work)")


def _signal_name(exc: KeyboardInterrupt) -> tuple[str, int]:
    signum = exc.signum if isinstance(exc, Stopped) else (_received[0] if _received else signal.SIGINT)
    return signal.Signals(signum).name, 128 + signum


def explained(work: Callable[[], int], error: Callable[[str], None], kept: Callable[[], str]) -> int:
    """``work()``'s exit status; a failure the job can name in one line (:func:`run_failure`) is
    that line through ``error`` and exit status 1, no traceback; anything else propagates. Ctrl-C
    SIGTERM and SIGHUP end in one line saying what ``kept`` says is kept, exit status 128 + the
    signal."""
    try:
        with stop_signals():
            return int(work())
    except KeyboardInterrupt as exc:
        name, status = _signal_name(exc)
        error(f"stopped by {name}; {kept()}")
        return status
    except Exception as exc:
        line = run_failure(exc)
        if line is None:
            raise
        error(f"{line}; {kept()}" if disk_failure(exc) else line)  # once there is room, the run goes on
        return 1


def run_failure(exc: BaseException) -> str | None:
    """The one line a job ends with for a failure it can explain, else ``None``."""
    from memprism_ray.cluster.fleet import FleetError
    from memprism_ray.cluster.node_data import NodeDataError
    from memprism_ray.cluster.waits import WaitTimeout
    from memprism_ray.policy.base import PolicyBackendError
    from memprism_ray.router.encoder import EncoderLoadError
    from memprism_ray.trainer.d1 import NothingLabelled
    from memprism_ray.trainer.rollouts import IterationFailed

    cause = getattr(exc, "cause", None) or exc  # a Ray task error carries the actor's own exception
    if getattr(cause, "actor_init_failed", False):
        return creation_failure(str(cause))
    if isinstance(cause, NodeDataError):
        return str(cause).strip().splitlines()[0]
    if isinstance(cause, (IterationFailed, FleetError, WaitTimeout, EncoderLoadError, NothingLabelled)):
        return str(cause)
    if isinstance(cause, PolicyBackendError):  # D1's teacher asks the policy in Ray tasks: one fails them all
        return f"the task policy's backend failed: {str(cause).strip().splitlines()[0]}"
    if (disk := disk_failure(cause)) is not None:
        where = f" writing {disk.filename}" if disk.filename else ""
        fix = "make that file system writable" if disk.errno == errno.EROFS else "free space on that disk"
        return f"{disk.strerror}{where}: {fix}"
    return None


def start_refused(exc: ValueError | OSError | KeyboardInterrupt, error: Callable[[str], None]) -> int:
    """A start (before Ray) ended by ``exc``: its one line through ``error`` and the exit status,
    2 for a refusal. An ``OSError`` from the system (a folder the job must create, such as an
    unwritable ``corpus.cache_dir``, ended in a traceback) names its path and the system's
    reason; a signal (a first run's corpus build takes minutes: Ctrl-C there ended in a
    traceback and left the fresh run directory behind) is 128 + the signal."""
    if isinstance(exc, KeyboardInterrupt):
        name, status = _signal_name(exc)
        error(
            f"stopped by {name} while the job was starting, before any of its results were written "
            "(data it had built so far is kept and reused)"
        )
        return status
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        error(f"{exc.filename}: {exc.strerror}")
    else:
        error(str(exc))
    return 2


def disk_failure(exc: BaseException) -> OSError | None:
    """``exc`` (or the actor's exception it carries) when it is a full or read-only disk."""
    cause = getattr(exc, "cause", None) or exc
    return cause if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def creation_failure(message: str) -> str:
    """One line for an actor that raised in ``__init__``: Ray hands the driver an
    ``ActorDiedError`` holding only the text of the creation task's traceback (no ``.cause``),
    so the actor's class, its node and the exception's first line are read from that text."""
    lines = [_ANSI.sub("", line) for line in message.splitlines()]
    head = re.search(r"ray::(?:[^\s:]+:)?(\w+)\.__init__\(\).*?\bip=([\w.:]+)", " ".join(lines[:2]))
    actor, where = (head.group(1), f" on {head.group(2)}") if head else ("an actor", "")
    # The exception's own line is the first unindented one after the last frame of the traceback.
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    after = lines[frames[-1] + 1 :] if frames else lines[1:]
    error = next((line.strip() for line in after if line.strip() and not line.startswith(" ")), lines[-1].strip())
    error = re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=\w+(?:Error|Exception)?:)", "", error)  # the module path of its type
    return f"{actor} could not start{where}: {error}"[:600]


def _without_resume(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--resume", "--run.resume"):
            skip = True
        elif not a.startswith(("--resume=", "--run.resume=")):
            out.append(a)
    return out


def grpo_job(benchmark: str, description: str, argv: Sequence[str] | None = None) -> int:
    """``jobs/grpo_<benchmark>.py``: parse ``--config FILE [--resume ...] [--section.key V]``, then :func:`fit`."""
    bench = get_benchmark(benchmark)
    _, cfg = parse_job_args(description, argv, job=bench.job_spec("grpo"))
    return fit(cfg, bench, argv)


def evaluate_job(benchmark_name: str, description: str, argv: Sequence[str] | None = None) -> int:
    """``jobs/eval_<benchmark>.py``: parse the arguments, then :func:`run_evaluation`."""
    benchmark = get_benchmark(benchmark_name)
    args, cfg = parse_job_args(description, argv, job=benchmark.job_spec("eval"), evaluation=True, resumable=False)
    out_dir = Path(args.out) if args.out else cfg.run.dir / "eval"
    return run_evaluation(cfg, benchmark, args.checkpoint, out_dir, say=_eval_say, error=_eval_error)


def run_evaluation(
    cfg: ExperimentConfig, benchmark: Benchmark, checkpoint: str, out_dir: Path, *, say: Any = print, error: Any = print
) -> int:
    """A standalone evaluation (``jobs/eval_<benchmark>.py``, ``memprism eval``; paper appendix C)
    of ``eval.conditions`` into ``out_dir``. The exit status: 2 when the start is refused (one
    line through ``error``, before any work), 1 when any episode failed, else 0."""
    from memprism_ray.cluster.placement import init_ray
    from memprism_ray.eval.report import PROGRESS, check_fresh_output
    from memprism_ray.trainer.evaluate import check_memory_conditions, evaluate, given_marginal, router_state_for

    try:
        with job_start(cfg.run.ray_address, out_dir, "the output directory"):
            # before any work: reports are never silently replaced; --run.resume auto continues one
            check_fresh_output(out_dir, resume=cfg.run.resume == "auto")
            given_marginal(cfg)  # eval.marginal loads and is a 144-way marginal
            router_state = router_state_for(cfg, checkpoint, say)
            check_endpoints(cfg, evaluates=True)
            check_memory_conditions(cfg, cfg.eval.conditions)
            cfg = prepare_benchmark(cfg, benchmark, say, trains=False)
            benchmark.eval_plan(cfg)  # the evaluation split's files parsed here, before Ray (cached for later)
    except (ValueError, OSError, KeyboardInterrupt) as exc:
        return start_refused(exc, error)
    if cfg.run.resume == "auto" and not (out_dir / PROGRESS).exists():  # a misspelt --out would play all unsaid
        say(f"--run.resume auto: no evaluation to continue in {out_dir}: every condition is played")
    init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    from memprism_ray.cluster.node_data import ship

    def play() -> int:
        data = ship(benchmark.data_trees(cfg), say)
        summary = evaluate(
            cfg, benchmark, cfg.eval.conditions, router_state, checkpoint, out_dir, log=say, data=data,
            resume=cfg.run.resume == "auto",
        )  # fmt: skip
        print((out_dir / benchmark.summary_file).read_text())
        problem = benchmark.failures(summary)
        if problem:
            again = "; --run.resume auto plays them again (only they)" if (out_dir / PROGRESS).exists() else ""
            error(f"{problem}; see {out_dir / benchmark.summary_file}{again}")
            return 1
        return 0

    def kept() -> str:
        try:
            check_fresh_output(out_dir)  # what a second run into it would be told
        except FileExistsError as exc:
            return str(exc)
        return f"nothing was written to {out_dir}"

    return explained(play, error, kept)


def d1_job(benchmark_name: str, description: str, argv: Sequence[str] | None = None, *, train: bool = True) -> int:
    """``jobs/label_views.py`` (``train=False``: the D1 data only) and ``jobs/sft_alfworld.py``."""
    from memprism_ray.cluster.placement import init_ray
    from memprism_ray.trainer.d1 import run_d1

    _, cfg = parse_job_args(description, argv, resumable=False)
    benchmark = get_benchmark(benchmark_name)
    try:
        with job_start(cfg.run.ray_address, cfg.run.dir.parent, "run.out_dir"):
            check_endpoints(cfg, policy=cfg.label.teacher != "llm", label=True)  # the counterfactual teacher plays
            cfg = prepare_benchmark(cfg, benchmark, _d1_say)
    except (ValueError, OSError, KeyboardInterrupt) as exc:
        return start_refused(exc, _d1_error)
    init_ray(cfg.run.ray_address, cfg.run.num_cpus)
    from memprism_ray.cluster.node_data import ship

    target = d1_dir(cfg.run.dir, cfg, benchmark)  # keyed by the config sections that make D1 (as in the GRPO job)

    def build() -> int:
        data = ship(benchmark.data_trees(cfg), _d1_say)
        path = run_d1(cfg, benchmark, target, _d1_say, data=data, train=train)
        _d1_say(f"D1 checkpoint: {path}" if train else f"done: {path}")
        return 0

    return explained(build, _d1_error, lambda: f"the finished D1 stages in {target} are reused when it runs again")
