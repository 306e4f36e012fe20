"""ETO-style DPO on trajectory pairs, with TRL's DPOTrainer; the loss is on the agent's turns only.

A trajectory is one ReAct chat transcript (`flywheel.core.prompting`, history_mode "react"): system, the
task, then the agent's answers and the env's observations as alternating assistant/user turns.
A pair shares the task (the system and first user turn are the prompt); chosen and rejected are
the rest of two transcripts of that task: an expert (teacher) or successful trajectory, and a
failed rollout of the same task. Every token of the observation turns is masked out of the
loss: the sequence log-probability DPO compares is the sum over the agent's tokens, exactly
sum_t log pi(answer_t | transcript before it), which is what the policy is asked at each step.

TRL's `DPOTrainer` runs the optimisation (reference model = the starting checkpoint, its sigmoid
loss, logging, saving); this module only tokenizes the transcripts with their agent-turn masks,
hands them over pre-tokenized, and collates them with those masks as `completion_mask`.
Pairs longer than `max_length` are dropped and counted, never truncated.

With `packing` "tree" (the policy's SFT setting) a trajectory's log-probability is instead the sum over its
agent turns, each scored under exactly the prompt the policy answered at that step (history window, latest
observation unclipped), packed into prefix trees (`flywheel.policy.sft.episode_packs`); the sigmoid loss is
the same. "per_step" keeps the one-transcript scoring above (every past observation clipped, no window).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flywheel.core.options import Bound, check_bounds, option, option_field
from flywheel.core.prompting import Message, PromptShape, history_from_steps, react_messages
from flywheel.core.trajectory import Trajectory
from flywheel.policy.logging_targets import log_callbacks, report_to, report_to_option
from flywheel.policy.models import cpu_has_bf16, load_tokenizer, require_model
from flywheel.policy.packing import DEFAULT_PACKING, packs_logps, use_packed_attention
from flywheel.policy.sft import _progress_callback, episode_packs, keep_fitting, quiet, unpublished_dirs

log = logging.getLogger(__name__)

# Bounds of the numbers DPO and GRPO share with the SFT (TrainConfig) and the prompt (PromptShape): the same ranges.
LEARNING_RATE = Bound(0, 1, integer=False, open_lo=True)
MAX_LENGTH = Bound(16, 131_072, why="tokens per transcript")
MAX_STEPS = Bound(1, 1_000_000, special=((-1, "use epochs"),))
SEED = Bound(0, 2**32 - 1)
HISTORY_WINDOW = option_field(PromptShape, "history_window").metadata["bound"]
OBSERVATION_CHARS = option_field(PromptShape, "max_observation_chars").metadata["bound"]


@dataclass(frozen=True)
class DPOSettings:
    """One DPO job's knobs; the method resource exposes each as `dpo_<name>` (max_length, max_observation_chars
    and seed come from the policy's)."""

    beta: float = option(0.1, help="DPO's beta: how far the policy may move from the reference",
                         bound=Bound(0, 10, integer=False, open_lo=True))
    learning_rate: float = option(5e-6, help="DPO learning rate", bound=LEARNING_RATE)
    epochs: float = option(1.0, help="passes over the preference pairs (when max_steps is -1)",
                           bound=Bound(0, 1_000, integer=False, open_lo=True))
    batch_size: int = option(2, help="preference pairs per DPO optimizer step", bound=Bound(1, 1_024))
    max_length: int = option(3072, help="pairs whose transcript is longer than this many tokens are dropped",
                             bound=MAX_LENGTH)
    max_steps: int = option(-1, help="DPO optimizer steps (-1: use epochs)", bound=MAX_STEPS)
    max_observation_chars: int | None = option(None, help="past observations cut to this many characters",
                                                 bound=OBSERVATION_CHARS)
    seed: int = option(0, help="the DPO's seed", bound=SEED)
    bf16: bool | None = option(None, help="bf16 autocast; null: where the hardware has it natively")
    history_window: int | None = option(None, help="past steps a prompt keeps (the policy's; packing tree only)",
                                          bound=HISTORY_WINDOW)
    packing: str = option(DEFAULT_PACKING, help='"tree": each agent turn scored under its own rollout prompt, packed; '
                                       '"per_step": a trajectory as one transcript (the policy\'s packing)')
    report_to: str = report_to_option()

    def __post_init__(self) -> None:
        check_bounds(self, where="DPOSettings.")



