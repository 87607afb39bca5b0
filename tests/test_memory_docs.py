"""docs/memory.md's agent runs as written: its code block, against a stub OpenAI-compatible
server on 127.0.0.1 and the test corpus, plays steps with the view sent as an image."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from json_endpoint import Reply, Request, chat_reply, json_endpoint

ROOT = Path(__file__).resolve().parents[1]
SEEN: list[dict] = []


def _chat(request: Request) -> Reply:
    """Answers every chat completion with the first action the prompt offers; keeps the requests."""
    body = request.json()
    SEEN.append(body)
    parts = body["messages"][-1]["content"]
    text = parts if isinstance(parts, str) else next(p["text"] for p in parts if p["type"] == "text")
    offered = re.search(r"Choose one of: (.*?)\. Answer", text, re.S)
    return 200, chat_reply(offered.group(1).split(", ")[0] if offered else "look")


def test_the_documented_agent_runs_with_the_view_as_an_image(memprism_tiny_corpus: Path, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "memory.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    script = tmp_path / "agent.py"
    script.write_text(code)
    with json_endpoint(_chat) as url:
        env = {**os.environ, "ALFWORLD_DATA": str(memprism_tiny_corpus), "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": ""}
        done = subprocess.run(
            [sys.executable, str(script), url, "stub-model"], capture_output=True, text=True, timeout=600, env=env
        )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert all(line.startswith(f"step {i}: view TemporalTrace") for i, line in enumerate(lines[:-1]))
    assert re.match(r"(won|not won) after \d+ steps", lines[-1])
    images = [
        p for body in SEEN if isinstance(body["messages"][-1]["content"], list)
        for p in body["messages"][-1]["content"] if p["type"] == "image_url"
    ]  # fmt: skip
    assert len(SEEN) == len(lines) - 1 and len(images) >= len(SEEN) - 1
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in images)
