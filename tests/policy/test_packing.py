"""Packed SFT computes the loss of per-step SFT: each answer sees exactly its own prompt, at its own positions.

The equivalence is checked where it matters, on trajectories of every benchmark (each with its real system
prompt; fused and ReAct prompts; past observations clipped, so the latest one is a branch of its own): the
per-token log-probabilities of every answer, packed vs one causal pass per example (at most 1e-4 apart), and
the gradient of one optimizer step's loss (cosine at least 0.9999), on the tiny model and on SmolLM2-135M in
float32.
"""

import math

import pytest

from envs import REGISTRY, get_benchmark
from flywheel.core.prompting import PromptShape
from flywheel.core.settings import SMOLLM2_DIR
from flywheel.core.trajectory import Step, Trajectory
from flywheel.policy.models import load_tokenizer, prepare_smollm2
from flywheel.policy.packing import (
    Pack,
    ancestor_mask,
    example_ids,
    pack,
    packed_attention_implementation,
    per_step_logps,
    target_logps,
    tree_segments,
)
from flywheel.policy.sft import (
    TrainConfig,
    packed_steps,
    sft_examples,
    step_batches,
    train_sft,
    training_fingerprint,
    trajectory_groups,
)
from tests.fakes import make_traj

# What an observation of each benchmark looks like (the prompts' system messages are the specs' own).
OBSERVATIONS = {
    "alfworld": "You are in the middle of a room. Looking quickly around you, you see a cabinet {i}, a countertop 1, "
                "a drawer 2, a fridge 1, a garbagecan 1, a microwave 1, a shelf 3, a sinkbasin 1, and a toaster 1.",
    "scienceworld": "This room is called the kitchen. In it, you see: the agent, a substance called air, a chair. On "
                    "the chair is: nothing. a counter. On the counter is: a bowl (containing a red apple {i}), a "
                    "drawer. a freezer. The freezer door is closed. You also see: A door to the outside (open).",
    "webshop": "[Search] Results: [B0{i}XK] Men's Slim Fit Stretch Chino Pants, Khaki | $24.99 [B0{i}YQ] Cotton "
               "Twill Jogger, Navy | $19.50 [Next >] Page 1 (Total results: 50). Instruction: i need chinos in khaki.",
}


def bench_trajs(benchmark: str, trajectories: int = 2, steps: int | None = None) -> list[Trajectory]:
    """Trajectories of `benchmark` (4 and 3 steps, or `steps` each) with long observations and thoughts."""
    obs = OBSERVATIONS[benchmark]
    out = []
    for task, n in (("a", steps or 4), ("b", steps or 3))[:trajectories]:
        steps = [Step(observation=obs.format(i=i), thought=f"I should look at item {i} because the goal needs it; "
                      f"then check what changed.", plan=f"check item {i}", action=f"examine item {i}",
                      next_observation=obs.format(i=i + 1)) for i in range(n)]
        out.append(Trajectory(benchmark=benchmark, split="train", task_id=f"{benchmark}-{task}", source="teacher",
                              goal="the goal", steps=steps, success=True, reward=1.0))
    return out


SHAPES = [PromptShape(), PromptShape(max_observation_chars=40, history_window=2),
          PromptShape(history_mode="react"), PromptShape(history_mode="react", max_observation_chars=40)]


def rows_of(benchmark: str, shape: PromptShape, **kwargs) -> list[dict]:
    spec = get_benchmark(benchmark)
    return sft_examples(bench_trajs(benchmark, **kwargs), lambda _t: spec.system_prompt(), shape)


