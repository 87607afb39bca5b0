"""The EB-ALFRED fixture's transcript file (``transcripts.json``; docs/ebalfred.md): written by
``benchmark/ebalfred/fixture.py``, replayed by the fake controller (``benchmark/ebalfred/fake.py``) and
read by the scripted fixture stand-in (``benchmark/ebalfred/stand_in.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURE_VERSION = 3


def load_transcripts(root: str | Path) -> dict[str, Any]:
    """The fixture's transcripts; a one-line error when the folder holds no fixture."""
    path = Path(root) / "transcripts.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"no EB-ALFRED fixture at {root} (missing transcripts.json); build one with "
            "memprism_ray.benchmark.ebalfred.fixture.build_fixture(PATH)"
        )
    doc = json.loads(path.read_text())
    if doc.get("version") != FIXTURE_VERSION:
        raise ValueError(f"{path}: fixture version {doc.get('version')!r}, this code reads {FIXTURE_VERSION}")
    return doc
