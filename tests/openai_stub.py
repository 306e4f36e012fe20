"""A local OpenAI-compatible HTTP server on 127.0.0.1 that answers from a script (for fault tests)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubServer:
    """`script` is a list of (status, content) answered in order; the last one repeats.

    A 200 with content None answers `"content": null`."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script = list(script)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.headers.append(dict(self.headers))
                status, content = stub.script.pop(0) if len(stub.script) > 1 else stub.script[0]
                if status == 200:
                    payload = {
                        "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
                    }
                else:
                    payload = {"error": {"message": content, "type": "server_error"}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class StalledServer:
    """A loopback endpoint that never answers whole: `trickle` sends the status line and headers at once, then
    its body one byte a second; `trickle-headers` sends even its status line and headers one byte a second;
    `hang` reads the request and sends nothing. `requests` counts what arrived."""

    def __init__(self, mode: str) -> None:
        import socket

        self.mode, self.requests, self.stop = mode, 0, threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            if self.mode == "trickle":
                conn.sendall(head)
            trickled = iter(head if self.mode == "trickle-headers" else b" " * 100000)
            while not self.stop.wait(1.0):
                if self.mode != "hang":
                    try:
                        conn.sendall(bytes([next(trickled, 32)]))
                    except OSError:  # the client gave up: what a deadline is for
                        return

    def __enter__(self) -> StalledServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.sock.close()
