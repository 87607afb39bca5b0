"""Atomic writes: all or nothing, and an existing file is never replaced unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprism_ray.io_atomic import atomic_write_bytes, atomic_write_text, read_jsonl, seal_jsonl


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
