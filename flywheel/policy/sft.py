"""Supervised fine-tuning on fused planning quaternions.

One training example per step: the prompt is the fused context (history keeps
only p_t and a_t), the completion is the full "Thought/Plan/Action" answer. Loss
is on the completion only. Examples longer than `max_length` are dropped and
counted, never truncated (truncation would cut the answer the loss is on).

Two ways to compute the same loss (`TrainConfig.packing`):
- "tree" (the default): the examples of an optimizer step are packed into prefix trees
  (`flywheel.policy.packing`): each shared prefix (the system message, the task, a trajectory's
  history) is computed once, and every answer still attends to exactly its own prompt. A step is
  still `batch_size` examples; trajectories are shuffled whole, so a trajectory's steps share a step.
- "per_step": TRL's SFTTrainer, one padded sequence per example (how every checkpoint before packing
  trained; committed presets pin it so their arms resume and reproduce).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from flywheel.core.options import Bound, option
from flywheel.core.progress import progress_bar
from flywheel.core.prompting import PromptShape, history_from_steps
from flywheel.core.trajectory import Trajectory
from flywheel.policy.logging_targets import log_callbacks, report_to, report_to_option
from flywheel.policy.models import cpu_has_bf16, load_tokenizer, require_model
from flywheel.policy.packing import (
    DEFAULT_PACKING,
    PACKINGS,
    example_ids,
    pack,
    packed_attention_implementation,
    target_logps,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """One SFT job's knobs (the policy resource exposes each under the same name, `max_steps` as
    `max_train_steps`)."""

    epochs: float = option(2.0, help="SFT epochs, when max_train_steps is -1",
                           bound=Bound(0, 1_000, integer=False, open_lo=True))
    learning_rate: float = option(5e-5, help="SFT learning rate", bound=Bound(0, 1, integer=False, open_lo=True))
    batch_size: int = option(8, help="examples per SFT optimizer step (what steps, passes and the curriculum "
                                     "count in)", bound=Bound(1, 1_024))
    # Peak memory is the activations of one micro-batch (SmolLM2-135M, steps of 8 at <= 1,024 tokens, float32,
    # on the 2-core machine: benchmarks/sft_memory.py); the loss is still the mean over every completion token
    # of the step.
    micro_batch_size: int | None = option(
        1, help="examples per forward/backward pass: a step runs batch_size / micro_batch_size accumulated "
                "micro-batches (memory); null: the whole step in one pass",
        bound=Bound(1, 1_024, why="examples per forward pass; a divisor of batch_size"))
    grad_accum: int = option(1, help="optimizer steps accumulate this many batches")
    max_length: int = option(3072, help="SFT examples longer than this many tokens are dropped, never truncated",
                             bound=Bound(16, 131_072, why="tokens per SFT example"))
    max_steps: int = option(-1, help="SFT optimizer steps per checkpoint (-1: use epochs)",
                            bound=Bound(1, 1_000_000, special=((-1, "use epochs"),)))
    lora: bool = option(False, help="train a LoRA adapter instead of every weight")
    lora_r: int = option(16, help="LoRA rank (alpha is twice the rank)", bound=Bound(1, 1_024))
    lora_alpha: int = option(32, help="LoRA alpha")
    seed: int = option(0, help="the SFT's seed (data order, initialisation of new weights)",
                       bound=Bound(0, 2**32 - 1))
    # cpu-comparison-scienceworld's k=0 set: 2.04x fewer tokens per pass packed (benchmarks/sft_packing.py,
    # docs/performance.md). The loss is the same (tests/policy/test_packing.py); what shares an optimizer step is
    # not (trajectories are shuffled whole), so the fingerprint records the packing.
    # A pack's activations grow with its tokens: on cpu-alfworld's k=0 set (bf16 autocast, 8 examples a step),
    # packs of at most 1,792 / 4,096 tokens peaked at 5.6 / 6.0 GiB RSS against 5.3 GiB per step, and took 7.4 /
    # 6.6 s against 16.3 s. 4,096 lets one step's trajectories share their prefixes (packs of up to ~3,000 tokens
    # on the presets' k=0 sets); lower it where memory is tight.
    pack_tokens: int = option(4096, help="packing tree: tokens per packed sequence, one forward/backward pass "
                                         "(activation memory grows with it); at least max_length is used",
                              bound=Bound(16, 1_048_576, why="tokens per packed sequence"))
    packing: Literal["tree", "per_step"] = option(
        DEFAULT_PACKING, help='"tree": each optimizer step\'s examples packed into prefix trees, every shared prefix computed '
                     'once and each answer attending to exactly its own prompt (trajectories shuffled whole); '
                     '"per_step": one padded sequence per example (TRL\'s SFTTrainer; how checkpoints trained before '
                     'packing)')
    order: Literal["shuffle", "given"] = option(
        "shuffle", help='"shuffle": the usual random order; "given": keep the dataset\'s order (the curriculum\'s '
                        'easy -> hard)')
    # On cpu-scienceworld-quick's 159 k=0 examples (462-946 tokens), random batches of 8 are 81% real tokens,
    # length-grouped 98%. Off by default: it changes which examples share a batch (and so the fingerprint).
    group_by_length: bool = option(
        False, help="with order shuffle: batches of similar length (transformers' LengthGroupedSampler), "
                    "fewer pad tokens")
    prompt: PromptShape = option(PromptShape(),
                                 help="how each example's prompt is built (flywheel.core.prompting)")
    # A cap below one pass used to stop the walk early and never train the hardest end (cpu-scienceworld's 16
    # steps of 8: 29 of 157 k=0 examples, 109 of 237 at replay-all k=1).
    whole_passes: bool = option(
        True, help="round max_train_steps to the nearest whole number of passes (at least one), so every example "
                   "is trained; false keeps the exact cap (the equal-compute control matches another arm's steps)")
    # Measured ~1.7x faster than fp32 for SmolLM2 SFT where the CPU has native bf16.
    bf16: bool | None = option(None, help="bf16 autocast; null: on for CUDA and for CPUs with native bf16 "
                                          "(AMX / AVX512-BF16)")
    # TRL turns it on by default, so it is set here.
    gradient_checkpointing: bool = option(
        False, help="activation recomputation: ~1/3 more compute for less memory (8B models on a GPU; pure cost "
                    "for a 135M model on a CPU)")
    # A three-pass ALFWorld SFT takes 100-110 min on the 2-core machine, most of a sitting: a kill loses at most
    # 15 min of it. A save of SmolLM2-135M is 1.6 GB (float32 weights, 0.54 GB, and AdamW's two moments) and took
    # 5.3 s there (cpu-alfworld bpo-from-base, sft:1): 0.6% of 15 min. One save is kept. Not part of the
    # training's identity (fingerprint): where the state is saved, not what is trained.
    save_minutes: float = option(
        15.0, help="save the trainer's state (weights, optimizer, data position) at most every this many minutes "
                   "into the checkpoint's .partial folder, so that a killed SFT resumes from its last save when it "
                   "is run again with the same model, examples and config (local SFT; 0: never save)",
        bound=Bound(0, 100_000, integer=False))

    # Where the loss curve goes (flywheel.policy.logging_targets); not part of the training's identity.
    report_to: str = report_to_option()

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {self.packing!r}")
        if self.packing == "tree" and self.group_by_length:
            raise ValueError("group_by_length batches examples of similar length to save pad tokens; packed SFT "
                             "(packing: tree) has none: set group_by_length: false, or packing: per_step")


def micro_batching(cfg: TrainConfig) -> tuple[int, int]:
    """(examples per forward pass, accumulation steps per optimizer step) for `cfg`; the micro-batch must divide the
    batch, so that every optimizer step sees exactly `batch_size * grad_accum` examples."""
    micro = cfg.micro_batch_size or cfg.batch_size
    if micro < 1 or cfg.batch_size % micro:
        raise ValueError(f"micro_batch_size={micro} must divide batch_size={cfg.batch_size}: "
                         "set policy.micro_batch_size to a divisor of policy.batch_size")
    return micro, cfg.grad_accum * (cfg.batch_size // micro)


@dataclass(frozen=True)
class TrainResult:
    path: str
    n_examples: int
    n_dropped: int
    train_loss: float
    steps: int
    # Positions (in `examples`) of the examples dropped as too long; the rest were trained on.
    dropped: tuple[int, ...] = ()
    # Processes that trained data-parallel (the HF Trainer's world size: > 1 under DDP, e.g. Ray Train workers).
    world_size: int = 1
    # Tokens (prompt + completion, chat template applied) of the examples kept: one pass over the set.
    tokens_per_pass: int = 0
    # Tokens the forward passes of one pass compute: tokens_per_pass per step, fewer packed (each shared prefix
    # once per pack; the mean over the passes trained).
    computed_tokens_per_pass: int = 0
    # Tokens of each kept example's answer (the completion's text alone): what the policy learns to generate,
    # to size `max_new_tokens` against (flywheel.core.metrics.answer_lengths).
    answer_tokens: tuple[int, ...] = ()
    # The step of the saved state this attempt resumed from (0: trained from the start): steps - resumed_at were
    # trained, and timed, in this attempt.
    resumed_at: int = 0
    # What the matmuls computed in: "bfloat16" (autocast over float32 weights) or "float32". Weights trained
    # in one differ from the other's, so runs that share a k=0 must share this too (a block, issue 55).
    compute_dtype: str = ""


def sft_examples(
    trajs: Sequence[Trajectory],
    instructions: Callable[[Trajectory], str],
    shape: PromptShape | None = None,
) -> list[dict]:
    """Prompt/completion rows, in the trajectories' order, one per step, prompts shaped by `shape`."""
    shape = shape or PromptShape()
    rows = []
    for tr in trajs:
        for t, step in enumerate(tr.steps):
            prompt = shape.messages(instructions(tr), tr.initial_observation, history_from_steps(tr.steps, upto=t))
            answer = shape.response(step.thought, step.plan, step.action)
            completion = [{"role": "assistant", "content": answer}]
            rows.append({"prompt": prompt, "completion": completion, "task_id": tr.task_id, "t": t})
    return rows


