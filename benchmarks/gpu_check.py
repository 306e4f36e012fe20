"""Helpers of benchmarks/gpu_check.sh (a machine with an NVIDIA GPU). Each subcommand adds its
numbers to one JSON file (benchmarks/results/gpu_check.json), so a step that fails or runs out of
time leaves the others' numbers in place.

  make-8b DIR           config + SmolLM2's tokenizer for a Llama-3-8B-shaped model (no weights:
                        vLLM serves it with --load-format dummy, i.e. random weights)
  rollouts NAME DIR     managed vLLM server on DIR; rollouts on WebShop and ScienceWorld
  sft-step              one SFT step of the 8B shape (random init on the GPU), LoRA r16 +
                        gradient checkpointing, bf16; time and peak memory
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
OUT = HERE / "results" / "gpu_check.json"
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
                 tie_word_embeddings=False)


def record(key: str, value) -> None:
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    data[key] = value
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=2, default=str))
    print(f"[gpu_check] {key}: {json.dumps(value, default=str)[:600]}", flush=True)


def make_8b(out: Path, tokenizer_from: str) -> None:
    from transformers import AutoTokenizer, LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    cfg = LlamaConfig(**LLAMA3_8B, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, torch_dtype="bfloat16")
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    shutil.copy(Path(tokenizer_from) / "flywheel_model.json", out / "flywheel_model.json")


def rollouts(name: str, model_dir: str, episodes: int, max_steps: int, extra: list[str], vllm_python: str) -> None:
    from envs import get_benchmark
    from flywheel.policy.vllm_client import ManagedVLLMGenerator
    from flywheel.policy.vllm_server import VLLMServer, VLLMServerConfig
    from flywheel.rollout.engine import RolloutConfig, run_rollouts

    cfg = VLLMServerConfig(python=vllm_python, extra_args=tuple(extra), max_model_len=4096,
                           log_dir=str(HERE.parent / "runs" / "gpu_check"), start_timeout_s=420)
    result: dict = {"model": model_dir, "server_args": extra}
    with VLLMServer(cfg) as server:
        try:
            gen = ManagedVLLMGenerator(server, model_dir, name)
            result["server_start_s"] = server.events[-1].seconds
            for bench, types in (("webshop", None), ("scienceworld", ("find-non-living-thing",))):
                try:
                    spec = get_benchmark(bench)
                    tasks = spec.load_tasks("train", task_types=types)[:episodes] if types else \
                        spec.load_tasks("train")[:episodes]
                    t0 = time.perf_counter()
                    trajs = run_rollouts([(t, 0) for t in tasks], make_env=spec.make_env, generator=gen,
                                         instructions=spec.system_prompt(), normalize_action=spec.normalize_action,
                                         cfg=RolloutConfig(temperature=1.0, max_new_tokens=64,
                                                           parallel_envs=min(16, len(tasks)), max_steps=max_steps))
                    wall = time.perf_counter() - t0
                    toks = sum(s.completion_tokens for t in trajs for s in t.steps)
                    result[bench] = {"episodes": len(trajs), "ok": sum(t.status == "ok" for t in trajs),
                                     "steps": sum(len(t.steps) for t in trajs), "wall_s": round(wall, 1),
                                     "episodes_per_min": round(len(trajs) / wall * 60, 2),
                                     "gen_tokens_per_s": round(toks / wall, 1)}
                except Exception as exc:  # noqa: BLE001 - one benchmark failing must not hide the other's numbers
                    result[bench] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:]}
        except Exception as exc:  # noqa: BLE001
            result["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        result["events"] = [e.__dict__ for e in server.events]
    record(f"rollouts_{name}", result)


def sft_step(seq_len: int, batch: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    assert torch.cuda.is_available(), "no CUDA device"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA3_8B)).to(torch.bfloat16)
    init_s = time.perf_counter() - t0
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, LLAMA3_8B["vocab_size"], (batch, seq_len), device="cuda")
    times = []
    for _ in range(3):  # the first step includes CUDA/cuBLAS warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    record("sft_step_8b_lora", {
        "batch": batch, "seq_len": seq_len, "init_s": round(init_s, 1), "step_s": [round(x, 2) for x in times],
        "tokens_per_s_after_warmup": round(batch * seq_len / min(times[1:]), 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1), "trainable_params": trainable,
        "loss": float(loss), "gpu": torch.cuda.get_device_name(0),
    })


def packed_sft(model_dir: str) -> None:
    """Packed SFT on the GPU path (FlexAttention block masks, chosen on CUDA): SmolLM2's answer log-probs and
    one step's gradient, packed vs one causal pass per example, and the time of each."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(HERE.parent))
    from envs import get_benchmark
    from flywheel.core.prompting import PromptShape
    from flywheel.core.trajectory import Step, Trajectory
    from flywheel.policy.models import load_tokenizer
    from flywheel.policy.packing import (
        example_ids,
        pack,
        packed_attention_implementation,
        per_step_logps,
        target_logps,
    )
    from flywheel.policy.sft import sft_examples

    assert torch.cuda.is_available(), "no CUDA device"
    impl = packed_attention_implementation()
    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=impl).cuda().eval()
    spec = get_benchmark("scienceworld")
    obs = "This room is called the kitchen. In it, you see: a counter, a bowl (containing a red apple {i}), a drawer."
    trajs = [Trajectory(benchmark="scienceworld", split="train", task_id=f"t{k}", source="teacher", success=True,
                        steps=[Step(observation=obs.format(i=i), thought=f"look at item {i} first", plan=f"check {i}",
                                    action=f"examine item {i}", next_observation=obs.format(i=i + 1)) for i in range(8)])
             for k in range(4)]
    rows = sft_examples(trajs, lambda _t: spec.system_prompt(), PromptShape(max_observation_chars=60))
    tokenized = [example_ids(tok, r) for r in rows]
    n = sum(len(ids) - max(s, 1) for ids, s in tokenized)

    def run(packed: bool):
        model.zero_grad()
        torch.cuda.synchronize()
        t = time.perf_counter()
        logps = []
        for item in (pack(tokenized, 4096) if packed else tokenized):
            lp = target_logps(model, item) if packed else per_step_logps(model, *item)
            (-lp.sum() / n).backward()
            logps.append(lp.detach())
        torch.cuda.synchronize()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        return torch.cat(logps), grad, time.perf_counter() - t

    run(True), run(False)  # warm-up (FlexAttention compiles)
    got, got_grad, packed_s = run(True)
    ref, ref_grad, per_step_s = run(False)
    record("packed_sft_gpu", {
        "attention": impl, "examples": len(rows), "tokens_per_step": sum(len(i) for i, _ in tokenized),
        "tokens_packed": sum(len(p) for p in pack(tokenized, 4096)),
        "max_abs_logp_difference": float((got - ref).abs().max()),
        "grad_cosine": float(torch.nn.functional.cosine_similarity(got_grad, ref_grad, dim=0)),
        "packed_s": round(packed_s, 3), "per_step_s": round(per_step_s, 3), "gpu": torch.cuda.get_device_name(0),
    })


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-8b")
    m.add_argument("out")
    m.add_argument("--tokenizer-from", required=True)
    r = sub.add_parser("rollouts")
    r.add_argument("name")
    r.add_argument("model")
    r.add_argument("--episodes", type=int, default=16)
    r.add_argument("--max-steps", type=int, default=5)
    r.add_argument("--vllm-python", default=str(HERE.parent / ".venv-vllm" / "bin" / "python"))
    r.add_argument("--server-arg", action="append", default=[])
    s = sub.add_parser("sft-step")
    s.add_argument("--seq-len", type=int, default=1024)
    s.add_argument("--batch", type=int, default=4)
    k = sub.add_parser("packed-sft")
    k.add_argument("model")
    a = ap.parse_args()
    try:
        if a.cmd == "make-8b":
            make_8b(Path(a.out), a.tokenizer_from)
        elif a.cmd == "rollouts":
            rollouts(a.name, a.model, a.episodes, a.max_steps, a.server_arg, a.vllm_python)
        elif a.cmd == "packed-sft":
            packed_sft(a.model)
        else:
            sft_step(a.seq_len, a.batch)
    except Exception as exc:  # noqa: BLE001 - recorded, so the script's other steps still report
        record(f"error_{a.cmd}", {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
