"""Slow tier: a real vLLM CPU server from `.venv-vllm` (built by `make vllm`), real ScienceWorld episodes.

The tiny random Llama (head size 64, which vLLM's CPU attention supports) is served with
`--enforce-eager`, so the server starts without the minutes of torch.compile warm-up.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from flywheel.policy.models import build_tiny_model, has_generation_markers, load_tokenizer
from flywheel.policy.vllm_server import DEFAULT_PYTHON, group_alive
from flywheel.resources import ManagedVLLMPolicy
from flywheel.rollout.engine import RolloutConfig, run_rollouts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(DEFAULT_PYTHON).exists(),
                       reason=f"no vLLM environment at {DEFAULT_PYTHON}: run `make vllm` to build .venv-vllm"),
]
PROMPT = [[{"role": "user", "content": "Your task is to find a non-living thing. Observation: a kitchen."}]]



@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """Two same-shape checkpoints with Meta's Llama-3 template, saved as training saves them (marked)."""
    root = tmp_path_factory.mktemp("vllm_models")
    out = []
    for i in range(2):
        path = build_tiny_model(root / f"k{i}", hidden_size=128, heads=2, seed=i, template="llama3")
        load_tokenizer(path).save_pretrained(path)  # the model's own template plus generation markers
        out.append(path)
    return out


@pytest.mark.timeout(1200)
def test_real_vllm_server_plays_scienceworld_and_swaps_weights_in_place(tiny_pair, tmp_path):
    from envs import get_benchmark

    k0, k1 = tiny_pair
    policy = ManagedVLLMPolicy(base_model_path=str(k0), checkpoints_dir=str(tmp_path / "runs" / "checkpoints"),
                               server_args=["--enforce-eager"], max_model_len=4096, start_timeout_s=900)
    spec = get_benchmark("scienceworld")
    tasks = spec.load_tasks("train", task_types=("find-non-living-thing",))[:2]
    try:
        gen = policy.generator(str(k0), "k0")
        server = policy.server()
        pid = server.pid
        trajs = run_rollouts([(t, 0) for t in tasks], make_env=spec.make_env, generator=gen,
                             instructions=spec.system_prompt(), normalize_action=spec.normalize_action,
                             cfg=RolloutConfig(temperature=1.0, max_new_tokens=32, parallel_envs=2, max_steps=3))
        assert [t.status for t in trajs] == ["ok", "ok"]
        steps = [s for t in trajs for s in t.steps]
        assert steps and all(0 < s.completion_tokens <= 32 and s.prompt_tokens > 50 for s in steps)
        assert {t.model_id for t in trajs} == {"k0"}
        # vLLM renders the checkpoint's own (Llama-3, marked) template exactly as the trainer does.
        tok = load_tokenizer(k0)
        assert has_generation_markers(tok.chat_template)
        rendered = tok.apply_chat_template(PROMPT[0], add_generation_prompt=True, tokenize=False)
        assert rendered.startswith("<|begin_of_text|><|start_header_id|>user")
        want = len(tok(rendered, add_special_tokens=False)["input_ids"])
        assert gen.generate(PROMPT, temperature=0.0, max_new_tokens=4)[0].prompt_tokens == want

        def greedy_tokens() -> list:
            """Greedy tokens and log-probs of one prompt on what the server serves now."""
            client = OpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY")
            r = client.chat.completions.create(model="policy", messages=PROMPT[0], temperature=0.0, max_tokens=8,
                                               logprobs=True, top_logprobs=1, seed=0)
            return [(c.token, round(c.logprob, 2)) for c in r.choices[0].logprobs.content]

        a0 = greedy_tokens()
        policy.generator(str(k1), "k1")
        b = greedy_tokens()
        policy.generator(str(k0), "k0")
        a1 = greedy_tokens()
        assert server.pid == pid  # both swaps were in-place weight reloads, not restarts
        assert [e.event for e in server.events] == ["start", "reload", "reload"]
        assert a0 == a1  # back on k0's weights: k0's greedy answer again
        assert b != a0  # k1's weights answer differently
    finally:
        policy.shutdown()
    assert not group_alive(pid)
    assert (tmp_path / "runs" / "vllm" / "vllm-server.log").stat().st_size > 0