def episode_packs(tok, traj: Trajectory, instructions: str, shape: PromptShape, max_length: int) -> tuple[list, int]:
    """A whole trajectory's agent turns for log-probability scoring (DPO, GRPO): each turn's per-step example
    under `shape`, packed into prefix trees (`flywheel.policy.packing`), so every turn is scored under exactly
    the prompt the policy answered; and the longest per-step example's tokens. No packs when that is longer
    than `max_length` (the caller drops the trajectory, never truncates it)."""
    tokenized = [example_ids(tok, r) for r in sft_examples([traj], lambda _t: instructions, shape)]
    length = max((len(ids) for ids, _ in tokenized), default=0)
    return (pack(tokenized, max_length) if length <= max_length else []), length


def planned_steps(n_examples: int, cfg: TrainConfig, world_size: int = 1) -> int:
    """The optimizer steps a run of `n_examples` takes (-1: `cfg.epochs` decides): `cfg.max_steps`, rounded to
    the nearest whole number of passes (at least one) when `cfg.whole_passes`."""
    if cfg.max_steps <= 0 or not cfg.whole_passes:
        return cfg.max_steps
    per_pass = max(1, math.ceil(n_examples / (cfg.batch_size * cfg.grad_accum * world_size)))
    return per_pass * max(1, math.floor(cfg.max_steps / per_pass + 0.5))


