"""Deadlines on network calls: a request to an OpenAI-compatible endpoint (the teacher, the policy server) gets
a total time, connect, first byte and whole body together, not httpx's per-read timeout (an endpoint that sent
one byte every 2 s held a request for 150 s against a 5 s timeout). And requests sent side by side run on
daemon threads, so an interrupted command (SIGTERM, Ctrl-C) never waits at exit for threads still in a request.
Plain code (no Dagster).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
R = TypeVar("R")


class DeadlineTransport(httpx.HTTPTransport):
    """httpx transport that reads a request's timeout as its *total* time: connect, first byte and whole body.
    Each phase gets at most that time; at the deadline a watchdog shuts the request's socket (every request has
    its own connection for it: no keep-alive), which ends a read however the server trickles, headers included;
    the body is also cut at the first chunk past it. Either way the caller sees `httpx.ReadTimeout`."""

    def __init__(self) -> None:
        super().__init__(limits=httpx.Limits(max_keepalive_connections=0))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        given = request.extensions.get("timeout") or {}
        total = max((v for v in given.values() if v is not None), default=None)
        if total is None:
            return super().handle_request(request)
        watchdog = _Watchdog(time.monotonic() + total, total, request)
        request.extensions["timeout"] = {k: total for k in ("connect", "read", "write", "pool")}
        request.extensions["trace"] = watchdog.trace
        try:
            response = super().handle_request(request)
        except httpx.TransportError:
            watchdog.cancel()
            if watchdog.fired:
                raise watchdog.timeout() from None
            raise
        response.stream = _DeadlineStream(response.stream, watchdog)
        return response


class _Watchdog:
    """Shuts one request's socket at its deadline (httpcore's public `trace` extension hands over the stream)."""

    def __init__(self, deadline: float, total: float, request: httpx.Request) -> None:
        self.deadline, self.total, self.request = deadline, total, request
        self.timer: threading.Timer | None = None
        self.fired = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete") and info.get("return_value"):
            self.cancel()  # TLS wraps the TCP socket: the newest stream's socket is the one to shut
            sock = info["return_value"].get_extra_info("socket")
            self.timer = threading.Timer(max(self.deadline - time.monotonic(), 0.0), self._fire, (sock,))
            self.timer.daemon = True
            self.timer.start()

    def _fire(self, sock: socket.socket) -> None:
        self.fired = True
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed: the request ended in time after all
            pass

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def timeout(self) -> httpx.ReadTimeout:
        return httpx.ReadTimeout(f"no whole answer within the request's deadline ({self.total:g} s)",
                                 request=self.request)


class _DeadlineStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, watchdog: _Watchdog) -> None:
        self.inner, self.watchdog = inner, watchdog

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self.inner:
                if time.monotonic() > self.watchdog.deadline:
                    raise self.watchdog.timeout()
                yield chunk
        except httpx.TransportError:
            if self.watchdog.fired:
                raise self.watchdog.timeout() from None
            raise

    def close(self) -> None:
        self.watchdog.cancel()
        self.inner.close()


def http_client(seconds: float) -> httpx.Client:
    """An httpx client for the OpenAI SDK (`http_client=`) whose requests each end within `seconds` in all."""
    return httpx.Client(transport=DeadlineTransport(), timeout=seconds)


def retry_within(seconds: float, attempt: Callable[[float], T], *, retryable: Callable[[Exception], bool],
                 backoff_s: float = 1.0, max_attempts: int = 3, sleep: Callable[[float], None] = time.sleep) -> T:
    """`attempt(seconds_left)` until it returns, retrying errors `retryable` accepts with doubling waits, all
    within `seconds`: retries and waits count against the one deadline, and a wait that would pass it is not
    taken (the last error is raised)."""
    deadline = time.monotonic() + seconds
    for n in range(max_attempts):
        try:
            return attempt(max(deadline - time.monotonic(), 0.001))
        except Exception as exc:
            delay = backoff_s * 2**n
            if n + 1 == max_attempts or not retryable(exc) or time.monotonic() + delay >= deadline:
                raise
        sleep(delay)
    raise AssertionError("unreachable")


class RequestsAbandoned(RuntimeError):
    """The process is exiting while requests are in flight: their answers are not waited for."""


def map_on_daemon_threads(fn: Callable[[T], R], items: Iterable[T], workers: int,
                          abandon: threading.Event | None = None) -> list[R]:
    """[fn(item) for item in items], `workers` at a time, in order; the first error (in finishing order) is
    raised. Unlike ThreadPoolExecutor, whose threads the interpreter joins at exit, the threads are daemons: an
    interrupt of the caller returns at once, and the process exits without waiting for requests in flight.
    `abandon` set (by whoever interrupts a caller that is itself a joined thread, e.g. a rollout slot): stop
    waiting, raise RequestsAbandoned."""
    todo = list(enumerate(items))
    results: list[Any] = [None] * len(todo)
    errors: list[BaseException] = []
    lock, finished = threading.Lock(), threading.Event()
    left = [len(todo)]
    if not todo:
        return []
    queue = iter(todo)

    def work() -> None:
        while not finished.is_set():
            with lock:
                nxt = next(queue, None)
            if nxt is None:
                return
            try:
                results[nxt[0]] = fn(nxt[1])
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                errors.append(exc)
                finished.set()
                return
            with lock:
                left[0] -= 1
                if not left[0]:
                    finished.set()

    for _ in range(min(workers, len(todo))):
        threading.Thread(target=work, daemon=True, name="flywheel-request").start()
    try:
        while not finished.wait(0.25):
            if abandon is not None and abandon.is_set():
                raise RequestsAbandoned("interrupted: the requests still in flight were abandoned")
    finally:
        finished.set()  # interrupted or abandoned: no thread takes another item
    if errors:
        raise errors[0]
    return results
