"""Atomic writes: all or nothing, and an existing file is never replaced unless asked; the
file helpers beside them: a tree's files (links followed) and the bounded file lock."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from memprism_ray import io_atomic
from memprism_ray.io_atomic import (
    LockTimeout,
    UnshippableLink,
    atomic_write_bytes,
    atomic_write_text,
    file_lock,
    read_jsonl,
    seal_jsonl,
    sha256_path,
    tree_files,
)


def test_refuses_to_overwrite_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    p = atomic_write_text(tmp_path / "sub" / "report.json", "{}\n")
    assert p.read_text() == "{}\n"
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        atomic_write_text(p, "other")
    assert p.read_text() == "{}\n"
    atomic_write_bytes(p, b"new", overwrite=True)
    assert p.read_bytes() == b"new"
    assert sorted(x.name for x in p.parent.iterdir()) == ["report.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    p = atomic_write_text(tmp_path / "config.yaml", "a: 1\n")

    with pytest.raises(TypeError):
        atomic_write_bytes(p, object(), overwrite=True)  # type: ignore[arg-type]
    assert p.read_text() == "a: 1\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["config.yaml"]


def test_tree_files_follow_symlinked_roots_folders_and_files(tmp_path: Path, linked_tree: tuple[Path, Path]) -> None:
    """Issue 40: a symlinked folder inside a tree counts with the files it points to (it was left
    out of the digest), named under the link; a root that is a symlink, absolute or relative,
    stands for its target; the digest is the one of the same tree without links."""
    real, plain = linked_tree
    names = ["a.txt", "linked/d.txt", "linked/deep/c.txt", "linked-file", "sub/b.txt"]  # sorted as paths
    (tmp_path / "abs").symlink_to(real)
    (tmp_path / "rel").symlink_to("real")
    for root in (real, tmp_path / "abs", tmp_path / "rel", plain):
        assert [p.relative_to(root).as_posix() for p in tree_files(root)] == names
        assert sha256_path(root) == sha256_path(plain)
    (tmp_path / "outside" / "deep" / "c.txt").write_text("changed")  # behind a link, still part of the tree
    assert sha256_path(real) != sha256_path(plain)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("..", r"a folder that contains it \(a loop\)"),
        (".", r"a folder that contains it \(a loop\)"),
        ("/nonexistent/x", "which does not exist"),
        ("other", "a chain of links that never ends"),
    ],
)
def test_a_link_that_cannot_be_followed_is_refused_naming_it(tmp_path: Path, target: str, why: str) -> None:
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_text("x")
    (root / "sub" / "bad").symlink_to(target)
    (root / "sub" / "other").symlink_to("bad")  # only followed in the chain case
    if target != "other":
        (root / "sub" / "other").unlink()
    with pytest.raises(UnshippableLink, match=rf"^{re.escape(str(root / 'sub'))}/(bad|other) is a symlink to .*{why}"):
        tree_files(root)
    with pytest.raises(UnshippableLink):
        sha256_path(root)


def test_a_dangling_root_link_is_refused_and_a_missing_root_has_no_files(tmp_path: Path) -> None:
    (tmp_path / "root").symlink_to(tmp_path / "gone")
    with pytest.raises(UnshippableLink, match=r"root is a symlink to .*gone, which does not exist"):
        tree_files(tmp_path / "root")
    assert tree_files(tmp_path / "missing") == []


def test_file_lock_waits_then_names_its_holder_and_shares_when_asked(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    waited = rf"waited 0.2s for the lock {re.escape(str(lock))} \(held by process \d+, unpacking it\)"
    with file_lock(lock, 1), pytest.raises(LockTimeout, match=waited), file_lock(lock, 0.2, what="unpacking it"):
        pass
    assert issubclass(LockTimeout, TimeoutError)
    with (
        file_lock(lock, 0, shared=True),
        file_lock(lock, 0, shared=True),  # readers share it
        pytest.raises(LockTimeout),
        file_lock(lock, 0),  # and exclude a writer
    ):
        pass
    with file_lock(lock, 0):  # all released
        pass


def test_a_lock_file_its_holder_removes_is_not_locked_by_a_waiter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: the node-data cache removes a copy's lock files while holding them; a process
    that waited on the removed file must lock the one now at that name, or two would hold it."""
    lock = tmp_path / "x.use"
    waiting, locked, release = threading.Event(), threading.Event(), threading.Event()
    flock_by = io_atomic._flock_by

    def polling(*args: object) -> None:  # the waiter has opened the file and tries its lock
        waiting.set()
        flock_by(*args)

    def waiter() -> None:
        with file_lock(lock, 10):
            locked.set()
            release.wait(10)

    with file_lock(lock, 0):
        monkeypatch.setattr(io_atomic, "_flock_by", polling)
        thread = threading.Thread(target=waiter)
        thread.start()
        assert waiting.wait(10)
        lock.unlink()
    assert locked.wait(10)
    with pytest.raises(LockTimeout), file_lock(lock, 0):  # the waiter holds the file at that name
        pass
    release.set()
    thread.join(10)


