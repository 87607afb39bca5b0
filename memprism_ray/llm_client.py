"""One client for every OpenAI-compatible chat endpoint the system talks to: the task policy
(paper "Experiment Setup"), the LLM view teacher of D1 (appendix E.2), the LLM Phi (appendix
E.1) and the memory baselines (appendix "External baselines": "All auxiliary model calls and
their token or API costs are included in the efficiency results").

Retries back off exponentially (or as ``Retry-After`` asks, capped by ``max_backoff_s``) after a
connection error, a timeout or HTTP 408/409/429/5xx; another 4xx is final. Costs go into one
:class:`LLMCounters`. The bottom layer: no ray, nothing of the project imported."""

from __future__ import annotations

import base64
import email.utils
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from memprism_ray.config_tree import field as cfg_field

if TYPE_CHECKING:  # httpx loads with the first client: importing a config stays light
    import httpx

#: Statuses a server uses for "not now" (timeout, conflict, rate limit, overload): retried.
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class EndpointConfig:
    """Where an OpenAI-compatible endpoint is and how hard to try it; a subclass names its config
    section in ``SECTION`` (for error messages)."""

    SECTION: ClassVar[str] = "endpoint"
    #: False where an empty ``base_url`` means "not configured" (checked by the user).
    BASE_URL_REQUIRED: ClassVar[bool] = True

    base_url: str = cfg_field("http://127.0.0.1:8000/v1", help="endpoint root (…/v1); /chat/completions is appended")
    model: str = cfg_field("", help="model name sent in each request")
    api_key_env: str = cfg_field("OPENAI_API_KEY", help="environment variable holding the bearer key ('': none)")
    timeout_s: float = cfg_field(120.0, help="per-request timeout in seconds")
    max_retries: int = cfg_field(
        3, help="retries after a timeout, connection error, HTTP 408/409/429/5xx or a reply that is no chat completion"
    )
    backoff_s: float = cfg_field(0.5, help="first retry delay in seconds, doubled each retry")
    max_backoff_s: float = cfg_field(20.0, help="longest retry delay in seconds (also caps the server's Retry-After)")

    def __post_init__(self) -> None:
        s = self.SECTION
        if (self.base_url or self.BASE_URL_REQUIRED) and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"{s}.base_url must start with http:// or https://, got {self.base_url!r}")
        if not 0.0 < self.timeout_s < math.inf:
            raise ValueError(f"{s}.timeout_s must be a finite number of seconds > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"{s}.max_retries must be >= 0, got {self.max_retries}")
        if not 0.0 <= self.backoff_s <= self.max_backoff_s < math.inf:
            raise ValueError(
                f"{s}: need 0 <= backoff_s <= max_backoff_s, got backoff_s={self.backoff_s}, "
                f"max_backoff_s={self.max_backoff_s}"
            )

    def api_key(self) -> str:
        """The bearer key from ``$api_key_env`` ('' when unset or no variable is named)."""
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def budget_s(self) -> float:
        """The longest one call can take with every retry: what a caller waiting on it must allow."""
        return (self.max_retries + 1) * self.timeout_s + self.max_retries * self.max_backoff_s


class LLMCounters(Mapping[str, int]):
    """What one user's calls cost, cumulative and thread-safe (``no_usage``: replies without a
    ``usage``, whose tokens are never guessed); a read-only mapping."""

    KEYS = ("requests", "retries", "failures", "prompt_tokens", "completion_tokens", "no_usage")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = dict.fromkeys(self.KEYS, 0)

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._n[key] += n

    def charge(self, body: Any) -> tuple[int, int] | None:
        """Count the ``usage`` of a reply body; returns ``(prompt, completion)`` or ``None``."""
        usage = usage_of(body)
        with self._lock:
            if usage is None:
                self._n["no_usage"] += 1
            else:
                self._n["prompt_tokens"] += usage[0]
                self._n["completion_tokens"] += usage[1]
        return usage

    def __getitem__(self, key: str) -> int:
        return self._n[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._n)

    def __len__(self) -> int:
        return len(self._n)

    def __repr__(self) -> str:
        return f"LLMCounters({self._n})"


class LLMError(RuntimeError):
    """A chat call that gave no usable answer."""


class LLMUnavailable(LLMError):
    """No answer after the retries: unreachable, timed out, or HTTP 408/409/429/5xx each time."""


class LLMRefused(LLMError):
    """The server refused the request (a 4xx that is not retried, e.g. a prompt too long)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LLMReplyError(LLMError):
    """The server answered, but not with a chat completion (each retry too): a proxy's error
    page, a body without ``choices``; never the model's own answer, which is text, maybe empty."""


@dataclass(frozen=True)
class ChatReply:
    """The assistant message of a chat completion: text, ``tool_calls`` and usage."""

    text: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    usage: tuple[int, int] | None = None


def usage_of(body: Any) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a reply body (``input/output_tokens`` of the
    Responses API too), or ``None`` when it carries no such ``usage``."""
    usage = body.get("usage") if isinstance(body, Mapping) else None
    if not isinstance(usage, Mapping):
        return None
    p = usage.get("prompt_tokens", usage.get("input_tokens"))
    c = usage.get("completion_tokens", usage.get("output_tokens"))
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (p, c))
    return (p, c) if ok else None


def parse_chat(body: Any) -> ChatReply:
    """The :class:`ChatReply` of a ``/chat/completions`` body; raises when it is not one."""
    message = body["choices"][0]["message"]
    content = message.get("content")
    tool_calls = tuple(message.get("tool_calls") or ())
    if isinstance(content, list):  # some servers return content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content is None:  # tool calls only, or a model that said nothing (its budget spent reasoning)
        content = ""
    if not isinstance(content, str):
        raise TypeError(f"message content is {type(content).__name__}, not text")
    return ChatReply(content, tool_calls, usage_of(body))


def png_part(png: bytes) -> dict[str, Any]:
    """An ``image_url`` content part holding ``png`` as a base64 ``data:`` URL."""
    if not isinstance(png, (bytes, bytearray)) or bytes(png[:8]) != PNG_SIGNATURE:
        raise ValueError("a request image is not PNG bytes (it must start with the PNG signature)")
    url = "data:image/png;base64," + base64.b64encode(bytes(png)).decode("ascii")
    return {"type": "image_url", "image_url": {"url": url}}


def user_content(text: str, pngs: Sequence[bytes] = ()) -> str | list[dict[str, Any]]:
    """A user message's content: the bare text, or a text part followed by PNG image parts."""
    if not pngs:
        return text
    return [{"type": "text", "text": text}, *(png_part(p) for p in pngs)]


def retry_after_s(response: httpx.Response | None) -> float | None:
    """The wait a response's ``Retry-After`` asks for, in seconds (delta-seconds or an HTTP date)."""
    value = response.headers.get("retry-after") if response is not None else None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def map_concurrent(fn: Callable[[T], R], items: Sequence[T], concurrency: int) -> list[R]:
    """``[fn(x) for x in items]`` with at most ``concurrency`` calls in flight, in order."""
    if len(items) <= 1 or concurrency <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items))) as pool:
        return list(pool.map(fn, items))