def examples_never_trained(n_examples: int, cfg: TrainConfig, world_size: int = 1) -> int:
    """How many of the last examples a run in the given order (the curriculum's easy -> hard) never reaches:
    a step cap below one pass (`whole_passes` off) stops the walk early, and what it skips is the hardest
    end. Shuffled runs skip at random instead (0 here)."""
    steps = planned_steps(n_examples, cfg, world_size)
    if cfg.order != "given" or steps <= 0:
        return 0
    return max(0, n_examples - steps * cfg.batch_size * cfg.grad_accum * world_size)


def training_fingerprint(base_model: str | Path, examples: list[dict], cfg: TrainConfig) -> str:
    """Identity of a training job: same base model, examples (in order) and config -> same fingerprint.

    The config includes `packing` (when "tree"), which with the examples, `order`, `seed` and `batch_size`
    decides which examples share an optimizer step; per-step trainings hash as they did before the field."""
    config = asdict(cfg)
    config.update(config.pop("prompt"))  # flat, as before `PromptShape`: old fingerprints stay valid
    # Fields added later, at the value that behaves as before they existed: older fingerprints stay valid.
    for name, default in (("history_mode", "fused"), ("group_by_length", False), ("whole_passes", False),
                          ("packing", "per_step")):
        if config.get(name) == default:
            config.pop(name)
    config.pop("save_minutes")  # where the trainer saves its state, not what it trains
    config.pop("pack_tokens")  # how a step's examples are split into forward passes: the same loss either way
    config.pop("report_to")  # where the loss curve is written, not what is trained
    # A micro-batch of the whole batch is how every checkpoint trained before the field existed; packed SFT's
    # micro-batches are its packs (bounded by pack_tokens), whatever the field says.
    if (config.get("micro_batch_size") or cfg.batch_size) == cfg.batch_size or cfg.packing == "tree":
        config.pop("micro_batch_size", None)
    payload = json.dumps({"base_model": str(base_model), "config": config,
                          "examples": [[r["prompt"], r["completion"]] for r in examples]}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def examples_sha256(examples: list[dict]) -> str:
    """The training examples' identity alone (prompts and answers, in order), independent of the machine and
    of where the base model lives: two k=0 trainings with the same hash saw the same data, so different
    weights between them are numerical (the CPU, its math libraries), not a different dataset."""
    payload = json.dumps([[r["prompt"], r["completion"]] for r in examples], sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def keep_fitting(rows: Sequence, fits: Sequence[bool], *, what: str, max_length: int,
                 progress: Callable[[str], None]) -> tuple[list, int]:
    """The rows that fit `max_length` and how many were dropped (never truncated: the loss is on
    the end of a row); said through `progress`, and an error when nothing fits. SFT, DPO, GRPO."""
    kept = [r for r, ok in zip(rows, fits, strict=True) if ok]
    dropped = len(rows) - len(kept)
    if dropped:
        progress(f"dropped {dropped} {what}(s) longer than max_length={max_length}")
    if not kept:
        raise ValueError(f"every {what} is longer than max_length={max_length}")
    return kept, dropped


def unpublished_dirs(out_dir: str | Path, resumable: str | None = None) -> tuple[Path, Path]:
    """(the checkpoint directory, its `.partial` work directory): a trainer writes into the work
    directory and renames it into place, so a published checkpoint is complete and never overwritten.

    What a killed attempt left in the work directory is deleted, unless it was the same training (its
    `resume.json` holds `resumable`, the training's fingerprint): then it stays, to resume from."""
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"checkpoint directory {out} already exists: checkpoints are never overwritten; "
                              "train into a new directory (one per checkpoint id)")
    work = out.with_name(out.name + ".partial")
    if resumable is None or not _same_training(work, resumable):
        shutil.rmtree(work, ignore_errors=True)  # left by a killed attempt at another training
    if resumable is not None:
        work.mkdir(parents=True, exist_ok=True)
        (work / "resume.json").write_text(json.dumps({"fingerprint": resumable}))
    return out, work


def _same_training(work: Path, fingerprint: str) -> bool:
    try:
        return json.loads((work / "resume.json").read_text()).get("fingerprint") == fingerprint
    except (OSError, ValueError, AttributeError):  # none, or not what unpublished_dirs writes
        return False


def saved_state(work: str | Path, fingerprint: str) -> Path | None:
    """The trainer state a killed SFT of the training `fingerprint` saved in its work folder `work` (the
    highest step written to the end: `trainer_state.json` comes last), or None."""
    if not _same_training(Path(work), fingerprint):
        return None
    saved = [d for d in (Path(work) / "trainer").glob("checkpoint-*") if (d / "trainer_state.json").is_file()
             and d.name.removeprefix("checkpoint-").isdigit()]
    return max(saved, key=saved_step, default=None)


def saved_step(state: Path) -> int:
    """The optimizer step a saved trainer state (`checkpoint-N`) was written at."""
    return int(state.name.removeprefix("checkpoint-"))


def example_tokens(tokenizer, row: dict) -> int:
    """Tokens of a whole example (chat-templated prompt + answer), the length `max_length` is checked against."""
    text = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_tokens(tokenizer, row: dict) -> int:
    """Tokens of an example's answer text, as the policy generates it (no chat markers)."""
    return len(tokenizer("".join(m["content"] for m in row["completion"]), add_special_tokens=False)["input_ids"])


def train_sft(
    base_model: str | Path,
    examples: list[dict],
    out_dir: str | Path,
    cfg: TrainConfig = TrainConfig(),
    *,
    progress: Callable[[str], None] = log.info,
) -> TrainResult:
    """Fine-tune `base_model` on `examples`; publish a plain HF checkpoint at `out_dir` atomically.

    `out_dir` must not exist (one directory per checkpoint id): the model is written into
    `<out_dir>.partial` and renamed into place, so `out_dir` is either absent or complete, and
    nothing here ever deletes a published checkpoint.
    """
    import torch
    from trl import SFTConfig, SFTTrainer

    if not examples:
        raise ValueError("no training examples: the dataset is empty")
    base = require_model(base_model)
    tok = load_tokenizer(base)
    tok.padding_side = "right"
    packed = cfg.packing == "tree"
    # Packed SFT tokenizes each example as TRL's SFTTrainer does (flywheel.policy.packing.example_ids).
    tokenized = [example_ids(tok, r) for r in examples] if packed else None
    lengths = [len(ids) for ids, _ in tokenized] if packed else [example_tokens(tok, r) for r in examples]
    fits = [n <= cfg.max_length for n in lengths]
    kept, dropped = keep_fitting(examples, fits, what="example", max_length=cfg.max_length, progress=progress)
    micro, accum = micro_batching(cfg)
    fingerprint = training_fingerprint(base_model, examples, cfg) if cfg.save_minutes else None
    out, work = unpublished_dirs(out_dir, resumable=fingerprint)
    resume_from = saved_state(work, fingerprint) if fingerprint else None
    args = SFTConfig(
        output_dir=str(work / "trainer"),
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        learning_rate=cfg.learning_rate,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        max_length=cfg.max_length,
        completion_only_loss=True,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        logging_steps=1,
        save_strategy="no",  # saves are _save_every's, by the clock
        save_total_limit=1,
        report_to=report_to(cfg.report_to),
        seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.bf16 if cfg.bf16 is not None else (torch.cuda.is_available() or cpu_has_bf16()),
        activation_checkpointing=cfg.gradient_checkpointing,  # transformers 5 renamed gradient_checkpointing
        disable_tqdm=True,
        **({"train_sampling_strategy": "group_by_length"} if cfg.group_by_length and cfg.order == "shuffle" else {}),
    )
    args.max_steps = planned_steps(len(kept), cfg, int(args.world_size))  # whole passes (TrainConfig.whole_passes)
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM")

    callbacks = ([_progress_callback(progress)] + ([_save_every(cfg.save_minutes)] if cfg.save_minutes else [])
                 + log_callbacks(cfg.report_to, work / "model"))
    computed_per_pass = sum(n for n, ok in zip(lengths, fits, strict=True) if ok)
    if packed:
        kept_ids = [t for t, ok in zip(tokenized, fits, strict=True) if ok]
        steps = packed_steps(kept, kept_ids, cfg, int(args.world_size))
        computed_per_pass = packed_tokens_per_pass(steps, len(kept))
        # One dataset item per optimizer step and rank, walked in order: the Trainer's step counter, schedule,
        # saves and resume (it skips the items already trained) work as for the per-step trainer.
        args.per_device_train_batch_size, args.gradient_accumulation_steps = 1, 1
        args.num_train_epochs, args.max_steps = 1, len(steps) // int(args.world_size)
        args.remove_unused_columns = False
        model = _load_for_training(base, peft_config)
        trainer = _packed_trainer_class()(model=model, args=args, train_dataset=steps, processing_class=tok,
                                          data_collator=_one_step, callbacks=callbacks)
    else:
        from datasets import Dataset

        dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in kept])
        trainer_cls = SFTTrainer if cfg.order == "shuffle" else _InOrderSFTTrainer()
        trainer = trainer_cls(model=str(base), args=args, train_dataset=dataset, processing_class=tok,
                              peft_config=peft_config, callbacks=callbacks)
    if resume_from is not None:
        progress(f"sft resumes a killed attempt from its state saved at {resume_from.name} of {args.max_steps} steps")
    result = quiet(trainer).train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]  # every step's, across attempts
    model = trainer.model
    if cfg.lora:
        model = model.merge_and_unload()
    model.save_pretrained(work / "model")
    tok.padding_side = "left"
    tok.save_pretrained(work / "model")
    (work / "model" / "training.json").write_text(json.dumps({"config": asdict(cfg), "n_examples": len(kept)}))
    (work / "model").rename(out)  # atomic publish: `out` did not exist
    shutil.rmtree(work, ignore_errors=True)
    trained = TrainResult(
        path=str(out), n_examples=len(kept), n_dropped=dropped,
        # The Trainer's own mean covers the steps of this attempt only.
        train_loss=float(result.training_loss) if resume_from is None else sum(losses) / len(losses),
        steps=int(result.global_step),
        dropped=tuple(i for i, ok in enumerate(fits) if not ok), world_size=int(trainer.args.world_size),
        tokens_per_pass=sum(n for n, ok in zip(lengths, fits, strict=True) if ok),
        computed_tokens_per_pass=computed_per_pass,
        answer_tokens=tuple(answer_tokens(tok, r) for r in kept),
        resumed_at=saved_step(resume_from) if resume_from else 0,
        compute_dtype="bfloat16" if args.bf16 else "float32",
    )
    del trainer, model
    trim_heap()
    return trained