@dataclass(frozen=True)
class Pair:
    """Chosen and rejected trajectory of one task (ids as in the store)."""

    task_id: str
    chosen: Trajectory
    rejected: Trajectory

    def record(self, benchmark: str, iteration: int) -> dict[str, Any]:
        return {"benchmark": benchmark, "iteration": iteration, "task_id": self.task_id,
                "chosen_id": self.chosen.traj_id, "rejected_id": self.rejected.traj_id,
                "chosen_source": self.chosen.source, "chosen_reward": float(self.chosen.reward),
                "rejected_reward": float(self.rejected.reward)}


@dataclass(frozen=True)
class DPOResult:
    path: str
    n_pairs: int
    n_dropped: int
    train_loss: float
    steps: int


def make_pairs(experts: Sequence[Trajectory], rollouts: Sequence[Trajectory], *, max_per_task: int = 2) -> list[Pair]:
    """Pairs (chosen, rejected) per task: chosen = the expert trajectory of the task if there is one, else a
    successful rollout; rejected = a failed (non-errored) rollout of the same task. At most `max_per_task`
    pairs per task, each failed rollout used once, in a stable order."""
    best: dict[str, list[Trajectory]] = {}
    for t in experts:
        if t.steps:
            best.setdefault(t.task_id, []).append(t)
    for t in sorted(rollouts, key=lambda t: t.traj_id):
        if t.status == "ok" and t.success and t.steps and t.task_id not in {e.task_id for e in experts}:
            best.setdefault(t.task_id, []).append(t)
    pairs: list[Pair] = []
    failed: dict[str, list[Trajectory]] = {}
    for t in sorted(rollouts, key=lambda t: t.traj_id):
        if t.status == "ok" and not t.success and t.steps:
            failed.setdefault(t.task_id, []).append(t)
    for task_id in sorted(failed):
        chosen = best.get(task_id)
        if not chosen:
            continue
        for i, rejected in enumerate(failed[task_id][:max_per_task]):
            pairs.append(Pair(task_id, chosen[i % len(chosen)], rejected))
    return pairs


def transcript(traj: Trajectory, instructions: str, *, max_observation_chars: int | None = None) -> list[Message]:
    """The trajectory as one ReAct chat: system, task, then answer/observation turns, ending on the last answer."""
    msgs = react_messages(instructions, traj.initial_observation, history_from_steps(traj.steps, upto=len(traj.steps)),
                          max_observation_chars=max_observation_chars)
    return msgs[:-1]  # the observation after the last action asks nothing of the agent


def _ids(tok, messages: list[Message], *, generation_prompt: bool = False) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def agent_tokens(tok, messages: list[Message]) -> tuple[list[int], list[int]]:
    """Token ids of the whole transcript, and a 0/1 mask that is 1 on the agent's (assistant) turns only.

    Each assistant turn spans from the end of the rendered transcript before it (with the generation
    prompt, as at inference) to the end of the rendered transcript including it; the chat template must
    render every prefix as a prefix (ChatML and Llama-3 templates do), else this raises.
    """
    full = _ids(tok, messages)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(_ids(tok, messages[:i], generation_prompt=True))
        upto = _ids(tok, messages[: i + 1])
        if full[: len(upto)] != upto or start > len(upto):
            raise ValueError("the chat template does not render a transcript's prefixes as prefixes; "
                             "agent-turn masks cannot be computed for this tokenizer")
        for j in range(start, len(upto)):
            mask[j] = 1
    return full, mask