class Closing:
    """``with x: ...`` closes ``x`` at the end: the client and every object holding one."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChatClient(Closing):
    """Requests to one endpoint with the retries of :class:`EndpointConfig`; ``counters`` may be
    shared, ``transport`` goes to ``httpx.Client`` (tests)."""

    def __init__(
        self,
        config: EndpointConfig,
        *,
        counters: LLMCounters | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import httpx

        self.config = config
        self.counters = counters if counters is not None else LLMCounters()
        self.base_url = config.base_url.rstrip("/")
        key = config.api_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._httpx = httpx
        self._http = httpx.Client(timeout=httpx.Timeout(config.timeout_s), headers=headers, transport=transport)
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def send(
        self, method: str, path: str, usable: Callable[[httpx.Response], bool] | None = None, **request: Any
    ) -> httpx.Response:
        """``method`` ``base_url/path`` with the retries: the last response whatever its status;
        :class:`LLMUnavailable` when the last attempt got no response. A success ``usable`` refuses
        (a proxy's error page answered 200) is retried as a 5xx is."""
        httpx = self._httpx
        url = f"{self.base_url}/{path.lstrip('/')}"
        attempts = self.config.max_retries + 1
        response: httpx.Response | None = None
        last = "no attempt made"
        for attempt in range(attempts):
            if attempt:
                self.counters.add("retries")
                wait, asked = self.config.backoff_s * 2 ** (attempt - 1), retry_after_s(response)
                self._sleep(min(max(wait, asked) if asked is not None else wait, self.config.max_backoff_s))
            self.counters.add("requests")
            try:
                response = self._http.request(method, url, **request)
            except httpx.TimeoutException as exc:
                response, last = None, f"timeout after {self.config.timeout_s}s ({type(exc).__name__})"
                continue
            except httpx.TransportError as exc:
                response, last = None, f"transport error {type(exc).__name__}: {exc}"
                continue
            if response.status_code not in RETRY_STATUS and (
                usable is None or response.status_code >= 400 or usable(response)
            ):
                break
        if response is None or response.status_code >= 400:
            self.counters.add("failures")
        if response is None:
            raise LLMUnavailable(f"{url} failed {attempts} time(s); last error: {last}")
        return response

    def chat(self, messages: list[dict[str, Any]], **body: Any) -> ChatReply:
        """One ``/chat/completions`` call for ``config.model``; ``body`` adds any other request field."""
        request = {"model": self.config.model, "messages": messages, **body}
        response = self.send("POST", "chat/completions", usable=_is_completion, json=request)
        where, status = f"{self.base_url}/chat/completions", response.status_code
        if status in RETRY_STATUS:
            attempts = self.config.max_retries + 1
            raise LLMUnavailable(f"{where} failed {attempts} time(s); last error: HTTP {status}: {response.text[:200]}")
        if status >= 400:
            raise LLMRefused(status, f"{where} answered HTTP {status}: {response.text[:300]}")
        try:
            data = response.json()
            reply = parse_chat(data)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            self.counters.add("failures")
            tries = f"{self.config.max_retries + 1} time(s) " if not _is_completion(response) else ""
            raise LLMReplyError(
                f"{where} reply is not an OpenAI chat completion {tries}({exc}): {response.text[:200]!r}"
            ) from None
        self.counters.charge(data)
        return reply


def _is_completion(response: httpx.Response) -> bool:
    """Whether a response's body is shaped as a chat completion (a JSON object whose first choice
    has a message): what a chat call may parse, else retries."""
    try:
        return isinstance(response.json()["choices"][0]["message"], dict)
    except (ValueError, KeyError, IndexError, TypeError):
        return False


#: The longest a probe waits for an endpoint's answer (a per-request timeout may be minutes).
PROBE_TIMEOUT_S = 10.0


def probe(config: EndpointConfig, *, transport: httpx.BaseTransport | None = None) -> str | None:
    """Why ``config``'s endpoint cannot serve a run, asked once with ``GET /models`` before any
    work (a D1 over a corpus met a server nobody had started only after its reference tasks, 30 s
    on the embedded corpus): no answer, a refused key, or a ``model`` the server does not list.
    ``None`` when it answers; a server without ``/models`` passes (it answered)."""
    import httpx

    once = replace(config, max_retries=0, timeout_s=min(config.timeout_s, PROBE_TIMEOUT_S))
    with ChatClient(once, transport=transport) as client:
        try:
            response = client.send("GET", "models")
        except LLMUnavailable as exc:
            return f"no server answers ({str(exc).split('last error: ', 1)[-1]})"
    if response.status_code in (401, 403):
        key = f"${config.api_key_env}" if config.api_key_env else "no key (api_key_env is '')"
        return f"GET /models answered HTTP {response.status_code}: the server refuses the key ({key})"
    try:
        served = [str(m["id"]) for m in response.json()["data"]] if response.status_code == 200 else []
    except (ValueError, KeyError, TypeError, httpx.HTTPError):
        served = []
    if config.model and served and config.model not in served:
        return f"it does not serve model {config.model!r}; it serves {', '.join(served[:8])}"
    return None
