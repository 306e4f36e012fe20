"""The TextWorld engine, and a child process that runs it so its memory can be dropped.

TextWorld/fast-downward grow a process by a few MB per game and never give it
back. `WorkerClient` runs the engine in a child `python` (`serve()`) and
restarts it every N episodes or above an RSS limit. The protocol is one JSON
object per line over the child's stdin/stdout (the child's own fd 1 goes to
/dev/null so stray prints cannot corrupt it).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import psutil

from envs.base import EnvError
from envs.owned import clean_signals

REPO_ROOT = Path(__file__).resolve().parents[2]


_MEMOIZED = False


def memoize_parsers() -> None:
    """Cache TextWorld's two pure text parsers; steps get about 3x faster, output identical.

    Every step TextWorld re-parses each admissible command's template and each
    grammar condition with tatsu. The parse depends only on the string, so the
    cache returns a fresh copy of the parsed symbols (which `derive` mutates) and
    the same `Rule` for a query (which nothing mutates). The differential test
    compares this against unpatched TextWorld.
    """
    global _MEMOIZED
    if _MEMOIZED:
        return
    import copy
    import functools

    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule

    parse_symbols = textgen._parse_and_convert
    parse_query = Rule.parse_conjunctive_query.__func__  # type: ignore[attr-defined]
    symbols_cache: dict[tuple[str, str], Any] = {}

    def cached_symbols(text: str, rule_name: str = "symbols", **kwargs: Any) -> Any:
        key = (text, rule_name)
        if key not in symbols_cache:
            symbols_cache[key] = parse_symbols(text, rule_name=rule_name, **kwargs)
        return copy.deepcopy(symbols_cache[key])

    @functools.cache
    def cached_query(cls: type, expr: str) -> Any:
        return parse_query(cls, expr)

    textgen._parse_and_convert = cached_symbols
    Rule.parse_conjunctive_query = classmethod(cached_query)  # type: ignore[method-assign,assignment]
    _MEMOIZED = True


class GameEngine:
    """One ALFWorld game through exactly ALFWorld's stack: PddlEnv + AlfredDemangler.

    This is what `AlfredTWEnv` builds under textworld.gym (minus the batching),
    so observations and admissible commands are ALFWorld's own.
    """

    def __init__(self, facts: bool = False, memoize: bool = True) -> None:
        if memoize:
            memoize_parsers()
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        # No "walkthrough" extra: with an empty walkthrough TextWorld would run its planner at every reset.
        infos = textworld.EnvInfos(won=True, admissible_commands=True, facts=facts)
        self._env = AlfredDemangler(PddlEnv(infos), shuffle=False)
        self._loaded: str | None = None

    def reset(self, game_file: str) -> Any:
        """Start `game_file` (re-using the parsed game when it is the same file)."""
        if game_file != self._loaded:
            self._loaded = None
            self._env.load(game_file)
            self._loaded = game_file
        return self._env.reset()

    def step(self, action: str) -> Any:
        state, _, _ = self._env.step(action)
        return state

    def close(self) -> None:
        self._env.close()


def public_state(state: Any) -> dict[str, Any]:
    """The JSON-safe part of a TextWorld game state."""
    return {
        "observation": state["feedback"],
        "won": bool(state["won"]),
        "admissible_commands": list(state["admissible_commands"]),
    }


class _Server:
    """Handles one request at a time for the parent process."""

    def __init__(self) -> None:
        self.engine: GameEngine | None = None
        self.expert_engine: GameEngine | None = None  # needs facts; one per process (each loads a libdownward copy)

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request["op"]
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "reset":
            self.engine = self.engine or GameEngine()
            return public_state(self.engine.reset(request["game_file"]))
        if op == "step":
            if self.engine is None:
                raise RuntimeError("step before reset")
            return public_state(self.engine.step(request["action"]))
        if op == "expert":
            from envs.alfworld.expert import solve

            self.expert_engine = self.expert_engine or GameEngine(facts=True)
            return solve(
                Path(request["game_file"]), request["traj_data"], request["walkthrough"], engine=self.expert_engine, **request["options"]
            )
        raise ValueError(f"unknown op {op!r}")


def serve() -> None:
    """Child main loop: read a request line, answer a response line, until EOF."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = sys.stderr
    server = _Server()
    for line in sys.stdin:
        try:
            reply = {"ok": True, "result": server.handle(json.loads(line))}
        except Exception as exc:  # reported to the parent, which decides what it means
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")


class WorkerClient:
    """Parent side: starts, talks to, measures and recycles the child process."""

    def __init__(self, recycle_every: int | None = 50, max_rss_mb: float | None = 1024.0, timeout_s: float = 120.0) -> None:
        self.recycle_every = recycle_every
        self.max_rss_mb = max_rss_mb
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.episodes = 0  # episodes started in the current child
        self.recycles = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def rss_mb(self) -> float:
        """Resident memory of the child (0 when none runs)."""
        if self._proc is None or self._proc.poll() is not None:
            return 0.0
        try:
            return psutil.Process(self._proc.pid).memory_info().rss / 2**20
        except psutil.Error:
            return 0.0

    def begin_episode(self) -> None:
        """Recycle the child when it has served enough episodes or grown too big."""
        alive = self._proc is not None and self._proc.poll() is None
        worn = bool(self.recycle_every) and self.episodes >= self.recycle_every  # type: ignore[operator]
        fat = self.max_rss_mb is not None and alive and self.rss_mb() > self.max_rss_mb
        if alive and (worn or fat):
            self.stop()
            self.recycles += 1
        self._ensure()
        self.episodes += 1

    def call(self, op: str, **payload: Any) -> dict[str, Any]:
        """One request/response; EnvError if the child fails, dies or hangs."""
        proc = self._ensure()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps({"op": op, **payload}) + "\n").encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            line = proc.stdout.readline() if ready else b""
        except (BrokenPipeError, OSError) as exc:
            self.stop()
            raise EnvError(f"ALFWorld worker died: {exc}") from exc
        if not line:
            code = proc.poll()
            self.stop()
            why = f"exited with {code}" if code is not None else f"gave no answer in {self.timeout_s:.0f}s"
            raise EnvError(f"ALFWorld worker {why} during {op!r}")
        reply = json.loads(line)
        if not reply["ok"]:
            self.stop()  # the engine may be half-updated; the next call gets a fresh process
            raise EnvError(f"ALFWorld engine error during {op!r}: {reply['error']}\n{reply['traceback']}")
        return reply["result"]

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self.stop()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from envs.alfworld.worker import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=str(REPO_ROOT),
            preexec_fn=clean_signals,
        )
        self.episodes = 0
        return self._proc

    def stop(self) -> None:
        """End the child (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

