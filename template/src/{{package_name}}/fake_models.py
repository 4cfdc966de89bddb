"""A fake OpenAI- and Anthropic-compatible model provider on loopback, for tests that use the
real SDKs (template-owned: copier-agent-worker).

A test scripts the answers per prompt, points the SDK's `base_url` at the server and reads
back every request the "provider" received, in order. Standard library only; the server runs
in a daemon thread, so sync and async tests can use it and a worker in another process can
call it over HTTP.

    from <package>.testing import FakeModels, reply

    with FakeModels() as models:                      # or models.start() ... models.stop()
        models.script("Say hi", [reply.error(429, retry_after_s=1), reply.text("hi")])
        client = openai.AsyncOpenAI(base_url=models.openai_url, api_key="x", max_retries=0)
        ...                                           # anthropic: base_url=models.anthropic_url
        assert len(models.requests_for("Say hi")) == 2

Endpoints: POST /v1/chat/completions, /v1/responses (OpenAI) and /v1/messages (Anthropic).
The *key* of a request is the text of its first user message, so the requests of one agent
run (a tool loop) consume one script in order. Each request takes the next reply of its
key's script (`default` for keys with none: `reply.text("ok")` unless set); the last reply
repeats. Every request is logged before it is answered, as a real provider would have seen
it (`requests`, `requests_for`).

Replies, in each API's own shape (the echoed `model`, `usage` with the given tokens):

    reply.text("hi", input_tokens=10, output_tokens=5)
    reply.tool_call("lookup", {"q": "x"})      chat `tool_calls`, a Responses `function_call`,
                                               an Anthropic `tool_use` block
    reply.error(429, retry_after_s=1)          the API's error JSON; 429 sends `retry-after`;
    reply.error(529)  reply.error(400, "bad")  529 is Anthropic's overloaded_error
    reply.hang()                               never answers (until the server stops, then
                                               the connection closes with no response)
    reply.slow(2.0, then=reply.text("late"))   answers `then` after 2 s
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

OPENAI_PATHS = ("/v1/chat/completions", "/v1/responses")
ANTHROPIC_PATH = "/v1/messages"
# How long a `hang` waits for the server to stop before closing the connection anyway.
HANG_S = 3600.0

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_denied", None),
    404: ("invalid_request_error", "model_not_found"),
    409: ("conflict", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}
_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Reply:
    """One scripted answer; build it with `reply.text`, `reply.error`, ... (see the module)."""

    kind: Literal["text", "tool_call", "error", "hang", "slow"]
    content: str = ""
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    message: str = ""
    retry_after_s: float | None = None
    input_tokens: int = 10
    output_tokens: int = 5
    seconds: float = 0.0
    then: Reply | None = None

    @classmethod
    def text(cls, content: str, *, input_tokens: int = 10, output_tokens: int = 5) -> Reply:
        """An assistant message with `content`, and its usage."""
        return cls("text", content, input_tokens=input_tokens, output_tokens=output_tokens)

    @classmethod
    def tool_call(
        cls,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        input_tokens: int = 10,
        output_tokens: int = 5,
    ) -> Reply:
        """The model asks for one call of the tool `name` with `arguments`."""
        return cls(
            "tool_call",
            name=name,
            arguments=dict(arguments or {}),
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    @classmethod
    def error(cls, status: int, message: str = "", *, retry_after_s: float | None = None) -> Reply:
        """An error answer with HTTP `status` (429 sends `retry-after` when given)."""
        return cls("error", status=status, message=message, retry_after_s=retry_after_s)

    @classmethod
    def hang(cls) -> Reply:
        """Receive the request, then never answer (the connection closes when the server stops)."""
        return cls("hang")

    @classmethod
    def slow(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Answer `then` (a text "ok" by default) after `seconds`."""
        return cls("slow", seconds=seconds, then=then)


# The documented spelling: reply.text("hi"), reply.error(429, retry_after_s=1), ...
reply = Reply


@dataclass(frozen=True)
class ModelRequest:
    """One request the fake provider received, as it received it."""

    path: str
    key: str  # the text of the first user message
    model: str
    body: dict[str, Any]
    received_at: datetime  # UTC