def trajectory_groups(rows: Sequence[dict]) -> list[list[int]]:
    """Positions of `rows` grouped by trajectory: a run of consecutive rows of one task whose step `t` counts up
    from 0 (as `sft_examples` writes them); a row without `t` is a group of its own."""
    groups: list[list[int]] = []
    prev = None
    for i, r in enumerate(rows):
        t = r.get("t")
        if t is None or prev is None or t == 0 or t != prev.get("t", -2) + 1 or r.get("task_id") != prev.get("task_id"):
            groups.append([])
        groups[-1].append(i)
        prev = r
    return groups


def step_batches(rows: Sequence[dict], cfg: TrainConfig, world_size: int = 1) -> list[list[int]]:
    """Which examples (positions in `rows`) each optimizer step of packed SFT trains, in order.

    Every step is `batch_size * grad_accum * world_size` examples, the last of a pass fewer, as per step; the
    number of steps is `planned_steps` (or `epochs` passes when it is -1), so steps, passes and the
    equal-compute control mean what they mean per step. Each pass walks whole trajectories: in the given order
    (the curriculum's easy -> hard) or shuffled (seeded by `seed` and the pass), so a trajectory's steps
    share an optimizer step and its prefixes are computed once."""
    groups = trajectory_groups(rows)
    size = cfg.batch_size * cfg.grad_accum * world_size
    per_pass = max(1, math.ceil(len(rows) / size))
    steps = planned_steps(len(rows), cfg, world_size)
    if steps <= 0:
        steps = max(1, math.ceil(cfg.epochs * per_pass))  # the HF Trainer's rule for epochs
    out: list[list[int]] = []
    for epoch in range(math.ceil(steps / per_pass)):
        order = list(groups)
        if cfg.order == "shuffle":
            random.Random(cfg.seed * 1_000_003 + epoch).shuffle(order)
        flat = [i for g in order for i in g]
        out += [flat[s:s + size] for s in range(0, len(flat), size)]
    return out[:steps]


