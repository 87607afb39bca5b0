"""docs/memory.md's agent runs as written: its code block, against a stub OpenAI-compatible
server on 127.0.0.1 and the test corpus, plays steps with the view sent as an image."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

ROOT = Path(__file__).resolve().parents[1]


class _Chat(BaseHTTPRequestHandler):
    """Answers every chat completion with the first action the prompt offers; keeps the requests."""

    seen: ClassVar[list] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Chat.seen.append(body)
        parts = body["messages"][-1]["content"]
        text = parts if isinstance(parts, str) else next(p["text"] for p in parts if p["type"] == "text")
        offered = re.search(r"Choose one of: (.*?)\. Answer", text, re.S)
        action = offered.group(1).split(", ")[0] if offered else "look"
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": action}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_the_documented_agent_runs_with_the_view_as_an_image(memprism_tiny_corpus: Path, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "memory.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    script = tmp_path / "agent.py"
    script.write_text(code)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {**os.environ, "ALFWORLD_DATA": str(memprism_tiny_corpus), "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": ""}
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        done = subprocess.run(
            [sys.executable, str(script), url, "stub-model"], capture_output=True, text=True, timeout=600, env=env
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert all(line.startswith(f"step {i}: view TemporalTrace") for i, line in enumerate(lines[:-1]))
    assert re.match(r"(won|not won) after \d+ steps", lines[-1])
    images = [
        p for body in _Chat.seen if isinstance(body["messages"][-1]["content"], list)
        for p in body["messages"][-1]["content"] if p["type"] == "image_url"
    ]  # fmt: skip
    assert len(_Chat.seen) == len(lines) - 1 and len(images) >= len(_Chat.seen) - 1
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in images)