def check_equivalence(model_dir: str, benchmark: str, shape: PromptShape, *, budget: int = 8192,
                      attention: str | None = None, **kwargs) -> dict:
    """Max abs log-prob difference and gradient cosine, packed vs per step, over every answer of the rows, with the
    model's attention `attention` (default: what packed SFT picks here)."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation=attention or packed_attention_implementation())
    model.eval()  # no dropout: the two passes see the same function
    tokenized = [example_ids(tok, r) for r in rows_of(benchmark, shape, **kwargs)]
    n_targets = sum(len(ids) - max(start, 1) for ids, start in tokenized)

    def grads(losses):
        model.zero_grad()
        total = 0.0
        for loss in losses():
            loss.backward()
            total += float(loss.detach())
        return total, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    ref_logps = []

    def per_step():
        for ids, start in tokenized:
            lp = per_step_logps(model, ids, start)
            ref_logps.append(lp.detach())
            yield -lp.sum() / n_targets

    packs = pack(tokenized, budget)
    got_logps = []

    def packed():
        for p in packs:
            lp = target_logps(model, p)
            got_logps.append(lp.detach())
            yield -lp.sum() / n_targets

    ref_loss, ref_grad = grads(per_step)
    got_loss, got_grad = grads(packed)
    ref, got = torch.cat(ref_logps), torch.cat(got_logps)
    assert ref.shape == got.shape == (n_targets,)
    return {"max_abs": float((ref - got).abs().max()), "loss": (ref_loss, got_loss),
            "cosine": float(torch.nn.functional.cosine_similarity(ref_grad.double(), got_grad.double(), dim=0)),
            "tokens": (sum(len(ids) for ids, _ in tokenized), sum(len(p) for p in packs))}


@pytest.mark.parametrize("benchmark", sorted(REGISTRY))
@pytest.mark.parametrize("shape", SHAPES, ids=["fused", "fused-clipped", "react", "react-clipped"])
def test_packed_equals_per_step_on_the_tiny_model(tiny, benchmark, shape):
    got = check_equivalence(tiny, benchmark, shape)  # the CPU's path: segment-wise tree attention
    assert got["max_abs"] <= 1e-4 and got["cosine"] >= 0.9999, got
    assert math.isclose(*got["loss"], rel_tol=1e-5)
    assert got["tokens"][1] < got["tokens"][0] / 2  # the shared prefixes computed once


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_dense_tree_mask_paths_agree_too(tiny, attention):
    """Models that keep their own attention get the tree as a dense mask (boolean for SDPA, additive for eager)."""
    got = check_equivalence(tiny, "scienceworld", SHAPES[1], attention=attention)
    assert got["max_abs"] <= 1e-4 and got["cosine"] >= 0.9999, got


def test_tree_segments_follow_the_tree():
    p = pack([([1, 2, 3, 4], 3), ([1, 2, 3, 5, 6], 4), ([1, 2, 3, 4, 7, 8], 5)], 64)[0]
    got = [(a, b, keys.tolist(), None if mask is None else mask.int().tolist()) for a, b, keys, mask in tree_segments(p)]
    # 1 2 3 4 | 5 6 (after 3) | 7 8 (after 4): each segment sees its ancestors and itself, causally
    assert got == [(0, 4, [0, 1, 2, 3], None),
                   (4, 6, [0, 1, 2, 4, 5], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
                   (6, 8, [0, 1, 2, 3, 6, 7], [[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> str:
    """SmolLM2-135M: `make model`'s copy when there is one, else converted from the installed wheel (~25 s)."""
    if (SMOLLM2_DIR / "config.json").exists():
        return str(SMOLLM2_DIR)
    return str(prepare_smollm2(tmp_path_factory.mktemp("smollm2") / "smollm2-135m"))


def test_packed_equals_per_step_on_smollm2(smollm2):
    """One trajectory prefix of two steps (SmolLM2 trains ~100 tokens/s here): fused, past observations clipped."""
    got = check_equivalence(smollm2, "scienceworld", SHAPES[1], trajectories=1, steps=2)
    assert got["max_abs"] <= 1e-4 and got["cosine"] >= 0.9999, got


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", sorted(REGISTRY))
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3]], ids=["fused-clipped", "react-clipped"])
def test_packed_equals_per_step_on_smollm2_every_benchmark(smollm2, benchmark, shape):
    got = check_equivalence(smollm2, benchmark, shape)
    assert got["max_abs"] <= 1e-4 and got["cosine"] >= 0.9999, got


