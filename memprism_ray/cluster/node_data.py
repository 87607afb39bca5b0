"""Data the actors read, on every node of a cluster (issue 34; docs/cluster.md "What each node
needs on disk"): :func:`ship` turns the benchmark's :class:`~memprism_ray.benchmark.DataTree`
list into one :class:`NodeData` that every data-reading actor gets with its constructor; the
trees the job owns are shipped (as uncompressed tars: gzip saved 7 % on a D1 checkpoint's
weights for 3.3 s of packing), the user's are checked where each actor starts.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import errno
import functools
import inspect
import io
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import ray

from memprism_ray.benchmark import DataTree
from memprism_ray.envs.base import cache_base
from memprism_ray.io_atomic import LockTimeout, UnshippableLink, file_lock, sha256_path, tree_files

P = ParamSpec("P")
R = TypeVar("R")

#: Longest wait for a fetch: the tree's tar, packed on the driver's node, to arrive here.
FETCH_TIMEOUT_S = 600.0
#: Longest wait for another process of this node unpacking the same tree (issue 40). Shorter than
#: FETCH_TIMEOUT_S: a waiter that outlasted the holder's fetch would, when that fetch timed out,
#: take the lock and start a second full fetch on the same stalled path (1,200 s with both at
#: 600 s, past the 4 x run.call_timeout_s = 1,200 s the driver waits for an actor to start, so the
#: driver's generic "no result" came first). With 300 s a waiter gives up first, with a transient
#: error the fleet retries (by then the holder's copy is usually there), and its worst case, the
#: lock wait then its own fetch, is 900 s: its one line reaches the driver.
UNPACK_LOCK_TIMEOUT_S = 300.0
#: The environment variable (read on the driver, carried in NodeData) bounding node-data/.
MAX_BYTES_ENV = "MEMPRISM_NODE_DATA_MAX_BYTES"
#: node-data/'s bound when MAX_BYTES_ENV is unset: 2 GB, about 13 resume checkpoints of the
#: D1 Router (145 MB each with optimizer state) beside the embedded corpus (10 MB).
DEFAULT_MAX_BYTES = 2 * 10**9
_DONE = ".memprism-complete"
_TMP = ".tmp-"


class NodeDataError(RuntimeError):
    """An actor's data is not on its node (one line: the node, the path, the fix).

    ``permanent`` (issue 40) tells the fleet what to do with the seat: True when the same node
    would refuse again (a user tree missing, a member the tar filter refuses, a copy whose digest
    differs from the driver's, a link that cannot be followed, a full disk once this node's unused
    copies are evicted, a tree the driver's node cannot pack): retire it; False when another try
    may succeed (a fetch that timed out or was lost on the way, the wait for another process
    unpacking the same tree, an unreadable archive): start it again."""

    def __init__(self, message: str, *, permanent: bool = True) -> None:
        super().__init__(message)
        self.permanent = permanent


def node_place() -> dict[str, Any]:
    """Where the calling process runs: Ray node, host, process and (in an actor) its name."""
    import socket

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "actor": ctx.get_actor_name() if ctx.get_actor_id() else None,
    }


def node_label(place: dict[str, Any] | None = None) -> str:
    """``node 10.0.0.3 (ab12cd34)``: the address and the start of the node id, since several
    nodes of one machine share an address."""
    place = place or node_place()
    return f"node {place['node_ip']} ({str(place['node_id'])[:8]})"


@dataclass(frozen=True)
class ShippedTree:
    """One tree the job owns: its path on the driver, its digest and where it can be packed."""

    path: str
    what: str
    digest: str
    size: int
    """bytes of its files"""
    files: tuple[str, ...]
    """only these files of the folder (empty: all)"""
    source_node: str
    """Ray node id of the driver, whose disk holds ``path``"""


@dataclass(frozen=True)
class NodeData:
    """What the actors read, as :func:`ship` made it; the empty value localizes nothing."""

    shipped: tuple[ShippedTree, ...] = ()
    checked: tuple[DataTree, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    """bound of each node's ``node-data/`` (``$MEMPRISM_NODE_DATA_MAX_BYTES`` on the driver)"""

    def localize(self, obj: Any) -> Any:
        """``obj`` with every path under a shipped tree pointing at this node's copy (unpacked
        on first use), after checking that every user tree it names exists here. Every failure
        is a one-line :class:`NodeDataError`."""
        if not self.shipped and not self.checked:
            return obj
        roots: dict[str, Callable[[], str]] = {t.path: partial(_resolve, t, self.max_bytes) for t in self.shipped}
        for tree in self.checked:
            roots.setdefault(tree.path, partial(_check, tree))
        return _rebase(obj, sorted(roots.items(), key=lambda kv: -len(kv[0])))


def on_this_node(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` (an actor's set-up or method, a task) called with its arguments as this node has
    them: the one place the actors localize what they read (issue 42). The call's ``data``
    argument (a :class:`NodeData`; a method without one uses its actor's ``self.data``) moves
    every path under a shipped tree, in every other argument, to this node's copy (unpacked on
    first use) and checks the user trees they name; a failure is one :class:`NodeDataError`."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def localized(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = signature.bind(*args, **kwargs)
        given = bound.arguments
        data = given.get("data")
        if data is None and "self" in given:
            data = getattr(given["self"], "data", None)
        if data is not None:
            for name in given:
                if name not in ("self", "data"):
                    given[name] = data.localize(given[name])
        return fn(*bound.args, **bound.kwargs)

    return localized


def ship(trees: Iterable[DataTree], log: Callable[[str], None] | None = None) -> NodeData:
    """The driver's side (after ``ray.init``): identify every owned tree (nothing is packed until
    a node asks), keep the user's to be checked. A user tree inside another tree of ``trees`` is
    not kept on its own (:meth:`NodeData.localize` matches the longest root first, so its own
    check would shadow a shipped copy)."""
    trees = list(trees)
    max_bytes = _max_bytes_setting()
    shipped, checked = [], []
    node = ray.get_runtime_context().get_node_id()
    for tree in trees:
        if not tree.owned:
            if not _inside_another(tree, trees):
                checked.append(tree)
            continue
        path = Path(tree.path)
        if not path.exists():
            raise NodeDataError(f"{tree.what} {path} does not exist on the driver ({node_label()})")
        try:
            size = sum(f.stat().st_size for f in tree_files(path, tree.files))
            digest = sha256_path(path, tree.files)
        except (OSError, UnshippableLink) as exc:
            raise NodeDataError(f"{tree.what} {path} cannot be shipped: {_reason(exc)}") from None
        shipped.append(ShippedTree(tree.path, tree.what, digest, size, tree.files, node))
    for t in shipped if log else ():
        log(f"node data: {t.what} shipped to every node that lacks it ({t.size / 1e6:.1f} MB, sha256 {t.digest[:12]})")
    for t in checked if log else ():
        log(f"node data: {t.what} {t.path} must exist on every node (checked where each actor starts)")
    return NodeData(tuple(shipped), tuple(checked), max_bytes)


def _max_bytes_setting() -> int:
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(float(raw)) if any(c in raw for c in ".eE") else int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise NodeDataError(
            f"{MAX_BYTES_ENV}={raw!r} is not a number of bytes >= 0: set it to e.g. 2000000000 (2 GB), or unset it "
            f"for the default {DEFAULT_MAX_BYTES}"
        )
    return value


def _reason(exc: BaseException) -> str:
    """An exception as one line: its type when it says more than its text, then the text's first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, (UnshippableLink, NodeDataError)):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _inside_another(tree: DataTree, trees: Sequence[DataTree]) -> bool:
    """Whether the user tree ``tree`` lies under (or at) an owned tree's path, or strictly under
    another user tree's (resolved paths: a symlinked cache too)."""
    path = Path(tree.path).resolve()
    for other in trees:
        root = Path(other.path).resolve()
        if other is not tree and path.is_relative_to(root) and (other.owned or path != root):
            return True
    return False


def _pack(path: Path, files: Sequence[str] = ()) -> bytes:
    """An uncompressed tar of the tree (or of ``files`` of it), named by its last component: the
    files :func:`~memprism_ray.io_atomic.tree_files` lists, links followed (issue 40: every member
    a regular file, so the copy holds exactly what the digest covers; empty folders are not shipped)."""
    os.stat(path)  # gone from the driver: FileNotFoundError, not an empty tar
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", dereference=True) as tf:
        if path.is_file():
            tf.add(path, arcname=path.name)
        else:
            for f in tree_files(path, files):
                tf.add(f, arcname=f"{path.name}/{f.relative_to(path).as_posix()}", recursive=False)
    return buf.getvalue()


@ray.remote(num_cpus=0, max_retries=1)
def _pack_task(path: str, files: tuple[str, ...]) -> bytes:
    """Runs on the driver's node (node affinity): the tree as a node without it needs it."""
    return _pack(Path(path), files)


def _fetch(tree: ShippedTree) -> bytes:
    """The tree's tar from a task on the driver's node (at most FETCH_TIMEOUT_S)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    on_driver = NodeAffinitySchedulingStrategy(node_id=tree.source_node, soft=False)
    ref = _pack_task.options(scheduling_strategy=on_driver).remote(tree.path, tree.files)
    return ray.get(ref, timeout=FETCH_TIMEOUT_S)


def _fetched(tree: ShippedTree) -> bytes:
    """:func:`_fetch`, each failure a :class:`NodeDataError` saying whether a retry may help."""
    from ray.exceptions import GetTimeoutError, RayTaskError

    try:
        return _fetch(tree)
    except GetTimeoutError:
        raise NodeDataError(
            f"{tree.what}: no copy reached {node_label()} from the driver's node ({tree.source_node[:8]}) within "
            f"{FETCH_TIMEOUT_S:g}s (transient: the actor is started again); if it recurs, check that this node "
            f"reaches the driver's node, or put the same tree at {tree.path} on this node",
            permanent=False,
        ) from None
    except RayTaskError as exc:  # the packing itself failed on the driver's node: it would again
        raise NodeDataError(
            f"{tree.what} could not be packed on the driver's node for {node_label()} "
            f"({_reason(getattr(exc, 'cause', None) or exc)}): keep {tree.path} as it was when the job started",
        ) from None
    except Exception as exc:  # the driver's node or the object lost on the way: another try may get through
        raise NodeDataError(
            f"{tree.what} could not be fetched from the driver's node to {node_label()} ({_reason(exc)}; transient: "
            "the actor is started again)",
            permanent=False,
        ) from None


#: digest -> this process's local copy (a process unpacks or checks a tree once).
_LOCAL: dict[str, str] = {}
#: ``<copy>.use`` -> this process's shared lock on it, held for its life: no process of the node
#: evicts a copy in use (the kernel drops the lock when the process ends).
_HELD: dict[str, contextlib.ExitStack] = {}


def _resolve(tree: ShippedTree, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    if tree.digest not in _LOCAL:
        _LOCAL[tree.digest] = str(_local_copy(tree, max_bytes))
    return _LOCAL[tree.digest]


def _check(tree: DataTree) -> str:
    if not os.path.exists(tree.path):
        raise NodeDataError(
            f"{tree.what} {tree.path} does not exist on {node_label()}: {tree.fix or 'put it there on every node'}"
        )
    return tree.path


def _same_here(tree: ShippedTree) -> bool:
    """Whether this node sees the driver's tree, with the same content, at the driver's path."""
    try:
        return os.path.exists(tree.path) and sha256_path(tree.path, tree.files) == tree.digest
    except (OSError, UnshippableLink):  # unreadable here, or not the driver's tree: this node gets a copy
        return False


def _local_copy(tree: ShippedTree, max_bytes: int = DEFAULT_MAX_BYTES) -> Path:
    """The driver's path when this node sees the same content there, else this node's copy under
    ``node-data/<digest>/``: marked in use by this process for its life, made once (under a file
    lock, after sweeping what killed unpacks left and evicting the least recently used copies no
    process uses, down to ``max_bytes``), its digest checked. Every failure is a NodeDataError."""
    if _same_here(tree):
        return Path(tree.path)
    base = cache_base() / "node-data"
    home = base / tree.digest[:32]
    target = home / Path(tree.path).name
    try:
        _hold(base, home.name, tree)
        if not (home / _DONE).exists():
            with file_lock(base / f"{home.name}.lock", UNPACK_LOCK_TIMEOUT_S, what=f"unpacking {tree.what}"):
                if not (home / _DONE).exists():
                    _sweep(base, home.name)
                    _make_room(base, home.name, tree, max_bytes)
                    _unpack(_fetched(tree), tree, home)
        os.utime(home / _DONE)  # the least recently used copy is the first evicted
    except BaseException as exc:
        _release(base / f"{home.name}.use")
        if isinstance(exc, OSError):
            raise _os_failure(tree, base, exc) from None
        raise
    return target


def _hold(base: Path, name: str, tree: ShippedTree) -> None:
    """Mark the copy ``name`` in use by this process until it ends (an eviction holds the
    exclusive lock only for a rename, so the wait is short)."""
    use = str(base / f"{name}.use")
    if use not in _HELD:
        stack = contextlib.ExitStack()
        stack.enter_context(file_lock(use, UNPACK_LOCK_TIMEOUT_S, what=f"evicting a copy of {tree.what}", shared=True))
        _HELD[use] = stack


def _release(use: Path) -> None:
    stack = _HELD.pop(str(use), None)
    if stack is not None:
        stack.close()


def _sweep(base: Path, own: str) -> None:
    """Remove the ``<digest>.tmp-*`` folders whose unpacking process is gone: ``own``'s (this
    process holds its unpack lock) and those whose unpack lock is free or removed by an eviction."""
    for tmp in base.glob(f"*{_TMP}*"):
        name = tmp.name.split(_TMP)[0]
        lock = base / f"{name}.lock"
        if name == own or not lock.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            continue
        with contextlib.suppress(LockTimeout), file_lock(lock, 0):
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class _Copy:
    used: float
    """when a process last started using it (its marker's mtime)"""
    name: str
    size: int


def _copies(base: Path) -> list[_Copy]:
    """The complete copies under ``base``, least recently used first."""
    out = []
    for home in base.iterdir():
        if "." not in home.name:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # evicted meanwhile
                used = (home / _DONE).stat().st_mtime
                out.append(_Copy(used, home.name, sum(f.stat().st_size for f in tree_files(home))))
    return sorted(out, key=lambda c: (c.used, c.name))


def _make_room(base: Path, own: str, tree: ShippedTree, max_bytes: int) -> None:
    """Evict the least recently used copies no process uses until the copies with ``tree``'s
    fit ``max_bytes`` and its disk has room for ``tree``; a disk still too full is an error
    here, before anything is fetched."""
    base.mkdir(parents=True, exist_ok=True)
    others = [c for c in _copies(base) if c.name != own]
    total = sum(c.size for c in others) + tree.size
    for victim in others:
        if total <= max_bytes and shutil.disk_usage(base).free >= tree.size:
            break
        if _evict(base, victim.name):
            total -= victim.size
    if shutil.disk_usage(base).free < tree.size:
        raise _disk_full(tree, base)


def _evict(base: Path, name: str) -> bool:
    """Remove the copy ``name`` unless a process holds it in use; whether it went. Under its
    exclusive use lock it is renamed to a temporary folder (whole or gone, never half there) and
    its lock files are removed; the folder is deleted after (the next sweep ends a killed delete)."""
    gone = base / f"{name}{_TMP}evict-{uuid.uuid4().hex[:8]}"
    try:
        with file_lock(base / f"{name}.use", 0):
            with contextlib.suppress(FileNotFoundError):  # another process evicted it first
                os.replace(base / name, gone)
            (base / f"{name}.lock").unlink(missing_ok=True)
            (base / f"{name}.use").unlink(missing_ok=True)
    except LockTimeout:
        return False
    shutil.rmtree(gone, ignore_errors=True)
    return True


def _unpack(blob: bytes, tree: ShippedTree, home: Path) -> None:
    """Unpack ``blob`` into ``home`` (through a temporary folder renamed when whole), its digest checked."""
    tmp = home.with_name(f"{home.name}{_TMP}{uuid.uuid4().hex[:8]}")
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tf:
            tf.extractall(tmp, filter="data")  # no absolute paths, links out or devices
        got = sha256_path(tmp / Path(tree.path).name, tree.files)
        if got != tree.digest:
            raise NodeDataError(
                f"{tree.what}: the copy unpacked on {node_label()} has sha256 {got[:12]}, the driver's "
                f"{tree.digest[:12]}: {tree.path} changed on the driver since the job started; start the job again"
            )
        (tmp / _DONE).write_text(tree.path)
        shutil.rmtree(home, ignore_errors=True)  # a half-made copy of a crashed unpack
        os.replace(tmp, home)
    except tarfile.FilterError as exc:
        raise NodeDataError(
            f"{tree.what}: member {exc.tarinfo.name} of the copy from the driver refused on {node_label()} "
            f"({exc}): make it a regular file or folder in {tree.path} on the driver"
        ) from None
    except tarfile.TarError as exc:
        raise NodeDataError(
            f"{tree.what}: the copy from the driver is not a readable tar on {node_label()} ({_reason(exc)}; "
            "transient: the actor is started again)",
            permanent=False,
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _os_failure(tree: ShippedTree, base: Path, exc: OSError) -> NodeDataError:
    """The one line for what the node's disk or locks refused while making ``tree``'s copy."""
    if isinstance(exc, LockTimeout):  # another process of this node still unpacking it
        return NodeDataError(
            f"{tree.what} on {node_label()}: {exc} (transient: the actor is started again)", permanent=False
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return _disk_full(tree, base)
    return NodeDataError(
        f"{tree.what}: could not write its copy under {base} on {node_label()} ({exc.filename or base}: "
        f"{exc.strerror or _reason(exc)}): make $MEMPRISM_CACHE a writable folder on this node"
    )


def _disk_full(tree: ShippedTree, base: Path) -> NodeDataError:
    free = shutil.disk_usage(base).free if base.exists() else 0
    held = sum(c.size for c in _copies(base)) if base.exists() else 0
    return NodeDataError(
        f"{tree.what}: disk full on {node_label()}: its copy needs {tree.size:,} bytes under {base}, "
        f"{free:,} free (node-data/ holds {held:,} bytes of other copies, unused ones evicted first): make room "
        f"for it on that disk, or set MEMPRISM_CACHE on this node to a folder on a larger disk"
    )


def _rebase(obj: Any, roots: Sequence[tuple[str, Callable[[], str]]]) -> Any:
    """``obj`` with each string or path under one of ``roots`` moved under what its resolver
    returns; containers are copied only where something changed."""
    if isinstance(obj, (str, Path)):
        text = str(obj)
        for root, resolve in roots:
            if text == root or text.startswith(root.rstrip("/") + "/"):
                local = resolve()
                if local == root:
                    return obj
                moved = local + text[len(root) :]
                return Path(moved) if isinstance(obj, Path) else moved
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            new = _rebase(value, roots)
            if new is not value:
                changes[f.name] = new
        if not changes:
            return obj
        out = copy.copy(obj)
        for name, value in changes.items():
            object.__setattr__(out, name, value)  # frozen dataclasses too; no re-validation
        return out
    if isinstance(obj, dict):
        new_items = {k: _rebase(v, roots) for k, v in obj.items()}
        return obj if all(new_items[k] is obj[k] for k in obj) else type(obj)(new_items)
    if isinstance(obj, (list, tuple)):
        items = [_rebase(v, roots) for v in obj]
        if all(a is b for a, b in zip(items, obj, strict=True)):
            return obj
        return type(obj)(items) if not hasattr(obj, "_fields") else type(obj)(*items)
    return obj
