"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, launched by `VLLMServer` in tests.

Stdlib only. It takes vLLM's command line (unknown flags ignored) and serves, on 127.0.0.1:
`/health`, `/v1/models`, `/v1/chat/completions` (plain and streamed, with vLLM's per-chunk usage),
`/collective_rpc` (`reload_weights`) and `/reset_prefix_cache`. Its "model" is the checkpoint
folder's `stub.json`:

    {"reply": "Thought: ...\\nPlan: ...\\nAction: inc",   # the answer to every prompt
     "start_delay": 0.1,                                   # seconds before /health answers
     "die_after_requests": 3,                              # exit mid-request after N completions...
     "die_marker": "/tmp/x",                               # ...once: only while this file is absent
     "die_always": false,                                  # exit on every completion request
     "reload_fails": false}                                # /collective_rpc answers 500 for this folder

Everything it does is appended as JSON lines to $STUB_EVENTS (start, request, reload, reset).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_lock = threading.Lock()
state = {"model": "", "requests": 0}


def event(**kw) -> None:
    path = os.environ.get("STUB_EVENTS")
    if path:
        with _lock, open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **kw}) + "\n")


def spec(model_dir: str) -> dict:
    p = Path(model_dir) / "stub.json"
    return json.loads(p.read_text()) if p.exists() else {}


def tokens(text: str) -> list[str]:
    """Words with their trailing whitespace: one 'token' per streamed chunk."""
    out, cur = [], ""
    for ch in text:
        cur += ch
        if ch in " \n":
            out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server API
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": ARGS.served_model_name, "object": "model"}]})
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802 - http.server API
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path == "/collective_rpc":
            target = body.get("kwargs", {}).get("weights_path", "")
            if spec(target).get("reload_fails"):
                event(kind="reload_failed", model=target)
                return self._json(500, {"error": "reload failed (stub)"})
            state["model"] = target
            event(kind="reload", model=target)
            return self._json(200, {"results": [None]})
        if self.path == "/reset_prefix_cache":
            event(kind="reset")
            return self._json(200, {})
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": "not found"})
        s = spec(state["model"])
        with _lock:
            state["requests"] += 1
            count = state["requests"]
        prompt = " ".join(m["content"] for m in body["messages"])
        event(kind="request", model=state["model"], stream=bool(body.get("stream")), seed=body.get("seed"),
              stream_options=body.get("stream_options"))
        marker = s.get("die_marker")
        if s.get("die_always") or (s.get("die_after_requests") and count > s["die_after_requests"]
                                   and marker and not Path(marker).exists()):
            if marker:
                Path(marker).touch()
            event(kind="die")
            os._exit(3)
        if "TOO_LONG" in prompt:  # vLLM's own words
            return self._json(400, {"error": {"message": "This model's maximum context length is 4096 tokens. However, "
                                              "your prompt contains at least 4097 input tokens", "type": "BadRequestError"}})
        if "BAD_REQUEST" in prompt:
            return self._json(400, {"error": {"message": "temperature must be non-negative", "type": "BadRequestError"}})
        n_prompt = len(prompt.split())
        reply = s.get("reply", "Thought: t\nPlan: p\nAction: look")
        # What a rambling model writes after its action line: the client must stop reading there.
        toks = tokens(reply + "\nObservation: I also write the next observation myself and go on and on")
        toks = toks[: int(body.get("max_tokens") or 64)]
        if not body.get("stream"):
            text = "".join(toks)
            return self._json(200, {
                "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(toks), "total_tokens": n_prompt + len(toks)},
            })
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        try:
            for i, tok in enumerate(toks, 1):
                chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": tok}, "finish_reason": None}],
                         "usage": {"prompt_tokens": n_prompt, "completion_tokens": i, "total_tokens": n_prompt + i}}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                sent = i
                time.sleep(float(s.get("token_delay", 0.002)))  # a slow server: seconds per token
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True
        event(kind="streamed", chunks=sent)


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--served-model-name", default="policy")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ARGS, _ = ap.parse_known_args()
    state["model"] = ARGS.model
    time.sleep(float(spec(ARGS.model).get("start_delay", 0.0)))
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    event(kind="start", model=ARGS.model, port=ARGS.port, argv=sys.argv[1:],
          env={k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_CACHE_ROOT", "VLLM_CPU_KVCACHE_SPACE")})
    server.serve_forever()


if __name__ == "__main__":
    main()