def packed_steps(rows: Sequence[dict], tokenized: Sequence[tuple[list[int], int]], cfg: TrainConfig,
                 world_size: int = 1) -> list[dict]:
    """The dataset of packed SFT: per optimizer step and rank (rank r of step s at position s * world_size + r,
    where the Trainer's sharded loader hands it to rank r), its examples' packs of at most `pack_tokens` tokens
    (or `max_length`, if larger) and the number of answer tokens the step's loss is the mean over."""
    items = []
    for batch in step_batches(rows, cfg, world_size):
        share = math.ceil(len(batch) / world_size)
        for r in range(world_size):
            mine = batch[r * share:(r + 1) * share]
            packs = pack([tokenized[i] for i in mine], max(cfg.pack_tokens, cfg.max_length))
            items.append({"packs": packs, "n_targets": sum(len(p.labels) for p in packs), "examples": mine})
    return items


def packed_tokens_per_pass(items: Sequence[dict], n_examples: int) -> int:
    """Tokens computed per pass over the set (the mean over the passes the items make)."""
    tokens = sum(len(p) for it in items for p in it["packs"])
    trained = sum(len(it["examples"]) for it in items)
    return round(tokens * n_examples / max(trained, 1))


def _one_step(items: list[dict]) -> dict:
    """The packed dataset's collator: a batch is one item (one optimizer step of one rank)."""
    [item] = items
    return item


