"""ScienceWorld behind the `Env` protocol: one capped-heap JVM per env, and a fast step path.

Why a fast path: the package's `ScienceWorldEnv.step()` also recomputes look, inventory, the
task description and *all* valid actions on every call (~25-200 ms). The fast path calls the
same Java entry point (`PythonInterface.step`) and fetches only score, completion and move
count, so observation/score/done/completion are identical (tested) at a fraction of the cost.
Valid actions are computed on demand by `valid_actions()`.

Why our own launcher: the package's constructor passes no Java options, so each env got a
2+ GB default heap. We start the JVM as py4j's `launch_gateway` does, with a clean signal state,
and pass `-Xmx512m` and the serial GC by default (peak ~480 MB RSS per env on a mixed workload, vs ~2.5 GB).

Why `deterministic` (default): the stock engine is not a function of the action sequence.
Object lists iterate in identity-hash order and bees, wandering animals and referent choice use
the unseeded global `scala.util.Random`, so replaying the same actions gave differently ordered
observations (sometimes different temperatures) in about half of the episodes, even in one
JVM. Worse, listing valid actions draws from that Random (`InputParser.chooseUniqueReferents`),
so merely *looking* at the valid actions changed later bee moves. Deterministic mode:
- `-XX:hashCode=2`: every identity hash is 1, so sets iterate in insertion order
  (`EnvObject.equals` compares unique uuids, so set membership is unchanged);
- the Random is seeded before every load, and re-seeded before every step from (seed, step
  index), so draws made between steps (valid actions, the stock path's extra queries) cannot
  leak into the world.
The same actions then give the same observations, run after run, fast or stock, and
`valid_actions()` has no side effects. Cost: ~1.3x per fast step (still ~10x under stock).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import psutil
from py4j.java_gateway import GatewayParameters, JavaGateway, OutputConsumer, find_jar_path
from py4j.protocol import Py4JError
from scienceworld import ScienceWorldEnv as _PackageEnv
from scienceworld.constants import BASEPATH, JAR_PATH

from envs.base import EnvError, StepResult, Task
from envs.owned import OwnedProcess, clean_signals
from envs.scienceworld.shortcut import allows_teleport, teleport_shortcut
from envs.scienceworld.tasks import DEFAULT_SIMPLIFICATION, resolve_task_name

log = logging.getLogger(__name__)

DEFAULT_MAX_HEAP = "512m"
# Serial GC: on these small heaps it peaks ~100 MB lower than G1 (no remembered sets, fewer
# threads) at equal or better speed; measured by benchmarks/env_speed.py-style workloads.
DEFAULT_JAVA_OPTS = ("-XX:+UseSerialGC",)
DETERMINISTIC_JAVA_OPTS = ("-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
NO_STEP_LIMIT = 10**9  # the rollout loop enforces Task.max_steps; the engine should not
LOOK = "look around"  # the package's reset() makes this first move
INVALID_PREFIXES = ("No known action matches that input.", "Unknown action.")
AMBIGUOUS_PREFIX = "Ambiguous request"
EXPERT_PATHS = ("gold", "shortcut")
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors", "noElectricalAction")
INSTALL_JAVA = (
    "ScienceWorld needs a Java runtime (Java 17) and none was found on PATH or in $JAVA_HOME. "
    "Install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
)


def _mix_seed(seed: int, index: int) -> int:
    """splitmix64 of (seed, index) as a signed Java long: nearby indices give unrelated streams
    (java.util.Random's first draws are correlated for nearby seeds)."""
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


BLOCKED_COMMANDS = frozenset({"reset task", "reset", "exit", "quit"})
BLOCKED_OBSERVATION = "No known action matches that input."


def find_java(java_path: str | None = None) -> str:
    """The `java` binary to launch: explicit path, else $JAVA_HOME/bin/java, else PATH."""
    candidates = [java_path] if java_path else []
    if not java_path and os.environ.get("JAVA_HOME"):
        candidates.append(os.path.join(os.environ["JAVA_HOME"], "bin", "java"))
    if not java_path:
        candidates.append("java")
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    raise EnvError(INSTALL_JAVA + (f" (looked for {java_path!r})" if java_path else ""))


def launch_jvm(java: str, java_opts: Sequence[str]) -> tuple[int, subprocess.Popen]:
    """py4j's `launch_gateway`, with a clean signal state (it takes no `preexec_fn`): (port, process)."""
    classpath = os.pathsep.join((find_jar_path(), JAR_PATH))
    command = [java, "-classpath", classpath, *java_opts, "py4j.GatewayServer", "--die-on-broken-pipe", "0"]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            cwd=BASEPATH, preexec_fn=clean_signals)
    line = proc.stdout.readline()  # empty when java ends before it listens
    try:
        port = int(line)
    except ValueError:
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # it printed something else and runs on: not a gateway
            proc.kill()
            code = proc.wait()
        raise EnvError(f"The ScienceWorld JVM {jvm_ended(code, java_opts, at_start=True)}") from None
    OutputConsumer(open(os.devnull, "w"), proc.stdout, daemon=True).start()  # drained, as py4j does
    return port, proc


