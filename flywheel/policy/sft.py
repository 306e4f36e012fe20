"""Supervised fine-tuning on fused planning quaternions, with TRL's SFTTrainer.

One training example per step: the prompt is the fused context (history keeps
only p_t and a_t), the completion is the full "Thought/Plan/Action" answer. Loss
is on the completion only. Examples longer than `max_length` are dropped and
counted, never truncated (truncation would cut the answer the loss is on).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
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
from flywheel.policy.models import cpu_has_bf16, load_tokenizer, require_model

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
    # Tokens of each kept example's answer (the completion's text alone): what the policy learns to generate,
    # to size `max_new_tokens` against (flywheel.core.metrics.answer_lengths).
    answer_tokens: tuple[int, ...] = ()
    # The step of the saved state this attempt resumed from (0: trained from the start): steps - resumed_at were
    # trained, and timed, in this attempt.
    resumed_at: int = 0


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
    """Identity of a training job: same base model, examples (in order) and config -> same fingerprint."""
    config = asdict(cfg)
    config.update(config.pop("prompt"))  # flat, as before `PromptShape`: old fingerprints stay valid
    # Fields added later, at the value that behaves as before they existed: older fingerprints stay valid.
    for name, default in (("history_mode", "fused"), ("group_by_length", False), ("whole_passes", False)):
        if config.get(name) == default:
            config.pop(name)
    config.pop("save_minutes")  # where the trainer saves its state, not what it trains
    # A micro-batch of the whole batch is how every checkpoint trained before the field existed.
    if (config.get("micro_batch_size") or cfg.batch_size) == cfg.batch_size:
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
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer


    if not examples:
        raise ValueError("no training examples: the dataset is empty")
    base = require_model(base_model)
    tok = load_tokenizer(base)
    tok.padding_side = "right"
    lengths = [example_tokens(tok, r) for r in examples]
    fits = [n <= cfg.max_length for n in lengths]
    kept, dropped = keep_fitting(examples, fits, what="example", max_length=cfg.max_length, progress=progress)
    micro, accum = micro_batching(cfg)
    fingerprint = training_fingerprint(base_model, examples, cfg) if cfg.save_minutes else None
    out, work = unpublished_dirs(out_dir, resumable=fingerprint)
    resume_from = saved_state(work, fingerprint) if fingerprint else None
    dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in kept])
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
        save_strategy="no",  # saves are _SaveEvery's, by the clock
        save_total_limit=1,
        report_to="none",
        seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.bf16 if cfg.bf16 is not None else (torch.cuda.is_available() or cpu_has_bf16()),
        gradient_checkpointing=cfg.gradient_checkpointing,
        disable_tqdm=True,
        **({"train_sampling_strategy": "group_by_length"} if cfg.group_by_length and cfg.order == "shuffle" else {}),
    )
    args.max_steps = planned_steps(len(kept), cfg, int(args.world_size))  # whole passes (TrainConfig.whole_passes)
    peft_config = None
    if cfg.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear", task_type="CAUSAL_LM")

    trainer_cls = SFTTrainer if cfg.order == "shuffle" else _InOrderSFTTrainer()
    trainer = trainer_cls(
        model=str(base), args=args, train_dataset=dataset, processing_class=tok, peft_config=peft_config,
        callbacks=[_ProgressCallback(progress)] + ([_SaveEvery(cfg.save_minutes)] if cfg.save_minutes else []),
    )
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
        answer_tokens=tuple(answer_tokens(tok, r) for r in kept),
        resumed_at=saved_step(resume_from) if resume_from else 0,
    )
    del trainer, model
    trim_heap()
    return trained


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
    PrinterCallback; the loss goes to `progress` (the run log) through _ProgressCallback instead."""
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


def _progress_callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


class _ProgressCallback(_progress_callback_base()):
    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
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
            self.progress(f"sft step {state.global_step}/{state.max_steps} loss={logs['loss']:.4f}")


class _SaveEvery(_progress_callback_base()):
    """Asks the Trainer to save its whole state (into `output_dir`, the `.partial` folder) when `minutes` have
    passed since the start or the last save; not at the last step, whose weights are published anyway."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < state.max_steps and time.monotonic() - self.last >= self.seconds:
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()