class FakeModels:
    """The fake provider: a scripted HTTP server on 127.0.0.1 (a free port)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Reply]] = {}
        self._default: list[Reply] = [Reply.text("ok")]
        self._taken: dict[str, int] = {}
        self._requests: list[ModelRequest] = []
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeModels:
        """Listen on a free loopback port and serve from a daemon thread."""
        if self._server is not None:
            return self
        self._stopping.clear()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.models = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; requests that hang are released (their connections close)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)
        self._server, self._thread = None, None

    def __enter__(self) -> FakeModels:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The server's root, e.g. http://127.0.0.1:41234."""
        if self._server is None:
            raise RuntimeError("FakeModels is not started")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """`base_url` for `openai.OpenAI` / `openai.AsyncOpenAI`."""
        return f"{self.url}/v1"

    @property
    def anthropic_url(self) -> str:
        """`base_url` for `anthropic.Anthropic` / `anthropic.AsyncAnthropic`."""
        return self.url

    def script(self, key: str, replies: Iterable[Reply]) -> None:
        """Answer the requests whose first user message is `key` with `replies`, in order."""
        replies = list(replies)
        if not replies:
            raise ValueError("a script needs at least one reply")
        with self._lock:
            self._scripts[key] = replies
            self._taken[key] = 0

    def default(self, replies: Iterable[Reply]) -> None:
        """The script of every key that has none of its own (each key goes through it)."""
        replies = list(replies)
        if not replies:
            raise ValueError("a script needs at least one reply")
        with self._lock:
            self._default = replies

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request received so far, in order."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, key: str) -> list[ModelRequest]:
        """The requests received so far whose first user message is `key`, in order."""
        return [request for request in self.requests if request.key == key]

    def receive(self, path: str, body: dict[str, Any]) -> tuple[ModelRequest, Reply]:
        """Log one request and take its reply (what the HTTP handler calls)."""
        key = first_user_text(path, body)
        request = ModelRequest(path, key, str(body.get("model", "")), body, datetime.now(UTC))
        with self._lock:
            self._requests.append(request)
            replies = self._scripts.get(key, self._default)
            taken = self._taken.get(key, 0)
            self._taken[key] = taken + 1
        return request, replies[min(taken, len(replies) - 1)]

    def next_id(self) -> int:
        return next(self._ids)

    def wait_stopping(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the server is stopping."""
        return self._stopping.wait(seconds)


def first_user_text(path: str, body: dict[str, Any]) -> str:
    """The text of the first user message of a chat, Responses or Messages request.

    >>> first_user_text("/v1/responses", {"input": "hi"})
    'hi'
    >>> blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    >>> first_user_text("/v1/messages", {"messages": [{"role": "user", "content": blocks}]})
    'ab'
    """
    items = body.get("input") if path == "/v1/responses" else body.get("messages")
    if isinstance(items, str):
        return items
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("role") == "user":
            return _text_of(item.get("content"))
    return ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(
        str(part.get("text", "")) for part in parts if isinstance(part, dict) and "text" in part
    )


class _Handler(BaseHTTPRequestHandler):
    server_version = "FakeModels/1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `FakeModels.requests` instead."""

    def do_POST(self) -> None:
        models: FakeModels = self.server.models  # type: ignore[attr-defined]
        path = self.path.split("?")[0].rstrip("/")
        length = int(self.headers.get("content-length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        anthropic = path == ANTHROPIC_PATH
        if path not in (*OPENAI_PATHS, ANTHROPIC_PATH) or not isinstance(body, dict):
            self._answer(path, {}, Reply.error(404 if isinstance(body, dict) else 400), 0)
            return
        request, answer = models.receive(path, body)
        if answer.kind == "hang":
            models.wait_stopping(HANG_S)
            self.close_connection = True
            return
        if answer.kind == "slow":
            if models.wait_stopping(answer.seconds):
                self.close_connection = True
                return
            answer = answer.then or Reply.text("ok")
        self._answer(path, request.body, answer, models.next_id(), anthropic=anthropic)

    def _answer(
        self, path: str, body: dict[str, Any], answer: Reply, n: int, *, anthropic: bool = False
    ) -> None:
        headers: dict[str, str] = {
            "content-type": "application/json",
            "request-id" if anthropic else "x-request-id": f"req_fake{n}",
        }
        if answer.kind == "error":
            status = answer.status
            payload = _anthropic_error(answer) if anthropic else _openai_error(answer)
            if answer.retry_after_s is not None:
                headers["retry-after"] = f"{answer.retry_after_s:g}"
        else:
            status = 200
            model = str(body.get("model", ""))
            if anthropic:
                payload = _anthropic_message(answer, model, n)
            elif path == "/v1/responses":
                payload = _responses_response(answer, model, n)
            else:
                payload = _chat_completion(answer, model, n)
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _openai_error(answer: Reply) -> dict[str, Any]:
    kind, code = _OPENAI_ERRORS.get(
        answer.status, ("server_error" if answer.status >= 500 else "invalid_request_error", None)
    )
    message = answer.message or f"fake error {answer.status}"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _anthropic_error(answer: Reply) -> dict[str, Any]:
    status = answer.status
    kind = _ANTHROPIC_ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = answer.message or ("Overloaded" if status == 529 else f"fake error {status}")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _chat_completion(answer: Reply, model: str, n: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    finish = "stop"
    if answer.kind == "tool_call":
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": f"call_fake{n}",
                "type": "function",
                "function": {"name": answer.name, "arguments": json.dumps(answer.arguments)},
            }
        ]
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-fake{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": answer.input_tokens,
            "completion_tokens": answer.output_tokens,
            "total_tokens": answer.input_tokens + answer.output_tokens,
        },
    }


def _responses_response(answer: Reply, model: str, n: int) -> dict[str, Any]:
    item: dict[str, Any]
    if answer.kind == "tool_call":
        item = {
            "type": "function_call",
            "id": f"fc_fake{n}",
            "call_id": f"call_fake{n}",
            "name": answer.name,
            "arguments": json.dumps(answer.arguments),
            "status": "completed",
        }
    else:
        item = {
            "type": "message",
            "id": f"msg_fake{n}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": answer.content, "annotations": []}],
        }
    return {
        "id": f"resp_fake{n}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [item],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": answer.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": answer.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": answer.input_tokens + answer.output_tokens,
        },
    }


def _anthropic_message(answer: Reply, model: str, n: int) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": answer.content}
    stop = "end_turn"
    if answer.kind == "tool_call":
        block = {
            "type": "tool_use",
            "id": f"toolu_fake{n}",
            "name": answer.name,
            "input": answer.arguments,
        }
        stop = "tool_use"
    return {
        "id": f"msg_fake{n}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": answer.input_tokens,
            "output_tokens": answer.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