def _load_for_training(base: Path, peft_config=None):
    """The base model in float32 (as TRL's SFTTrainer loads it; bf16 is autocast) with the attention that takes
    the packs' tree masks (`packed_attention_implementation`), LoRA-wrapped when asked."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32,
                                                 attn_implementation=packed_attention_implementation())
    model.config.use_cache = False
    if peft_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config)
    return model


def _packed_trainer_class():
    """The HF Trainer with one packed optimizer step per dataset item: every pack's forward and backward pass in
    turn, its loss the sum of its answer tokens' negative log-probabilities over the step's answer tokens, so the
    step's loss is the mean over every answer token of the step, as the per-step trainer's."""
    import torch
    from torch.utils.data import SequentialSampler
    from transformers import Trainer

    class PackedSFTTrainer(Trainer):
        def _get_train_sampler(self, *args, **kwargs):  # noqa: D401 - Trainer hook: the items are already in order
            return SequentialSampler(self.train_dataset)

        def training_step(self, model, inputs, num_items_in_batch=None):
            model.train()
            total = 0.0
            for p in inputs["packs"]:
                with self.compute_loss_context_manager():
                    loss = -target_logps(model, p).sum() / max(inputs["n_targets"], 1)
                self.accelerator.backward(loss)
                total += float(loss.detach())
            return torch.tensor(total, device=self.args.device)

    return PackedSFTTrainer


def trim_heap() -> None:
    """Hand freed memory back to the OS: a long-lived process (a Dagster run, an experiment arm) trains several
    checkpoints, and glibc keeps freed heap pages unless asked (`malloc_trim(0)`) to return them."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def quiet(trainer):
    """No `{'loss': ...}` dicts on stdout: with `disable_tqdm` the HF Trainer prints every log through its
    PrinterCallback; the loss goes to `progress` (the run log) through _progress_callback instead."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


def _InOrderSFTTrainer():
    """SFTTrainer that walks the dataset in the given order (curriculum), not shuffled."""
    from torch.utils.data import SequentialSampler
    from trl import SFTTrainer

    class InOrderSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, *args, **kwargs):  # noqa: D401 - Trainer hook
            dataset = args[0] if args else kwargs.get("train_dataset", self.train_dataset)
            return SequentialSampler(dataset if dataset is not None else self.train_dataset)

    return InOrderSFTTrainer


def _progress_callback(progress: Callable[[str], None]):
    """A TrainerCallback that sends each step's loss to `progress` and draws a terminal bar (transformers is
    imported here, when a trainer is built, not when this module is: `report` and the CLI stay light)."""
    from transformers import TrainerCallback

    class ProgressCallback(TrainerCallback):
        def __init__(self) -> None:
            self.bar = None  # a terminal bar (steps, rate, ETA); silent when stderr is not a TTY

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = progress_bar(state.max_steps, "sft", unit="step")

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)

        def on_train_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                progress(f"sft step {state.global_step}/{state.max_steps} loss={logs['loss']:.4f}")

    return ProgressCallback()


def _save_every(minutes: float):
    """A TrainerCallback that asks the Trainer to save its whole state (into `output_dir`, the `.partial` folder)
    when `minutes` have passed since the start or the last save; not at the last step, whose weights are
    published anyway."""
    from transformers import TrainerCallback

    class SaveEvery(TrainerCallback):
        def __init__(self) -> None:
            self.seconds = minutes * 60
            self.last = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step < state.max_steps and time.monotonic() - self.last >= self.seconds:
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            self.last = time.monotonic()

    return SaveEvery()
