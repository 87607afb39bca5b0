"""Atomic file writes that never silently replace what is already there.

A report, a run's ``config.yaml`` or a manifest is first written in full under a temporary
name in the same directory, flushed to disk, and only then given its final name, so a crash
leaves either the old file or the new one, never half of one. Without ``overwrite=True`` an
existing file is an error (the rename is a hard link, which fails atomically when the name
is taken, so two writers cannot both win). Also the file helpers every layer shares: a
file's or a folder's SHA-256, JSON parsing with a one-line error (a document, or JSON lines), a bounded
exclusive file lock, and a directory's files as bytes and back (a checkpoint shipped between
the Ray driver and its actors).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | Path, data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; refuse an existing ``path`` unless ``overwrite``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite and target.exists():
        raise FileExistsError(f"{target} already exists; refusing to overwrite it")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # fails if the name is taken, unlike rename
            except FileExistsError:
                raise FileExistsError(f"{target} already exists; refusing to overwrite it") from None
            except OSError:  # a file system without hard links: check-then-rename is the best left
                if target.exists():
                    raise FileExistsError(f"{target} already exists; refusing to overwrite it") from None
                os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def atomic_write_text(path: str | Path, text: str, *, overwrite: bool = False, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding), overwrite=overwrite)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def tree_files(root: str | Path, files: Sequence[str] = ()) -> list[Path]:
    """The files of a tree in a fixed order: ``root`` itself when it is a file, else its files
    (or only ``files``, names relative to ``root``), sorted by relative path."""
    root = Path(root)
    if root.is_file():
        return [root]
    if files:
        return sorted(root / f for f in files)
    return sorted(p for p in root.rglob("*") if p.is_file())


def sha256_path(path: str | Path, files: Sequence[str] = ()) -> str:
    """Hex SHA-256 of a file (:func:`sha256_file`), or of a folder's files (``files``: only
    those): each one's relative path and :func:`sha256_file`, in :func:`tree_files` order, so
    renaming a file changes it and moving the folder does not. What run manifests record for a
    checkpoint folder, and what a node's copy of shipped data is checked against."""
    root = Path(path)
    if root.is_file():
        return sha256_file(root)
    h = hashlib.sha256()
    for p in tree_files(root, files):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def loads_json(text: str, what: str) -> Any:
    """``json.loads`` whose error names ``what`` was being read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def json_lines(
    lines: Iterable[str], not_json: Callable[[int, str, json.JSONDecodeError], Exception]
) -> Iterator[tuple[int, str, Any]]:
    """``(line number, line, value)`` of each non-blank line of ``lines`` (a JSONL file, or a
    block of JSON lines in a text), numbered from 1 with blank lines counted; a line that is
    not JSON raises ``not_json(line number, line, error)``: each reader says where, in its terms."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise not_json(n, line, exc) from None
        yield n, line, value


@contextlib.contextmanager
def file_lock(path: str | Path, timeout_s: float, *, what: str = "", hint: str = "") -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waited for at most ``timeout_s`` seconds (then a
    ``TimeoutError`` naming the lock, its holder, ``what`` it is doing and the ``hint``).

    The holder writes its process id into the file so a waiter that gives up can name it (the
    kernel drops the lock when its holder dies, so a timeout means the holder is still working
    or hung, never a stale file). Used where several processes of one machine build the same
    cached data: the embedded corpus, a node's copy of shipped data.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as fh:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    fh.seek(0)
                    holder = fh.read().strip() or "unknown"
                    raise TimeoutError(
                        f"waited {timeout_s:g}s for the lock {path} (held by process {holder}"
                        f"{', ' + what if what else ''}); wait for that process or stop it"
                        f"{', or ' + hint if hint else ''}"
                    ) from None
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (to ship a checkpoint across nodes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_files(files: dict[str, bytes], root: Path) -> Path:
    """Write :func:`read_files` output under ``root``; ``config.json`` last, so a crash never
    leaves a directory that looks complete (a checkpoint is complete once its ``config.json``
    exists: ``trainer/run_dir.latest_checkpoint``). Each file is replaced atomically (a
    checkpoint directory is rewritten only when its iteration is played again)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "config.json"):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"refusing to write outside {root}: {name}")
        atomic_write_bytes(root / name, files[name], overwrite=True)
    return root
