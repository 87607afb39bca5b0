"""One stand-in HTTP endpoint on 127.0.0.1 for the tests of the project's HTTP clients (the
OpenAI-compatible policy, the LLM Phi, the LLM view teacher, the memory baselines, the one
client they share): a test gives it a function from a request to a reply and keeps whatever
state it needs there."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


#: (status, body) or (status, body, headers): a body of bytes is sent as it is, ``None`` as
#: ``send_error(status)``, anything else as JSON. A reply of ``None``: the connection closes unanswered.
Reply = tuple[int, Any] | tuple[int, Any, dict[str, str]] | None


def chat_reply(content: str | None, **extra: Any) -> dict[str, Any]:
    """A chat completion whose one choice says ``content``."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}], **extra}


@contextlib.contextmanager
def json_endpoint(respond: Callable[[Request], Reply]) -> Iterator[str]:
    """Serves ``respond`` on a free port of 127.0.0.1; yields the base URL (``.../v1``)."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            reply = respond(Request(self.command, self.path, dict(self.headers), body))
            if reply is None:
                return
            status, data, *rest = reply
            if data is None:
                self.send_error(status)
                return
            raw = data if isinstance(data, bytes) else json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (rest[0] if rest else {}).items():
                self.send_header(k, v)
            try:
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):  # a client that timed out stopped listening
                pass

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    # shutdown() waits out one poll interval: 0.5 s by default, 13 s of the suite's 26 stubs.
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