def tokenize_pair(tok, pair: Pair, instructions: str, *, max_observation_chars: int | None = None) -> dict[str, Any]:
    """prompt_ids (system + task, with the generation prompt), chosen/rejected ids and their agent-turn masks."""
    chosen = transcript(pair.chosen, instructions, max_observation_chars=max_observation_chars)
    rejected = transcript(pair.rejected, instructions, max_observation_chars=max_observation_chars)
    if chosen[:2] != rejected[:2]:
        raise ValueError(f"pair of task {pair.task_id}: chosen and rejected start from different tasks")
    prompt = _ids(tok, chosen[:2], generation_prompt=True)
    out: dict[str, Any] = {"prompt_ids": prompt, "task_id": pair.task_id}
    for name, msgs in (("chosen", chosen), ("rejected", rejected)):
        ids, mask = agent_tokens(tok, msgs)
        if ids[: len(prompt)] != prompt:
            raise ValueError("the rendered task turn is not a prefix of the transcript")
        out[f"{name}_ids"], out[f"{name}_mask"] = ids[len(prompt):], mask[len(prompt):]
    return out


def _collator_class():
    import torch
    from trl.trainer.dpo_trainer import DataCollatorForPreference
    from trl.trainer.utils import pad

    class AgentTurnCollator(DataCollatorForPreference):
        """TRL's preference collator, with the completion mask set to the agent's turns only."""

        def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
            seqs, masks = [], []
            for side in ("chosen", "rejected"):
                for ex in examples:
                    seqs.append(torch.tensor(ex["prompt_ids"] + ex[f"{side}_ids"]))
                    masks.append(torch.tensor([0] * len(ex["prompt_ids"]) + ex[f"{side}_mask"], dtype=torch.long))
            return {
                "input_ids": pad(seqs, padding_value=self.pad_token_id, padding_side="right"),
                "attention_mask": pad([torch.ones_like(s) for s in seqs], padding_value=0, padding_side="right"),
                "completion_mask": pad(masks, padding_value=0, padding_side="right"),
            }

    return AgentTurnCollator


def packed_pair(tok, pair: Pair, instructions: str, cfg: DPOSettings) -> dict[str, Any]:
    """Chosen and rejected as packs of their agent turns under their rollout prompts (packing tree)."""
    shape = PromptShape(history_mode="react", history_window=cfg.history_window,
                        max_observation_chars=cfg.max_observation_chars)
    chosen, n_chosen = episode_packs(tok, pair.chosen, instructions, shape, cfg.max_length)
    rejected, n_rejected = episode_packs(tok, pair.rejected, instructions, shape, cfg.max_length)
    return {"chosen_packs": chosen, "rejected_packs": rejected, "length": max(n_chosen, n_rejected),
            "task_id": pair.task_id}


def _packed_batch(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"chosen_packs": [r["chosen_packs"] for r in rows], "rejected_packs": [r["rejected_packs"] for r in rows]}


def _packed_trainer_class():
    """The DPO trainer scoring each trajectory as the sum of its packed agent turns' log-probabilities (TRL's
    sigmoid loss, reference model and optimisation otherwise)."""
    import torch
    import torch.nn.functional as F

    class PackedDPOTrainer(_trainer_class()):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for model in (self.model, self.ref_model):
                if model is not None:
                    use_packed_attention(model)

        def _logps(self, model, batch: list) -> Any:
            return torch.stack([packs_logps(model, packs).sum() for packs in batch])

        def _compute_loss(self, model, inputs, return_outputs):
            mode = "train" if self.model.training else "eval"
            chosen, rejected = self._logps(model, inputs["chosen_packs"]), self._logps(model, inputs["rejected_packs"])
            with torch.no_grad():
                ref = self.ref_model if self.ref_model is not None else model
                ref_chosen = self._logps(ref, inputs["chosen_packs"])
                ref_rejected = self._logps(ref, inputs["rejected_packs"])
            chosen_rewards, rejected_rewards = chosen - ref_chosen, rejected - ref_rejected
            loss = -F.logsigmoid(self.beta * (chosen_rewards - rejected_rewards)).mean()
            margins = self.beta * (chosen_rewards - rejected_rewards).detach()
            self._metrics[mode]["rewards/margins"].append(margins.mean().item())
            self._metrics[mode]["rewards/accuracies"].append((margins > 0).float().mean().item())
            return (loss, {}) if return_outputs else loss

    return PackedDPOTrainer


