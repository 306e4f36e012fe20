"""Slow tier: the two OpenAI-compatible paths against a real server, not a stub.

The teacher (`OpenAITeacherResource`) and the `openai` policy backend (`OpenAICompatiblePolicy`) are built
from a profile's sections, as a user configures them, and pointed at the project's own managed vLLM server
(flywheel/policy/vllm_server.py, from `.venv-vllm`: `make vllm`) serving SmolLM2-135M-Instruct (`make model`).
Every other test of these paths talks to tests/openai_stub.py. The server runs with `--enforce-eager` (no
torch.compile warm-up) and a default answer budget of 96 tokens (`--override-generation-config`), because the
teacher sends no `max_tokens` and a 135M model can repeat itself up to the context length. Measured: 2 tests in
3 minutes on the 2-core CPU machine with one other job, 19 minutes beside a demo and three other test runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.core.prompting import parse_response
from flywheel.core.store import Store
from flywheel.core.trajectory import Step, Trajectory
from flywheel.policy.models import load_tokenizer
from flywheel.policy.vllm_server import DEFAULT_PYTHON, SERVED_NAME, VLLMServer, VLLMServerConfig
from flywheel.profile import resources_from_sections
from flywheel.resources import OpenAICompatiblePolicy, OpenAITeacherResource
from flywheel.rollout.engine import RolloutConfig, run_rollouts
from flywheel.teacher.base import TeacherError
from flywheel.teacher.openai_teacher import parse_annotations
from tests.fakes import CounterEnv, counter_task

MODEL = Path(__file__).resolve().parents[2] / ".cache" / "models" / "smollm2-135m"
ANSWER_BUDGET = 96  # the server's default max_tokens (the teacher sends none)
ANNOTATION = ('{"steps": [{"thought": "The value is 0 and the goal is 1, so one increment reaches it.", '
              '"plan": "Increment once."}]}')
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(DEFAULT_PYTHON).exists(),
                       reason=f"no vLLM environment at {DEFAULT_PYTHON}: run `make vllm` to build .venv-vllm"),
    pytest.mark.skipif(not (MODEL / "config.json").exists(), reason=f"no model at {MODEL}: run `make model`"),
]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """The managed server on SmolLM2-135M: its OpenAI-compatible base URL (…/v1)."""
    root = tmp_path_factory.mktemp("vllm")
    cfg = VLLMServerConfig(log_dir=str(root), max_model_len=2048, start_timeout_s=900,
                           extra_args=("--enforce-eager", "--override-generation-config",
                                       json.dumps({"max_new_tokens": ANSWER_BUDGET})))
    with VLLMServer(cfg) as server:
        server.ensure(str(MODEL))
        yield f"{server.base_url}/v1"


@pytest.fixture
def resources(endpoint, tmp_path):
    """The profile's sections a user writes for an OpenAI-compatible policy and teacher (docs/configuration.md)."""
    sections = {"policy": {"base_url": endpoint, "served_model": SERVED_NAME, "api_key": "EMPTY"},
                "teacher": {"base_url": endpoint, "model": SERVED_NAME, "api_key": "EMPTY", "max_retries": 4,
                            "backoff_s": 0.0, "timeout_s": 1800.0}}  # per request, retries included: a busy CPU is slow
    return resources_from_sections(sections, policy_backend="openai", where="test profile", runs_dir=tmp_path,
                                   model_path=str(MODEL), iterations=1)


