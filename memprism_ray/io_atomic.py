"""Atomic file writes that never silently replace what is already there: a file is written in
full under a temporary name, flushed, then linked to its final name (a hard link fails
atomically when the name is taken, so two writers cannot both win). Also the file helpers every
layer shares: SHA-256 of a file or folder, JSON parsing with a one-line error, a bounded file
lock, and a directory's files as bytes and back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any


def atomic_write_bytes(path: str | Path, data: bytes, *, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically; refuse an existing ``path`` unless ``overwrite``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not overwrite and target.exists():
        raise FileExistsError(f"{target} already exists; refusing to overwrite it")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with naming(target), os.fdopen(fd, "wb") as fh:
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


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """An ``OSError`` raised inside names ``path`` when it names no file: a full disk's write
    error does not, and a job's one line says which file it could not hold."""
    try:
        yield
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise


def atomic_write_text(path: str | Path, text: str, *, overwrite: bool = False, encoding: str = "utf-8") -> Path:
    """:func:`atomic_write_bytes` for text."""
    return atomic_write_bytes(path, text.encode(encoding), overwrite=overwrite)


def holds_files(root: str | Path, ignore: Iterable[str] = ()) -> bool:
    """Whether ``root`` is a folder holding anything but the names in ``ignore``: a folder a
    builder (a corpus, a fixture) must not write into unless it holds that builder's own build."""
    root, skip = Path(root), set(ignore)
    return root.is_dir() and any(p.name not in skip for p in root.iterdir())


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class UnshippableLink(ValueError):
    """A symlink in a tree that cannot be followed (issue 40): one pointing nowhere, a chain of
    links that never ends, or one pointing at a folder that contains it (a loop)."""


def tree_files(root: str | Path, files: Sequence[str] = ()) -> list[Path]:
    """``root`` itself when it is a file, else its files (or only ``files``), sorted by path.
    Symlinks are followed (issue 40): a symlinked root, folder or file stands for what it points
    to, under the link's own name, so a tree's digest covers exactly what a copy of it holds; a
    link that cannot be followed is refused with :class:`UnshippableLink` naming it."""
    root = Path(root)
    if root.is_file():
        return [root]
    if files:
        return sorted(root / f for f in files)
    if root.is_symlink() and not root.exists():
        raise _unfollowable(root, root)
    out: list[Path] = []
    if root.is_dir():
        _walk(root, root, frozenset(), out)
    return sorted(out)


def _walk(root: Path, folder: Path, above: frozenset[tuple[int, int]], out: list[Path]) -> None:
    """Append the files under ``folder`` (links followed) to ``out``; ``above``: the (device,
    inode) of every folder on the way down from ``root``, to tell a loop from a second path."""
    here = folder.stat()
    above = above | {(here.st_dev, here.st_ino)}
    with os.scandir(folder) as entries:
        for entry in entries:
            path = Path(entry.path)
            try:
                st = path.stat()
            except OSError:
                if entry.is_symlink():
                    raise _unfollowable(path, root) from None
                raise
            if stat.S_ISDIR(st.st_mode):
                if entry.is_symlink() and Path(os.path.realpath(folder)).is_relative_to(os.path.realpath(path)):
                    raise UnshippableLink(
                        f"{path} is a symlink to {os.readlink(path)}, a folder that contains it (a loop): remove the "
                        "link or point it at a folder that does not contain it"
                    )
                if (st.st_dev, st.st_ino) in above:  # a loop without a link (a bind mount)
                    raise UnshippableLink(f"{path} is a folder that contains itself (a loop): unmount it")
                _walk(root, path, above, out)
            elif stat.S_ISREG(st.st_mode):
                out.append(path)


def _unfollowable(link: Path, root: Path) -> UnshippableLink:
    try:
        os.stat(link)
        why = "which cannot be read"
    except OSError as exc:
        why = "a chain of links that never ends" if exc.errno == errno.ELOOP else "which does not exist"
    return UnshippableLink(
        f"{link} is a symlink to {os.readlink(link)}, {why}: remove the link or point it at a file or folder"
        + ("" if link == root else f" (it is inside {root})")
    )


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


class LockTimeout(TimeoutError):
    """:func:`file_lock` waited its ``timeout_s`` in vain (a ``TimeoutError``, told apart from
    other timeouts inside the locked block)."""


