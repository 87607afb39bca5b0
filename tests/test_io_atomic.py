"""Atomic writes: all or nothing, and an existing file is never replaced unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprism_ray.io_atomic import atomic_write_bytes, atomic_write_text


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
