"""Data the actors read, on every node of a cluster (issue 34; docs/cluster.md "What each node
needs on disk"): :func:`ship` turns the benchmark's :class:`~memprism_ray.benchmark.DataTree`
list into one :class:`NodeData` that every data-reading actor gets with its constructor; the
trees the job owns are shipped (as uncompressed tars: gzip saved 7 % on a D1 checkpoint's
weights for 3.3 s of packing), the user's are checked where each actor starts.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import ray

from memprism_ray.benchmark import DataTree
from memprism_ray.envs.base import cache_base
from memprism_ray.io_atomic import file_lock, sha256_path, tree_files

#: Longest wait for another process of this node unpacking the same tree.
UNPACK_LOCK_TIMEOUT_S = 600.0
#: Longest wait for a tree packed on the driver's node to arrive.
FETCH_TIMEOUT_S = 600.0
_DONE = ".memprism-complete"


class NodeDataError(RuntimeError):
    """An actor's data is not on its node (one line: the node, the path, the fix)."""


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

    def localize(self, obj: Any) -> Any:
        """``obj`` with every path under a shipped tree pointing at this node's copy (unpacked
        on first use), after checking that every user tree it names exists here."""
        if not self.shipped and not self.checked:
            return obj
        roots: dict[str, Callable[[], str]] = {t.path: partial(_resolve, t) for t in self.shipped}
        for tree in self.checked:
            roots.setdefault(tree.path, partial(_check, tree))
        return _rebase(obj, sorted(roots.items(), key=lambda kv: -len(kv[0])))


def ship(trees: Iterable[DataTree], log: Callable[[str], None] | None = None) -> NodeData:
    """The driver's side (after ``ray.init``): identify every owned tree (nothing is packed until
    a node asks), keep the user's to be checked. A user tree inside another tree of ``trees`` is
    not kept on its own (:meth:`NodeData.localize` matches the longest root first, so its own
    check would shadow a shipped copy)."""
    trees = list(trees)
    shipped, checked = [], []
    node = ray.get_runtime_context().get_node_id()
    for tree in trees:
        if not tree.owned:
            if not _inside_another(tree, trees):
                checked.append(tree)
            continue
        path = Path(tree.path)
        if not path.exists():
            raise FileNotFoundError(f"{tree.what} {path} does not exist on the driver")
        size = sum(f.stat().st_size for f in tree_files(path, tree.files))
        shipped.append(ShippedTree(tree.path, tree.what, sha256_path(path, tree.files), size, tree.files, node))
    for t in shipped if log else ():
        log(f"node data: {t.what} shipped to every node that lacks it ({t.size / 1e6:.1f} MB, sha256 {t.digest[:12]})")
    for t in checked if log else ():
        log(f"node data: {t.what} {t.path} must exist on every node (checked where each actor starts)")
    return NodeData(tuple(shipped), tuple(checked))


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
    """An uncompressed tar of the tree (or of ``files`` of it), named by its last component."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        if path.is_file() or not files:
            tf.add(path, arcname=path.name)
        else:
            for f in tree_files(path, files):
                tf.add(f, arcname=f"{path.name}/{f.relative_to(path).as_posix()}")
    return buf.getvalue()


@ray.remote(num_cpus=0, max_retries=1)
def _pack_task(path: str, files: tuple[str, ...]) -> bytes:
    """Runs on the driver's node (node affinity): the tree as a node without it needs it."""
    return _pack(Path(path), files)


#: digest -> this process's local copy (a process unpacks or checks a tree once).
_LOCAL: dict[str, str] = {}


def _resolve(tree: ShippedTree) -> str:
    if tree.digest not in _LOCAL:
        _LOCAL[tree.digest] = str(_local_copy(tree))
    return _LOCAL[tree.digest]


def _check(tree: DataTree) -> str:
    if not os.path.exists(tree.path):
        raise NodeDataError(
            f"{tree.what} {tree.path} does not exist on {node_label()}: {tree.fix or 'put it there on every node'}"
        )
    return tree.path


def _same_here(tree: ShippedTree) -> bool:
    """Whether this node sees the driver's tree, with the same content, at the driver's path."""
    return os.path.exists(tree.path) and sha256_path(tree.path, tree.files) == tree.digest


def _local_copy(tree: ShippedTree) -> Path:
    """The driver's path when this node sees the same content there, else this node's unpacked
    copy (made once, under a file lock, its digest checked)."""
    if _same_here(tree):
        return Path(tree.path)
    home = cache_base() / "node-data" / tree.digest[:32]
    target = home / Path(tree.path).name
    if (home / _DONE).exists():
        return target
    with file_lock(home.with_name(home.name + ".lock"), UNPACK_LOCK_TIMEOUT_S, what=f"unpacking {tree.what}"):
        if (home / _DONE).exists():
            return target
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            on_driver = NodeAffinitySchedulingStrategy(node_id=tree.source_node, soft=False)
            ref = _pack_task.options(scheduling_strategy=on_driver).remote(tree.path, tree.files)
            blob = ray.get(ref, timeout=FETCH_TIMEOUT_S)
        except Exception as exc:
            raise NodeDataError(
                f"{tree.what} could not be fetched from the driver to {node_label()} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        tmp = home.with_name(f"{home.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:") as tf:
                tf.extractall(tmp, filter="data")  # no absolute paths, links out or devices
            got = sha256_path(tmp / Path(tree.path).name, tree.files)
            if got != tree.digest:
                raise NodeDataError(
                    f"{tree.what}: the copy unpacked on {node_label()} has sha256 {got[:12]}, the driver's "
                    f"{tree.digest[:12]}"
                )
            (tmp / _DONE).write_text(tree.path)
            shutil.rmtree(home, ignore_errors=True)  # a half-made copy of a crashed unpack
            os.replace(tmp, home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


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
