"""Tiny local model: tokenizer, chat template with generation markers, batched generation that stops."""

import pytest

from flywheel.policy.inference import TransformersGenerator, cut_after_action
from flywheel.policy.models import ModelNotFoundError, load_tokenizer, require_model


def test_chat_template_marks_assistant_for_loss(tiny):
    tok = load_tokenizer(tiny)
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Action: look"}]
    out = tok.apply_chat_template(msgs, return_assistant_tokens_mask=True, return_dict=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert "Action: look" in tok.decode(masked)
    assert "hi" not in tok.decode(masked)
    assert tok.padding_side == "left"


def test_batched_generation_counts_tokens(tiny):
    gen = TransformersGenerator(str(tiny), max_batch_size=2)
    prompts = [[{"role": "user", "content": "x" * n}] for n in (5, 50, 20)]
    outs = gen.generate(prompts, temperature=0.8, max_new_tokens=8, seed=0)
    assert len(outs) == 3
    assert [o.prompt_tokens for o in outs] == [gen.count_prompt_tokens(p) for p in prompts]
    assert all(0 <= o.completion_tokens <= 8 for o in outs)


def test_cut_after_action():
    assert cut_after_action("Thought: a\nPlan: b\nAction: go north\nObservation: fake") == "Thought: a\nPlan: b\nAction: go north"
    assert cut_after_action("no action here") == "no action here"


def test_missing_model_names_the_fix(tmp_path):
    with pytest.raises(ModelNotFoundError, match="make model"):
        require_model(tmp_path / "nope")


def test_action_line_stop_fires_exactly_after_each_rows_action_line(tiny):
    """Feed two rows token by token; each stops at the newline ending its own action line."""
    import torch

    from flywheel.policy.inference import action_line_stop

    gen = TransformersGenerator(str(tiny))
    tok = gen.tokenizer
    texts = ["Thought: a\nPlan: b\nAction: go north\nObservation: x\n",
             "Thought: long\nAction:\nPlan: c\nAction: look\nmore\n"]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, rows))
    rows = [r + [r[-1]] * (width - len(r)) for r in rows]  # pad by repeating: no new newline
    prompt = [[7, 8, 9]] * 2
    stop = action_line_stop(tok, 3, gen._newline_ids())
    fired_at: list[int | None] = [None, None]
    for n in range(1, width + 1):
        done = stop(torch.tensor([p + r[:n] for p, r in zip(prompt, rows, strict=True)]), None)
        for i in range(2):
            if done[i] and fired_at[i] is None:
                fired_at[i] = n
    for i in range(len(texts)):
        assert fired_at[i] is not None
        seen = tok.decode(rows[i][: fired_at[i]])
        assert seen.rstrip(" ").endswith("\n") and cut_after_action(seen).endswith(("go north", "look"))
        assert cut_after_action(tok.decode(rows[i][: fired_at[i] - 1])) == tok.decode(rows[i][: fired_at[i] - 1]).strip()


def test_looping_answers_are_recognised():
    from flywheel.policy.inference import looping

    assert looping("Thought: then commit to the " + "baby " * 8)
    assert looping("Thought: ok\n" + "Thought': '" * 8)
    assert not looping("Thought: then commit to the " + "baby " * 6)  # 6 in a row is not yet a loop
    assert not looping("Thought: I see an egg egg egg egg egg here.\nPlan: focus")
    assert not looping("Thought: " + "baby " * 10 + "\nPlan: p\nAction: focus on baby\n")  # it has its action
    assert not looping("Thought: look around the kitchen, then the hallway, then the garden and the bedroom.")


def test_action_line_stop_ends_a_looping_row_only_when_asked(tiny):
    """Row 0 loops, row 1 writes a normal thought: with stop_on_loop only row 0 stops, at a check."""
    import torch

    from flywheel.policy.inference import action_line_stop

    gen = TransformersGenerator(str(tiny))
    tok = gen.tokenizer
    texts = ["Thought: commit to the " + "baby " * 30,
             "Thought: I will look around, " + ", ".join(f"then room {i}" for i in range(40))]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = min(map(len, rows))
    prompt = [[7, 8, 9]] * 2

    def fired(stop_on_loop):
        stop = action_line_stop(tok, 3, gen._newline_ids(), stop_on_loop=stop_on_loop, loop_every=4)
        at: list[int | None] = [None, None]
        for n in range(1, width + 1):
            done = stop(torch.tensor([p + r[:n] for p, r in zip(prompt, rows, strict=True)]), None)
            for i in range(2):
                if done[i] and at[i] is None:
                    at[i] = n
        return at

    assert fired(False) == [None, None]
    at = fired(True)
    assert at[1] is None and at[0] is not None and at[0] % 4 == 0 and at[0] < width
    assert tok.decode(rows[0][: at[0]]).count("baby") >= 8


def test_auto_dtype_follows_the_hardware(monkeypatch):
    """bf16 only where it is native: an AVX2-only CPU computes it ~100x slower than float32."""
    import flywheel.policy.models as training
    from flywheel.policy.models import resolve_dtype
    from flywheel.policy.vllm_server import VLLMServerConfig

    monkeypatch.setattr(training, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert resolve_dtype("auto") == "float32" and resolve_dtype("bfloat16") == "bfloat16"
    assert VLLMServerConfig().server_dtype() == "float32"
    assert "--dtype float32" in " ".join(VLLMServerConfig().argv("/m", 1234))
    monkeypatch.setattr(training, "cpu_has_bf16", lambda: True)
    assert resolve_dtype("auto") == "bfloat16" and VLLMServerConfig().server_dtype() == "bfloat16"
    assert VLLMServerConfig(dtype="float32").server_dtype() == "float32"
