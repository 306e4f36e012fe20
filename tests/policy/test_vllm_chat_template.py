"""Checkpoints keep their own chat template (trained and served with it); only generation markers are added.

A tiny model built with Meta's Llama-3 template (no `{% generation %}` markers) must keep rendering
Llama-3 turns through `load_tokenizer`, SFT and the saved checkpoint, with an assistant mask that
covers exactly the assistant turns; it is no longer switched to ChatML.
"""

from __future__ import annotations

import re

import pytest

from flywheel.policy.inference import TransformersGenerator
from flywheel.policy.models import (
    CHAT_TEMPLATE,
    LLAMA3_CHAT_TEMPLATE,
    add_generation_markers,
    build_tiny_model,
    ensure_training_template,
    has_generation_markers,
    load_tokenizer,
)
from flywheel.policy.sft import TrainConfig, train_sft

# SmolLM2-Instruct's own template as its GGUF ships it (no markers; a default system turn).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVO = [
    {"role": "system", "content": "Solve it."},
    {"role": "user", "content": "You are in the kitchen."},
    {"role": "assistant", "content": "Thought: look.\nPlan: look.\nAction: look around"},
    {"role": "user", "content": "Observation: a fridge."},
    {"role": "assistant", "content": "Thought: open.\nPlan: open.\nAction: open fridge"},
]


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("llama3") / "m", template="llama3")


def masked_text(tok, msgs) -> str:
    out = tok.apply_chat_template(msgs, return_assistant_tokens_mask=True, return_dict=True)
    return tok.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])


def test_llama3_template_is_kept_and_only_marked(llama3):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(llama3)
    assert raw.chat_template == LLAMA3_CHAT_TEMPLATE and not has_generation_markers(raw.chat_template)
    tok = load_tokenizer(llama3)
    assert has_generation_markers(tok.chat_template) and "<|start_header_id|>" in tok.chat_template
    for gen, msgs in ((False, CONVO), (True, CONVO[:4])):
        assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen) == raw.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=gen)
    assert "<|im_start|>" not in tok.apply_chat_template(CONVO, tokenize=False)
    # The loss mask: each assistant content with its end-of-turn token, nothing of the prompt.
    assert masked_text(tok, CONVO) == (
        "Thought: look.\nPlan: look.\nAction: look around<|eot_id|>Thought: open.\nPlan: open.\nAction: open fridge<|eot_id|>"
    )


def test_smollm2_own_template_gets_markers_not_chatml(llama3):
    tok = load_tokenizer(llama3)  # any tokenizer: the template is what is tested
    tok.chat_template = SMOLLM2_TEMPLATE
    assert ensure_training_template(tok) == "marked"
    text = tok.apply_chat_template(CONVO[1:], tokenize=False)
    assert "named SmolLM" in text  # its own default system turn survived: not replaced by CHAT_TEMPLATE
    assert masked_text(tok, CONVO[1:]).count("Action:") == 2
    assert "kitchen" not in masked_text(tok, CONVO[1:])


def test_unmarkable_template_is_kept_as_is_and_no_template_gets_chatml(llama3):
    tok = load_tokenizer(llama3)
    odd = "{{ messages | map(attribute='content') | join('\n') }}"  # no loop over messages
    assert add_generation_markers(odd) is None
    tok.chat_template = odd
    assert ensure_training_template(tok) == "own-unmarked" and tok.chat_template == odd
    tok.chat_template = None
    assert ensure_training_template(tok) == "chatml" and tok.chat_template == CHAT_TEMPLATE
    marked = re.sub(r"\{%-? *(end)?generation *-?%\}", "", CHAT_TEMPLATE)
    tok.chat_template = marked
    assert ensure_training_template(tok) == "marked"


@pytest.mark.timeout(600)
def test_sft_and_generation_on_a_llama3_template_checkpoint(llama3, tmp_path):
    from transformers import AutoTokenizer

    rows = [{"prompt": CONVO[:2], "completion": [CONVO[2]]}, {"prompt": CONVO[:4], "completion": [CONVO[4]]}]
    res = train_sft(llama3, rows, tmp_path / "ckpt", TrainConfig(max_steps=1, batch_size=2, bf16=False))
    saved = AutoTokenizer.from_pretrained(res.path)
    assert has_generation_markers(saved.chat_template) and "<|start_header_id|>" in saved.chat_template
    gen = TransformersGenerator(res.path, max_batch_size=2)
    prompt = gen.render(CONVO[:2])
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n") and "<|im_start|>" not in prompt
    out = gen.generate([CONVO[:2]], temperature=0.0, max_new_tokens=8)
    assert out[0].prompt_tokens > 10 and 0 < out[0].completion_tokens <= 8