def _trainer_class():
    from trl import DPOTrainer

    class TranscriptDPOTrainer(DPOTrainer):
        """DPOTrainer on pre-tokenized transcripts (prompt/chosen/rejected ids with agent-turn masks)."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset

    return TranscriptDPOTrainer


def train_dpo(
    start_model: str | Path,
    pairs: Sequence[Pair],
    instructions: str,
    out_dir: str | Path,
    cfg: DPOSettings = DPOSettings(),
    *,
    progress: Callable[[str], None] = log.info,
) -> DPOResult:
    """DPO from `start_model` (also the frozen reference) on `pairs`; publish a plain HF checkpoint at `out_dir`
    atomically (`<out_dir>.partial`, then a rename; `out_dir` must not exist)."""
    import torch
    from datasets import Dataset
    from trl import DPOConfig


    if not pairs:
        raise ValueError("no preference pairs: every task needs a chosen and a failed trajectory")
    start = require_model(start_model)
    tok = load_tokenizer(start)
    tok.padding_side = "right"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    packed = cfg.packing == "tree"
    if packed:
        rows = [packed_pair(tok, p, instructions, cfg) for p in pairs]
        fits = [r["length"] <= cfg.max_length for r in rows]
    else:
        rows = [tokenize_pair(tok, p, instructions, max_observation_chars=cfg.max_observation_chars) for p in pairs]
        fits = [len(r["prompt_ids"]) + max(len(r["chosen_ids"]), len(r["rejected_ids"])) <= cfg.max_length
                for r in rows]
    kept, dropped = keep_fitting(rows, fits, what="preference pair", max_length=cfg.max_length, progress=progress)
    out, work = unpublished_dirs(out_dir)
    args = DPOConfig(
        output_dir=str(work / "trainer"), beta=cfg.beta, learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.epochs, max_steps=cfg.max_steps, per_device_train_batch_size=cfg.batch_size,
        max_length=None, remove_unused_columns=False, lr_scheduler_type="constant", warmup_steps=0,
        logging_steps=1, save_strategy="no", report_to=report_to(cfg.report_to), seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=cfg.bf16 if cfg.bf16 is not None else (torch.cuda.is_available() or cpu_has_bf16()), disable_tqdm=True,
    )
    if packed:  # the packs stay Python objects: the dataset holds each pair's position, the collator its packs
        trainer = _packed_trainer_class()(
            model=str(start), args=args, train_dataset=Dataset.from_list([{"pair": i} for i in range(len(kept))]),
            processing_class=tok, data_collator=lambda batch: _packed_batch([kept[b["pair"]] for b in batch]),
            callbacks=[_progress_callback(progress)] + log_callbacks(cfg.report_to, work / "model"))
    else:
        trainer = _trainer_class()(
            model=str(start), args=args, train_dataset=Dataset.from_list(kept), processing_class=tok,
            data_collator=_collator_class()(pad_token_id=tok.pad_token_id),
            callbacks=[_progress_callback(progress)] + log_callbacks(cfg.report_to, work / "model"),
        )
    result = quiet(trainer).train()
    trainer.model.save_pretrained(work / "model")
    tok.padding_side = "left"
    tok.save_pretrained(work / "model")
    (work / "model" / "training.json").write_text(json.dumps({"dpo": asdict(cfg), "n_pairs": len(kept)}))
    (work / "model").rename(out)
    shutil.rmtree(work, ignore_errors=True)
    return DPOResult(path=str(out), n_pairs=len(kept), n_dropped=dropped, train_loss=float(result.training_loss),
                     steps=int(result.global_step))
