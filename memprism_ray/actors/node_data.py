"""Data the actors read, on every node of a cluster (issue 34; docs/cluster.md "What each node
needs on disk").

The driver resolves a benchmark's data once (:meth:`Benchmark.prepare`): it builds the embedded
corpus or a fixture in its own cache or run directory, or checks the user's data root, and the
actors' configs and games then name those paths. A worker node with a disk of its own has none
of them. :func:`ship` turns the benchmark's :class:`~memprism_ray.benchmark.DataTree` list (and
the checkpoints the Learner loads) into one :class:`NodeData` that every data-reading actor gets
with its constructor:

- a tree the job owns is archived once by the driver (content digest over every file, a
  gzip'd tar in the object store: the default embedded corpus is 10 MB in 435 files, 1.5 MB
  shipped, 0.1 s to pack); an actor whose node sees the driver's path with the same digest
  (one machine, shared storage) reads it there, any other node unpacks it once into its
  content-addressed cache ``$MEMPRISM_CACHE/node-data/<digest>/`` under a file lock;
- a tree the user gave (``corpus.data_root``, the Mind2Web release, EB-ALFRED's episode lists)
  is checked where the actor starts: missing, the actor refuses in one line naming the node,
  the path and the fix (:class:`NodeDataError`).

:meth:`NodeData.localize` rewrites every path under a shipped tree in a config, an options
mapping or a game (dataclasses, mappings, sequences, strings and ``Path`` alike) to where it
lies on this node. Nothing is written into the run directory from an actor: the driver writes
every file there, as before.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from memprism_ray.benchmark import DataTree
from memprism_ray.envs.base import cache_base
from memprism_ray.io_atomic import file_lock

#: Longest wait for another process of this node unpacking the same tree.
UNPACK_LOCK_TIMEOUT_S = 600.0
#: Longest wait for a shipped archive to arrive from the driver's object store.
FETCH_TIMEOUT_S = 600.0
_DONE = ".memprism-complete"


class NodeDataError(RuntimeError):
    """An actor's data is not on its node (one line: the node, the path, the fix)."""


def node_place() -> dict[str, Any]:
    """Where the calling process runs: Ray node id and address, host name, process id."""
    import socket

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
    }


def node_label(place: dict[str, Any] | None = None) -> str:
    """``node 10.0.0.3 (ab12cd34)``: the address and the start of the node id, since several
    nodes of one machine share an address."""
    place = place or node_place()
    return f"node {place['node_ip']} ({str(place['node_id'])[:8]})"


def tree_digest(path: str | Path) -> str:
    """SHA-256 over a file, or over a folder's files (relative path and content digest of
    each, in sorted order): the identity a node's copy is checked against."""
    root = Path(path)
    h = hashlib.sha256()
    if root.is_file():
        h.update(b"file\0" + hashlib.sha256(root.read_bytes()).digest())
        return h.hexdigest()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@dataclass(frozen=True)
class ShippedTree:
    """One tree the driver shipped: its path on the driver, digest and archive (object ref)."""

    path: str
    what: str
    digest: str
    size: int
    """bytes of the compressed archive"""
    archive: Any
    """``ObjectRef`` of the archive's bytes (fetched only by a node without a copy)"""


@dataclass(frozen=True)
class NodeData:
    """What the actors read, as :func:`ship` made it (see the module docstring). The empty
    value localizes nothing: tests and single-process tools pass it."""

    shipped: tuple[ShippedTree, ...] = ()
    checked: tuple[DataTree, ...] = ()

    def __add__(self, other: NodeData) -> NodeData:
        return NodeData(self.shipped + other.shipped, self.checked + other.checked)

    def localize(self, obj: Any) -> Any:
        """``obj`` with every path under a shipped tree pointing at this node's copy (unpacked
        on first use), after checking that every user tree it names exists here."""
        if not self.shipped and not self.checked:
            return obj
        roots: dict[str, Callable[[], str]] = {t.path: _resolver(t) for t in self.shipped}
        for tree in self.checked:
            roots.setdefault(tree.path, _checker(tree))
        return _rebase(obj, sorted(roots.items(), key=lambda kv: -len(kv[0])))

    def describe(self) -> list[str]:
        """One line per tree, for the driver's log."""
        lines = [
            f"node data: {t.what} shipped to every node that lacks it ({t.size / 1e6:.1f} MB, sha256 {t.digest[:12]})"
            for t in self.shipped
        ]
        lines += [
            f"node data: {t.what} {t.path} must exist on every node (checked where each actor starts)"
            for t in self.checked
        ]
        return lines


def ship(trees: Iterable[DataTree], log: Callable[[str], None] | None = None) -> NodeData:
    """The driver's side: archive every owned tree into the object store, keep the user's to
    be checked. Call after ``ray.init``; keep the result alive while actors may start (its
    object refs pin the archives)."""
    shipped, checked = [], []
    for tree in trees:
        if not tree.owned:
            checked.append(tree)
            continue
        path = Path(tree.path)
        if not path.exists():
            raise FileNotFoundError(f"{tree.what} {path} does not exist on the driver")
        blob = _pack(path)
        shipped.append(ShippedTree(tree.path, tree.what, tree_digest(path), len(blob), ray.put(blob)))
    data = NodeData(tuple(shipped), tuple(checked))
    for line in data.describe() if log else ():
        log(line)
    return data


def _pack(path: Path) -> bytes:
    buf = io.BytesIO()
    # compresslevel 1: 7x smaller than the plain tar for the corpus's JSON and PDDL, in 0.1 s
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tf:
        tf.add(path, arcname=path.name)
    return buf.getvalue()


#: digest -> this process's local copy (a process unpacks or checks a tree once).
_LOCAL: dict[str, str] = {}


def _resolver(tree: ShippedTree) -> Callable[[], str]:
    def resolve() -> str:
        if tree.digest not in _LOCAL:
            _LOCAL[tree.digest] = str(_local_copy(tree))
        return _LOCAL[tree.digest]

    return resolve


def _checker(tree: DataTree) -> Callable[[], str]:
    def check() -> str:
        if not os.path.exists(tree.path):
            raise NodeDataError(
                f"{tree.what} {tree.path} does not exist on {node_label()}: {tree.fix or 'put it there on every node'}"
            )
        return tree.path

    return check


def _local_copy(tree: ShippedTree) -> Path:
    """The driver's path when this node sees the same content there, else this node's
    unpacked copy under ``$MEMPRISM_CACHE/node-data/<digest>/``."""
    if os.path.exists(tree.path) and tree_digest(tree.path) == tree.digest:
        return Path(tree.path)
    home = cache_base() / "node-data" / tree.digest[:32]
    target = home / Path(tree.path).name
    if (home / _DONE).exists():
        return target
    with file_lock(home.with_name(home.name + ".lock"), UNPACK_LOCK_TIMEOUT_S, what=f"unpacking {tree.what}"):
        if (home / _DONE).exists():
            return target
        try:
            blob = ray.get(tree.archive, timeout=FETCH_TIMEOUT_S)
        except Exception as exc:
            raise NodeDataError(
                f"{tree.what} could not be fetched from the driver to {node_label()} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        tmp = home.with_name(f"{home.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tf:
                tf.extractall(tmp, filter="data")  # no absolute paths, links out or devices
            got = tree_digest(tmp / Path(tree.path).name)
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