def test_a_pack_shares_prefixes_and_keeps_each_answer_on_its_own_branch():
    p = Pack()
    p.add([1, 2, 3, 4], 3, 0)  # prompt 1 2 3, answer 4
    p.add([1, 2, 3, 5, 6], 4, 1)  # shares 1 2 3, then its own tail 5, answer 6
    p.add([1, 2, 3, 4, 7, 8], 5, 2)  # extends example 0's whole sequence (ReAct: the answer becomes history)
    assert p.input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert p.position_ids == [0, 1, 2, 3, 3, 4, 4, 5]  # each token at the position it has in its own example
    assert p.parents == [-1, 0, 1, 2, 2, 4, 3, 6]
    # (source position, label, example): 4 from 3, 6 from 5, 8 from 7
    assert list(zip(p.sources, p.labels, p.examples, strict=True)) == [(2, 4, 0), (4, 6, 1), (6, 8, 2)]
    mask = ancestor_mask(p.parents)
    assert [j for j in range(8) if mask[5, j]] == [0, 1, 2, 4, 5]  # example 1's answer never sees example 0's
    assert [j for j in range(8) if mask[7, j]] == [0, 1, 2, 3, 6, 7]
    assert p.new_tokens([1, 2, 3, 9]) == 1 and p.new_tokens([1, 2, 3, 4]) == 0


def test_packs_split_at_example_boundaries_each_with_its_own_trunk():
    examples = [([1, 2, 3, 10 + i, 20 + i], 4) for i in range(5)]  # a 3-token trunk, 2 tokens of its own each
    packs = pack(examples, 8)
    assert [len(p) for p in packs] == [7, 7, 5]  # 3 + 2 + 2, then a new pack repeats the trunk
    assert all(p.input_ids[:3] == [1, 2, 3] for p in packs)
    assert sorted(e for p in packs for e in p.examples) == [0, 1, 2, 3, 4]  # every answer, whole, once
    with pytest.raises(ValueError, match="more than the pack budget"):
        pack([([1] * 9, 8)], 8)
    # examples that share (almost) nothing get packs of their own: no more activations in one pass than per step
    unrelated = [([1, 10 + i, 20 + i, 30 + i, 40 + i, 50 + i], 5) for i in range(3)]
    assert [len(p) for p in pack(unrelated, 100)] == [6, 6, 6]


def test_steps_count_examples_as_per_step_sft_and_keep_trajectories_together():
    rows = sft_examples([make_traj("t1", n=3), make_traj("t2", n=2), make_traj("t3", n=4)], lambda t: "i")
    assert trajectory_groups(rows) == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    given = TrainConfig(batch_size=4, max_steps=5, order="given")  # 9 examples: 3 steps a pass; 5 -> 2 passes
    assert step_batches(rows, given) == [[0, 1, 2, 3], [4, 5, 6, 7], [8], [0, 1, 2, 3], [4, 5, 6, 7], [8]]
    shuffled = step_batches(rows, TrainConfig(batch_size=4, max_steps=3, order="shuffle", seed=1))
    flat = [i for b in shuffled for i in b]
    assert sorted(flat) == list(range(9)) and [len(b) for b in shuffled] == [4, 4, 1]
    groups = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2, 7: 2, 8: 2}
    runs = [groups[i] for i in flat]
    assert sum(a != b for a, b in zip(runs, runs[1:], strict=False)) == 2  # three whole trajectories in a row
    # epochs 1.5 of 3 steps a pass: ceil(4.5) = 5 steps, as the HF Trainer counts them
    assert len(step_batches(rows, TrainConfig(batch_size=4, max_steps=-1, epochs=1.5, order="given"))) == 5


def test_ranks_get_disjoint_shares_of_each_step():
    rows = sft_examples([make_traj("t1", n=3), make_traj("t2", n=3)], lambda t: "i")
    tokenized = [([1, 2, 3, 10 + i], 3) for i in range(len(rows))]
    items = packed_steps(rows, tokenized, TrainConfig(batch_size=3, max_steps=1, order="given"), world_size=2)
    # one step of 3 x 2 ranks = all 6 examples: rank 0 takes 0-2, rank 1 takes 3-5
    assert [it["examples"] for it in items] == [[0, 1, 2], [3, 4, 5]]
    assert [it["n_targets"] for it in items] == [3, 3]