@pytest.mark.timeout(3600)
def test_openai_policy_backend_plays_episodes_on_a_real_server(resources):
    policy = resources["policy"]
    assert isinstance(policy, OpenAICompatiblePolicy)
    gen = policy.generator(str(MODEL), "k0")
    cfg = RolloutConfig(temperature=0.0, max_new_tokens=48, parallel_envs=2, max_steps=2)
    trajs = run_rollouts([(counter_task(i), 0) for i in range(2)], make_env=CounterEnv, generator=gen,
                         instructions="Count up. The only action is: inc", normalize_action=str.strip, cfg=cfg)
    assert [t.status for t in trajs] == ["ok", "ok"]
    steps = [s for t in trajs for s in t.steps]
    assert len(steps) >= 2 and all(s.next_observation for s in steps)  # the env answered every step
    # Token counts are the server's usage figures: the prompt as the model's own chat template renders it.
    assert all(0 < s.completion_tokens <= 48 and s.prompt_tokens > 20 for s in steps)
    tok = load_tokenizer(MODEL)
    prompt = [{"role": "user", "content": "Count to 3. Answer with a line 'Action: inc'."}]
    want = len(tok(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"])
    a, b = gen.generate([prompt, prompt], temperature=0.0, max_new_tokens=24)
    assert a.prompt_tokens == b.prompt_tokens == want
    assert a.text and a.text == b.text and 0 < a.completion_tokens <= 24  # greedy: the same answer twice
    # Each step's action is what the rollout parsed out of the model's real answer (or, without an
    # Action line, an invalid step the env was told about).
    for s in steps:
        assert s.invalid or (s.action and parse_response(f"Action: {s.action}").action == s.action)
    assert gen.model_id == f"{policy.base_url}#{SERVED_NAME}"


@pytest.mark.timeout(3600)
def test_openai_teacher_asks_parses_and_caches_on_a_real_server(resources, tmp_path):
    assert isinstance(resources["teacher"], OpenAITeacherResource)
    store = Store(tmp_path / "fw.duckdb")
    teacher = resources["teacher"].build(None, store)  # the spec is not used by the OpenAI-compatible teacher
    messages = [{"role": "user", "content": "Name one tool for opening a locked door. One word."}]
    answer = teacher.chat(messages, parse=lambda text: text.strip())
    assert answer and len(answer) < 2000  # an answer within the server's 96-token budget
    [(cached,)] = store.query("SELECT response FROM teacher_cache").rows()
    assert cached.strip() == answer

    client, teacher.client = teacher.client, None  # no endpoint: the same request must come from the cache
    assert teacher.chat(messages, parse=lambda text: text.strip()) == answer
    teacher.client = client

    # The annotations' JSON parser on a real answer: asked to echo an annotation, the model does so in about
    # 2 of 3 samples (measured; prose otherwise), and a prose answer is asked again, up to 5 attempts in all.
    copy = [{"role": "system", "content": "You output JSON only."},
            {"role": "user", "content": f"Output this JSON unchanged: {ANNOTATION}"}]
    [note] = teacher.chat(copy, parse=lambda text: parse_annotations(text, expected=1, redact=teacher.redact))
    assert note.plan == "Increment once." and note.thought.startswith("The value is 0")
    assert store.query("SELECT count(*) FROM teacher_cache").item() == 2  # only the answer that parsed

    # annotate: the real ANNOTATE_INSTRUCTIONS. SmolLM2-135M answers them in prose (measured: "The goal is to
    # count to 1, ..."), so it is asked again (max_retries 1 here) and the error shows what it answered; a
    # JSON answer would parse into one note per step. Only a parsed answer is cached.
    teacher.max_retries = 1
    traj = Trajectory(benchmark="counter", split="train", task_id="c0", source="expert", goal="count to 1",
                      steps=[Step(observation="Value is 0.", thought="", plan="", action="inc",
                                  next_observation="Value is 1.", reward=1.0, done=True)], success=True)
    try:
        notes = teacher.annotate(traj, "Count up. The only action is: inc")
    except TeacherError as exc:
        assert "failed after 2 attempt(s): unusable answer" in str(exc)
        assert store.query("SELECT count(*) FROM teacher_cache").item() == 2
    else:
        assert len(notes) == 1 and notes[0].plan
        assert store.query("SELECT count(*) FROM teacher_cache").item() == 3
