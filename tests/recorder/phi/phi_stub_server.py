"""A deterministic OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1 for the LLM
Phi tests (imported by path from tests/actors too).

The answer is chosen by a ``MODE=<name>`` marker anywhere in the prompt text:

* ``valid``: the answer in ``answers[<tag>]`` (``TAG=<tag>`` in the prompt) or a fixed
  ALFWorld answer, as bare JSON, with a ``usage`` block (17 prompt / 5 completion tokens);
* ``prose``: the same JSON wrapped in prose and a markdown fence;
* ``badkey``: a Mind2Web answer with a key outside the six allowed ones;
* ``malformed``: a brace-delimited text that is not JSON;
* ``nojson``: a reply without any brace;
* ``flaky``: HTTP 500 on the first request of that prompt, then ``valid``;
* ``down``: HTTP 503 every time;
* ``slow``: sleeps ``slow_s`` before answering ``valid`` (longer than the client's timeout).

No marker answers ``valid``. Every request body is kept in ``bodies``; ``max_active`` is
the peak number of requests handled at once.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from typing import Any

from json_endpoint import Reply, Request, chat_reply, json_endpoint

ALFWORLD_ANSWER = {
    "entity": "drawer 1",
    "act_type": "go",
    "delta_s": [{"key": "location", "new_value": "drawer 1"}, {"key": "drawer 1", "new_value": "closed"}],
}
MIND2WEB_BAD = {"delta_s": [{"key": "price", "new_value": "$3"}]}
PROMPT_TOKENS, COMPLETION_TOKENS = 17, 5


class PhiStubServer:
    def __init__(self, delay_s: float = 0.0, slow_s: float = 3.0) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.answers: dict[str, Any] = {}
        self.active = 0
        self.max_active = 0
        self.seen: dict[str, int] = {}
        self.delay_s, self.slow_s = delay_s, slow_s
        self.lock = threading.Lock()
        self._served = contextlib.ExitStack()
        self.base_url = ""

    def __call__(self, request: Request) -> Reply:
        body = request.json()
        content = body["messages"][0]["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        mode_m = re.search(r"MODE=(\w+)", text)
        tag_m = re.search(r"TAG=(\w+)", text)
        mode = mode_m.group(1) if mode_m else "valid"
        with self.lock:
            self.bodies.append(body)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.seen[text] = nth = self.seen.get(text, 0) + 1
        try:
            time.sleep(self.delay_s + (self.slow_s if mode == "slow" else 0.0))
            if mode == "down" or (mode == "flaky" and nth == 1):
                return 503 if mode == "down" else 500, {"error": "busy"}
            answer = self.answers.get(tag_m.group(1)) if tag_m else None
            payload = json.dumps(answer if answer is not None else ALFWORLD_ANSWER)
            reply = {
                "prose": f"Sure, here is the event:\n```json\n{payload}\n```\nThat is all.",
                "badkey": json.dumps(MIND2WEB_BAD),
                "malformed": "{'entity': 'drawer 1', 'act_type': go}",
                "nojson": "I cannot annotate this event.",
            }.get(mode, payload)
            return 200, chat_reply(
                reply, usage={"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS}
            )
        finally:
            with self.lock:
                self.active -= 1

    def __enter__(self) -> PhiStubServer:
        self.base_url = self._served.enter_context(json_endpoint(self))
        return self

    def __exit__(self, *exc: object) -> None:
        self._served.close()