def test_packing_is_part_of_the_fingerprint_and_per_step_hashes_as_before():
    rows = sft_examples([make_traj(n=2)], lambda t: "i")
    per_step = TrainConfig(packing="per_step")
    assert training_fingerprint("m", rows, per_step) != training_fingerprint("m", rows, TrainConfig())
    # a per-step fingerprint does not mention the field, so checkpoints trained before it still match
    import dataclasses
    import hashlib
    import json

    config = dataclasses.asdict(per_step)
    config.update(config.pop("prompt"))
    for name in ("history_mode", "group_by_length", "packing", "save_minutes", "pack_tokens", "report_to"):
        config.pop(name)
    payload = json.dumps({"base_model": "m", "config": config,
                          "examples": [[r["prompt"], r["completion"]] for r in rows]}, sort_keys=True, default=str)
    assert training_fingerprint("m", rows, per_step) == hashlib.sha256(payload.encode()).hexdigest()


def test_group_by_length_with_packing_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="packing: per_step"):
        TrainConfig(group_by_length=True)
    assert TrainConfig(group_by_length=True, packing="per_step").group_by_length


def test_packed_and_per_step_training_take_the_same_first_step(tiny, tmp_path):
    """The whole trainer, both ways, one optimizer step over the same examples: the same loss, the same update."""
    import torch
    from safetensors.torch import load_file

    rows = rows_of("scienceworld", SHAPES[1])
    base = load_file(f"{tiny}/model.safetensors")
    results, deltas = {}, {}
    for packing in ("per_step", "tree"):
        cfg = TrainConfig(max_steps=1, batch_size=len(rows), micro_batch_size=1, learning_rate=1e-3, order="given",
                          packing=packing, save_minutes=0, bf16=False)
        results[packing] = res = train_sft(tiny, rows, tmp_path / packing, cfg)
        weights = load_file(f"{res.path}/model.safetensors")
        deltas[packing] = torch.cat([(weights[k] - base[k]).flatten() for k in sorted(base)])
    per_step, tree = results["per_step"], results["tree"]
    assert per_step.steps == tree.steps == 1 and per_step.n_examples == tree.n_examples == len(rows)
    assert math.isclose(per_step.train_loss, tree.train_loss, rel_tol=1e-5)
    assert per_step.tokens_per_pass == tree.tokens_per_pass == per_step.computed_tokens_per_pass
    assert tree.computed_tokens_per_pass < tree.tokens_per_pass / 2
    # AdamW's first update is about the gradient's sign: 0.9999 leaves room for coordinates whose gradient is ~0
    assert float(torch.nn.functional.cosine_similarity(deltas["per_step"], deltas["tree"], dim=0)) >= 0.9999


def test_the_flex_attention_block_mask_is_the_tree_mask():
    """The GPU path (FlexAttention, chosen on CUDA) reads the same tree mask: its mask function, evaluated at
    every (query, key), is the ancestor matrix."""
    import torch

    from flywheel.policy.packing import flex_block_mask

    p = pack([([1, 2, 3, 4], 3), ([1, 2, 3, 5, 6], 4), ([1, 2, 3, 4, 7, 8], 5)], 64)[0]
    dense = torch.from_numpy(ancestor_mask(p.parents))
    block = flex_block_mask(dense)
    q, kv = torch.meshgrid(torch.arange(len(p)), torch.arange(len(p)), indexing="ij")
    assert torch.equal(block.mask_mod(0, 0, q, kv), dense)
    assert block.shape[-2:] == (len(p), len(p))


@pytest.mark.slow
def test_packed_equals_per_step_through_flex_attention_on_cpu(tiny):
    """FlexAttention itself (unfused and compiled on the CPU: ~20 s the first time) gives the per-step log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="flex_attention")
    model.eval()
    tokenized = [example_ids(tok, r) for r in rows_of("alfworld", SHAPES[1])]
    with torch.no_grad():
        got = torch.cat([target_logps(model, p) for p in pack(tokenized, 4096)])
        ref = torch.cat([per_step_logps(model, ids, start) for ids, start in tokenized])
    assert float((got - ref).abs().max()) <= 1e-4
