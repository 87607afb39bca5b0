"""Atomic file writes that never silently replace what is already there: a file is written in
full under a temporary name, flushed, then linked to its final name (a hard link fails
atomically when the name is taken, so two writers cannot both win). Also the file helpers every
layer shares: SHA-256 of a file or folder, JSON parsing with a one-line error, a bounded file
lock, and a directory's files as bytes and back.
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
    """``root`` itself when it is a file, else its files (or only ``files``), sorted by path."""
    root = Path(root)
    if root.is_file():
        return [root]
    if files:
        return sorted(root / f for f in files)
    return sorted(p for p in root.rglob("*") if p.is_file())


def sha256_path(path: str | Path, files: Sequence[str] = ()) -> str:
    """Hex SHA-256 of a file, or of a folder's files (``files``: only those) over each one's relative
    path and hash, so renaming a file changes it and moving the folder does not."""
    root = Path(path)
    if root.is_file():
        return sha256_file(root)
    h = hashlib.sha256()
    for p in tree_files(root, files):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def loads_json(text: str, what: str, fix: str = "") -> Any:
    """``json.loads`` whose one-line error names ``what`` was being read (a file: name it), the
    line and column, and ``fix`` when given."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}{'; ' + fix if fix else ''}") from None


def json_lines(
    lines: Iterable[str], not_json: Callable[[int, str, json.JSONDecodeError], Exception]
) -> Iterator[tuple[int, str, Any]]:
    """``(line number, line, value)`` of each non-blank line of ``lines`` (numbered from 1, blank
    lines counted); a line that is not JSON raises ``not_json(line number, line, error)``."""
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
    ``TimeoutError`` naming its holder, whose process id the file holds: the kernel drops the
    lock when its holder dies, so a timeout means a holder still working or hung)."""
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
    return {str(p.relative_to(root)): p.read_bytes() for p in tree_files(root)}


def write_files(files: dict[str, bytes], root: Path) -> Path:
    """Write :func:`read_files` output under ``root``, each file replaced atomically and
    ``config.json`` last (a checkpoint is complete once its ``config.json`` exists)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "config.json"):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"refusing to write outside {root}: {name}")
        atomic_write_bytes(root / name, files[name], overwrite=True)
    return root
