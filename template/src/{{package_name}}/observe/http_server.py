"""The worker's own HTTP endpoint: `/metrics`, `/livez`, `/readyz` (template-owned).

It runs in the worker's event loop, which is the point of `/livez`: a loop blocked by a
job cannot answer, and the platform's probe times out. Three GET paths need no web
framework: `asyncio.start_server` and a few lines of HTTP/1.0 keep the dependency list and
the start-up time as they were, and nothing here can stop a lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from ..settings import ENV_PREFIX, SettingsError
from .metrics import CONTENT_TYPE

log = structlog.get_logger("http")

# A client must send its request line and headers within this many seconds.
REQUEST_TIMEOUT_S = 5.0
MAX_HEADER_LINES = 100


class HttpPortUnavailable(SettingsError):
    """The configured host and port cannot be bound (in use, or not this machine's)."""


class ReadinessCheck(Protocol):
    """What `/readyz` asks: None when ready, else one line saying why not (probes.Readiness
    for a worker, supervisor.ChildrenReady for `worker --processes N`)."""

    async def check(self) -> str | None: ...


class ProbeServer:
    """Serves the three paths for one worker process: `metrics_text` renders `/metrics`."""

    def __init__(
        self,
        metrics_text: Callable[[], Awaitable[bytes]],
        readiness: ReadinessCheck,
        host: str,
        port: int,
    ) -> None:
        self.metrics_text = metrics_text
        self.readiness = readiness
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Bind and start serving; a port in use is an HttpPortUnavailable, not a traceback."""
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            reason = "is in use" if exc.errno == errno.EADDRINUSE else f"failed: {exc.strerror}"
            raise HttpPortUnavailable(
                f"cannot serve HTTP: {self.host}:{self.port} {reason}; set "
                f"{ENV_PREFIX}HTTP_PORT (or `worker --http-port N`) to a free port, or 0 to "
                "turn the endpoint off"
            ) from exc
        log.info("http_serving", host=self.host, port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                method, path = await _read_request(reader)
            status, content_type, body = await self.respond(method, path)
            head = (
                f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass  # a client that sends nothing useful gets nothing
        except Exception as exc:  # noqa: BLE001 - one bad request never stops the worker
            log.warning("http_request_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def respond(self, method: str, path: str) -> tuple[str, str, bytes]:
        """(status line, content type, body) for one request."""
        path = path.split("?", 1)[0]
        if method != "GET":
            return "405 Method Not Allowed", _TEXT, b"only GET\n"
        if path == "/livez":
            return "200 OK", _TEXT, b"ok\n"
        if path == "/readyz":
            reason = await self.readiness.check()
            if reason is None:
                return "200 OK", _TEXT, b"ok\n"
            return "503 Service Unavailable", _TEXT, f"not ready: {reason}\n".encode()
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE, await self.metrics_text()
        return "404 Not Found", _TEXT, b"paths: /metrics /livez /readyz\n"


_TEXT = "text/plain; charset=utf-8"


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and path of an HTTP/1.x request; its headers are read and ignored."""
    parts = (await reader.readline()).decode("latin-1").split()
    if len(parts) < 2:
        raise ValueError("not an HTTP request")
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
    return parts[0].upper(), parts[1]