def jvm_ended(code: int | None, java_opts: Sequence[str], *, at_start: bool = False) -> str:
    """How a JVM ended, for an error: killed by a signal from outside, or exited (at start: failed to start)."""
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return (f"was killed by {name}{' while starting' if at_start else ''} (from outside this process: the "
                "OOM killer, a kill, a container limit); restart the env")
    if at_start:
        return (f"failed to start: java exited with code {code} (java options {list(java_opts)}: a bad option, "
                "or too little memory for the heap)")
    return f"exited by itself (exit code {code}); restart the env"


class _LaunchedPackageEnv(_PackageEnv):
    """The package's own env class (its `step`/`reset` are the stock path), started with our JVM options.

    Its constructor is replaced because it accepts no Java options. The callback server it starts
    is skipped: ScienceWorld never calls back into Python.
    """

    def __init__(self, java: str, java_opts: Sequence[str], step_limit: int) -> None:
        self._gateway = None
        port, proc = launch_jvm(java, java_opts)
        self._gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=proc)
        self.server = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        self.lastStepScore = 0
        self.taskName = None
        self.variationIdx = 0
        self.simplificationStr = ""
        self.envStepLimit = step_limit
        self.clear_run_histories()
        self.goldPathGenerated = False
        self._obj_tree_tempdir = tempfile.TemporaryDirectory()

    @property
    def process(self):  # subprocess.Popen of the JVM
        return self._gateway.java_process if self._gateway is not None else None

    def close(self) -> None:
        """Idempotent and safe on a dead JVM (the package's close is neither)."""
        gateway, self._gateway = self._gateway, None
        if gateway is None:
            return
        proc = gateway.java_process
        try:
            gateway.shutdown()
        except Exception:
            pass
        try:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()  # EOF makes py4j's --die-on-broken-pipe JVM exit
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait(timeout=5)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class ScienceWorldEnv:
    """One ScienceWorld JVM, reused across `reset()` calls.

    reset(task) -> "<task description>\\n\\n<output of 'look around'>": the package's reset makes
    the "look around" move itself; we prepend the task description so the goal is in the first
    observation. step() -> StepResult with
      reward  = max(score, 0) / 100, the *cumulative* score (not a delta); the raw engine score
                (-100 when the engine declares failure, e.g. a wrong focus) is info["score"]
      done    = engine completion, or score < 0, or moves > step_limit (the package's rule)
      success = score == 100 and the engine says completed
      info    = score, moves, completed, invalid/valid (unparsable or no-match input), ambiguous
    An invalid action is an observation, never an exception; a dead JVM raises EnvError.
    `fast=False` selects the package's own reset()/step() (same results, ~5-15x slower).
    """

    def __init__(
        self,
        *,
        fast: bool = True,
        max_heap: str | None = DEFAULT_MAX_HEAP,
        java_opts: Sequence[str] = DEFAULT_JAVA_OPTS,
        simplification: str | None = None,
        step_limit: int = NO_STEP_LIMIT,
        java_path: str | None = None,
        deterministic: bool = True,
        seed: int = 0,
        expert_path: str = "gold",
    ) -> None:
        """`simplification=None` uses task.meta["simplification"] (default "easy"); `max_heap=None`
        keeps the JVM default heap (a quarter of RAM); `java_opts` are extra JVM flags (replacing
        the default serial GC); `deterministic` see module doc; `expert_path` is "gold" (the
        engine's path) or "shortcut" (walks collapsed into teleports, see shortcut.py)."""
        if expert_path not in EXPERT_PATHS:
            raise ValueError(f"Unknown expert_path {expert_path!r}. Valid: {', '.join(EXPERT_PATHS)}")
        self.expert_path = expert_path
        self.fast = fast
        self.simplification = simplification
        self.deterministic = deterministic
        self.seed = seed
        self.java_opts = (
            ([f"-Xmx{max_heap}"] if max_heap else [])
            + (list(DETERMINISTIC_JAVA_OPTS) if deterministic else [])
            + list(java_opts)
        )
        self._java = find_java(java_path)
        self._task: Task | None = None
        self._steps = 0
        self._random: Any = None
        self.goal = ""
        try:
            self._sw: _LaunchedPackageEnv | None = _LaunchedPackageEnv(self._java, self.java_opts, step_limit)
        except Py4JError as exc:
            raise EnvError(f"Could not start the ScienceWorld JVM: {exc}") from exc

    # --- lifecycle -------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        proc = self._sw.process if self._sw else None
        return proc.pid if proc else None

    def alive(self) -> bool:
        proc = self._sw.process if self._sw else None
        return proc is not None and proc.poll() is None

    def close(self) -> None:
        sw, self._sw = self._sw, None
        if sw is not None:
            sw.close()

    def __enter__(self) -> ScienceWorldEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _server(self) -> Any:
        """The Java PythonInterface, or EnvError when the JVM is gone (checked without a py4j call)."""
        if self._sw is None:
            raise EnvError("ScienceWorld env is closed")
        proc = self._sw.process
        if proc is None or proc.poll() is not None:
            code = proc.returncode if proc is not None else None
            raise EnvError(f"The ScienceWorld JVM {jvm_ended(code, self.java_opts)}")
        return self._sw.server

    def jvm_rss_bytes(self) -> int:
        """Resident memory of the JVM (and any children): what one env costs beyond Python."""
        if not self.alive():
            return 0
        root = psutil.Process(self.pid)
        procs = [root, *root.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs if p.is_running())

    # --- episode ---------------------------------------------------------------------
    def _simplification_of(self, task: Task) -> str:
        """The env's own simplification if set, else the task's (default "easy")."""
        return self.simplification or task.meta.get("simplification", DEFAULT_SIMPLIFICATION)

    def _load(self, task: Task, *, gold: bool) -> tuple[str, int, str]:
        name = resolve_task_name(task.meta.get("task_name") or task.task_id.split("/")[0])
        variation = int(task.meta.get("variation", task.task_id.rsplit("/", 1)[-1]))
        simplification = self._simplification_of(task)
        bad = [s for s in simplification.split(",") if s and s not in SIMPLIFICATIONS]
        if bad:
            raise ValueError(f"Unknown simplification(s) {bad}. Valid: {', '.join(SIMPLIFICATIONS)}")
        server = self._server()
        sw = self._sw
        assert sw is not None
        try:
            self._seed_random()
            error = server.load(name, variation, simplification, gold)
        except Py4JError as exc:
            raise EnvError(f"ScienceWorld failed to load {name}/{variation}: {exc}") from exc
        if error:
            raise ValueError(f"ScienceWorld could not load {name}/{variation}: {error}")
        # Keep the package object's bookkeeping in step with what we loaded (stock path, valid actions).
        sw.taskName, sw.variationIdx, sw.simplificationStr = name, variation, simplification
        sw.goldPathGenerated, sw.lastStepScore = gold, 0
        return name, variation, simplification

    def _seed_random(self, step_index: int = 0) -> None:
        """Seed the engine's global scala.util.Random from (seed, step index); deterministic mode only."""
        if self.deterministic and self._sw is not None:
            if self._random is None:  # the Scala object behind `scala.util.Random.nextInt()`
                self._random = getattr(getattr(self._sw._gateway.jvm.scala.util, "Random$"), "MODULE$")
            self._random.setSeed(_mix_seed(self.seed, step_index))

    def reset(self, task: Task) -> str:
        """Load task+variation and make the first "look around" move, exactly as the package's reset."""
        self._load(task, gold=False)
        server = self._server()
        try:
            if self.fast:
                # The package calls server.reset() here, which is load() again with the same
                # arguments; the state right after our load() is the same fresh world.
                look, _, _, _ = self._fast_step(server, LOOK)
            else:
                assert self._sw is not None
                self._seed_random()  # the package's reset() loads again: same seed, same world
                look, _ = self._sw.reset()
            self.goal = str(server.getTaskDescription())
        except Py4JError as exc:
            raise EnvError(f"ScienceWorld JVM failed during reset: {exc}") from exc
        self._task, self._steps = task, 0
        return f"{self.goal}\n\n{look}"

    def _fast_step(self, server: Any, action: str) -> tuple[str, int, bool, int]:
        """PythonInterface.step plus only score/completion/moves; the package's step minus look,
        inventory, task description and valid-action enumeration."""
        observation = str(server.step(action))
        score = int(round(100 * server.getScore()))
        completed = bool(server.getCompleted())
        moves = int(server.getNumMoves())
        assert self._sw is not None
        self._sw.lastStepScore = score
        return observation, score, completed, moves

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("Call reset(task) before step()")
        action = "" if action is None else str(action)
        if not action.isascii():  # lone surrogates (undecodable model bytes) cannot cross py4j: "?" instead
            action = action.encode("utf-8", "replace").decode("utf-8")
        if " ".join(action.lower().split()) in BLOCKED_COMMANDS:
            # Engine meta-commands would restart or end the episode from inside it.
            self._steps += 1
            try:
                score = int(round(100 * self._server().getScore()))
            except Py4JError as exc:
                raise EnvError(f"ScienceWorld JVM failed: {exc}") from exc
            return StepResult(BLOCKED_OBSERVATION, max(score, 0) / 100, False, False,
                              {"score": score, "invalid": True, "valid": False, "ambiguous": False, "blocked": True})
        server = self._server()
        sw = self._sw
        assert sw is not None
        try:
            self._steps += 1
            self._seed_random(self._steps)
            if self.fast:
                observation, score, completed, moves = self._fast_step(server, action)
                done = completed or moves > sw.envStepLimit or score < 0
            else:
                observation, _delta, done, info = sw.step(action)
                score, moves = int(info["score"]), int(info["moves"])
                completed = bool(server.getCompleted())
        except Py4JError as exc:
            raise EnvError(f"ScienceWorld JVM failed during step({action!r}): {exc}") from exc
        invalid = observation.startswith(INVALID_PREFIXES)
        ambiguous = observation.startswith(AMBIGUOUS_PREFIX)
        info = {
            "score": score,
            "moves": moves,
            "completed": completed,
            "invalid": invalid,
            "valid": not (invalid or ambiguous),
            "ambiguous": ambiguous,
        }
        return StepResult(
            observation=observation,
            reward=max(score, 0) / 100,
            done=bool(done),
            success=score == 100 and completed,
            info=info,
        )

    def valid_actions(self) -> list[str]:
        """All valid action strings in the current state (slow: 20-200 ms; call only when needed)."""
        server = self._server()
        try:
            return [str(a) for a in server.getValidActionObjectCombinations()]
        except Py4JError as exc:
            raise EnvError(f"ScienceWorld JVM failed listing valid actions: {exc}") from exc

    def expert_actions(self, task: Task) -> list[str]:
        """The expert path for `task` (see `expert_path`). Leaves no episode open: reset() next."""
        gold = self.gold_actions(task)
        simplification = self._simplification_of(task)
        if self.expert_path == "gold" or not allows_teleport(simplification):
            return gold
        short = teleport_shortcut(gold)
        if short == gold or self._solves(task, short):
            return short
        log.info("teleport shortcut failed on %s; using the gold path", task.task_id)
        return gold

    def _solves(self, task: Task, actions: list[str]) -> bool:
        self.reset(task)
        try:
            for action in actions:
                result = self.step(action)
                if result.success:
                    return True
                if result.done:
                    return False
            return False
        finally:
            self._task = None

    def gold_actions(self, task: Task) -> list[str]:
        """The engine's gold action sequence for `task`. Leaves no episode open: reset() next."""
        self._task = None
        self._load(task, gold=True)
        try:
            actions = [str(a) for a in self._server().getGoldActionSequence()]
        except Py4JError as exc:
            raise EnvError(f"ScienceWorld JVM failed generating the gold path: {exc}") from exc
        if not actions or any(a.startswith("ERROR") for a in actions):
            raise EnvError(f"ScienceWorld produced no gold path for {task.task_id}: {actions[:1]}")
        return actions


def expert_actions_many(
    tasks: Iterable[Task], env: ScienceWorldEnv | None = None, **env_options: Any
) -> Iterator[tuple[Task, list[str]]]:
    """Gold paths for many tasks through one JVM (~0.1-1 s each instead of a JVM start each)."""
    own = env is None
    env = env or ScienceWorldEnv(**env_options)
    try:
        for task in tasks:
            yield task, env.expert_actions(task)
    finally:
        if own:
            env.close()


def expert_jvm() -> OwnedProcess[ScienceWorldEnv]:
    """A JVM for gold paths, started on first use by its owner (a spec) and restarted if it died."""
    return OwnedProcess(ScienceWorldEnv, close=ScienceWorldEnv.close, alive=ScienceWorldEnv.alive)