def test_seal_jsonl_cuts_each_torn_tail_keeps_it_and_says_so(tmp_path: Path) -> None:
    """Issue 40 item 4: any JSONL a run appends to ends with a whole line before the next append."""
    path = tmp_path / "log.jsonl"
    said: list[str] = []
    assert seal_jsonl(path, "log", said.append) == 0 and not path.exists()  # nothing to seal
    path.write_bytes(b"")
    assert seal_jsonl(path, "log", said.append) == 0 and path.read_bytes() == b""
    path.write_bytes(b'{"a": 1}\n{"a": 2}')  # whole, its newline missing: kept
    assert seal_jsonl(path, "log", said.append) == 0 and path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    for fragment in (b'{"a": 3, "b', b'{"a": 4, "\xc3'):  # the second one torn inside a UTF-8 character
        with path.open("ab") as fh:
            fh.write(fragment)
        assert seal_jsonl(path, "log", said.append) == len(fragment)
        assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    assert (tmp_path / "log.jsonl.torn").read_bytes() == b'{"a": 3, "b\n{"a": 4, "\xc3\n'
    assert said == [
        f"log {path}: line 3 was torn ({n} bytes without a newline: a writer killed mid-row); cut off before "
        "appending and kept in log.jsonl.torn"
        for n in (11, 11)
    ]
    assert read_jsonl(path, "log") == [{"a": 1}, {"a": 2}]


def test_read_jsonl_counts_lines_as_written(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n\xff\xfe\n{"a": 3}\n')
    with pytest.raises(ValueError, match=r"^log .*log\.jsonl:4 is not JSON \('utf-8' codec can't decode"):
        read_jsonl(path, "log")
    path.write_bytes(b'{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path, "log", lambda msg: pytest.fail(msg)) == [{"a": 1}, {"a": 2}]


def test_a_full_disk_names_the_file_it_could_not_hold_and_leaves_no_temporary(tmp_path, monkeypatch) -> None:
    import errno

    import pytest

    from memprism_ray import io_atomic

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io_atomic.os, "fsync", full)
    with pytest.raises(OSError) as raised:
        io_atomic.atomic_write_bytes(tmp_path / "ck" / "state.pt", b"x" * 10)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "ck" / "state.pt")
    assert list((tmp_path / "ck").iterdir()) == []


def test_holds_files_says_whether_a_builder_would_write_over_something(tmp_path: Path) -> None:
    from memprism_ray.io_atomic import holds_files

    assert not holds_files(tmp_path / "absent")
    assert not holds_files(tmp_path)  # empty
    (tmp_path / ".build").mkdir()
    assert holds_files(tmp_path) and not holds_files(tmp_path, ignore=[".build"])
    (tmp_path / "json_2.1.1").mkdir()
    assert holds_files(tmp_path, ignore=[".build"])
    assert not holds_files(tmp_path / "json_2.1.1" / "x.json")  # not a folder