def utf8_lines(lines: Iterable[bytes], bad: Callable[[int, UnicodeDecodeError], Exception]) -> Iterator[str]:
    """Each of ``lines`` decoded as UTF-8; a line that is not raises ``bad(line number, error)``."""
    for n, raw in enumerate(lines, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise bad(n, exc) from None


def _warn(msg: str) -> None:
    print(f"memprism: warning: {msg}", file=sys.stderr, flush=True)


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def read_jsonl(path: str | Path, what: str, warn: Callable[[str], None] | None = None) -> list[Any]:
    """Every row of the JSONL file ``path`` that a run appends to (issue 40 item 4: nothing skipped
    silently). A last line without its newline that is not JSON is a row torn by a killed
    writer: skipped, and said through ``warn`` (default: a warning on stderr) with its line and
    size; :func:`seal_jsonl` cuts it off before the next append. Any other line that is not
    JSON is damage no writer of this project leaves: a one-line ``ValueError`` naming ``what``,
    the file and the line."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline
    if last.strip() and not _is_json(last):
        (warn or _warn)(
            f"{what} {path}: line {len(lines) + 1} is torn ({len(last)} bytes without a newline: a writer killed "
            "mid-row); skipped"
        )
    elif last.strip():
        lines.append(last)  # whole, only its newline missing

    def damaged(n: int, exc: Exception) -> ValueError:
        why = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        return ValueError(
            f"{what} {path}:{n} is not JSON ({why}); only a last line can be torn by a killed writer, so this one "
            "was damaged otherwise: remove that line (or move the file aside) and run again"
        )

    text = utf8_lines(lines, damaged)
    return [row for _, _, row in json_lines(text, lambda n, _, exc: damaged(n, exc))]


def seal_jsonl(path: str | Path, what: str, warn: Callable[[str], None] | None = None) -> int:
    """Make the JSONL file ``path`` end with a whole line before anything is appended to it, so
    that a row never lands glued to a fragment (issue 40 item 4). A last line without its
    newline that is JSON gets the newline; one that is not (a writer killed mid-row) is cut off,
    kept in ``<path>.torn`` first (one fragment per line) and said through ``warn`` (default: a
    warning on stderr) with its line, size and where it went. Returns the bytes cut off."""
    path = Path(path)
    if not path.is_file():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    start = data.rfind(b"\n") + 1
    tail = data[start:]
    with path.open("r+b") as fh:
        if _is_json(tail):
            fh.seek(len(data))
            fh.write(b"\n")
            return 0
        torn = path.with_name(path.name + ".torn")
        with torn.open("ab") as keep:  # kept before it is cut: a kill between the two loses nothing
            keep.write(tail + b"\n")
            keep.flush()
            os.fsync(keep.fileno())
        fh.truncate(start)
    line = data.count(b"\n", 0, start) + 1
    (warn or _warn)(
        f"{what} {path}: line {line} was torn ({len(tail)} bytes without a newline: a writer killed mid-row); "
        f"cut off before appending and kept in {torn.name}"
    )
    return len(tail)


@contextlib.contextmanager
def file_lock(
    path: str | Path, timeout_s: float, *, what: str = "", hint: str = "", shared: bool = False
) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (``shared``: a shared one, which only an exclusive one
    excludes), waited for at most ``timeout_s`` seconds (0: one try), then a :class:`LockTimeout`
    naming its holder, whose process id the file holds (an exclusive holder writes it): the
    kernel drops the lock when its holder dies, so a timeout means a holder still working or
    hung. A holder may delete ``path`` while it holds it: a waiter then locks the file now at
    that name rather than the deleted one (issue 40: the node-data cache removes its lock files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        fh = path.open("a+")
        try:
            _flock_by(fh, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, deadline)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            waited = f"waited {timeout_s:g}s for the lock {path}" if timeout_s else f"the lock {path} is taken"
            raise LockTimeout(
                f"{waited} (held by process {holder}{', ' + what if what else ''}); wait for that process or stop it"
                f"{', or ' + hint if hint else ''}"
            ) from None
        if _names(fh, path):
            break
        fh.close()  # removed by its holder while this process waited: lock the file now there
    with fh:
        try:
            if not shared:
                fh.seek(0)
                fh.truncate()
                fh.write(str(os.getpid()))
                fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _flock_by(fh: IO[str], mode: int, deadline: float) -> None:
    """``flock(fh, mode)``, tried until ``deadline`` (then ``BlockingIOError``)."""
    while True:
        try:
            fcntl.flock(fh, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def _names(fh: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the open file ``fh``."""
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fh.fileno())
    return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)


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
