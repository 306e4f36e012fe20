"""Multi-turn GRPO with the episode reward: G rollouts per task, group-normalised advantages on every agent turn.

The rollouts are played by the project's own batched engine (`flywheel.rollout.engine`), in the real
envs, like every other method's; each episode is one ReAct chat transcript
(`flywheel.policy.dpo.transcript`). For a task's group of G episodes with rewards r_i,
A_i = (r_i - mean(r)) / (std(r) + eps) (TRL's `scale_rewards="group"`), and A_i weighs every
token of every agent turn of episode i (observation turns are masked out). The loss is TRL
GRPO's clipped surrogate, normalised over all agent tokens of the batch (its "dapo"/token-level
normalisation), with beta = 0 (no KL term, TRL's default):

    L = -sum_tokens min(rho * A, clip(rho, 1 - eps, 1 + eps) * A) / n_tokens,  rho = pi / pi_rollout

With one pass over the data (`epochs=1`) rho = 1 and the step is the plain policy gradient.
Groups whose rewards are all equal carry no signal (A = 0) and are left out.

What pi scores (`packing`, the policy's SFT setting): "tree" scores each agent turn under exactly the prompt
the policy answered at rollout time (the history window, the latest observation unclipped and earlier ones
clipped), all turns of an episode packed into prefix trees (`flywheel.policy.packing`); "per_step" scores the
episode as one transcript with every past observation clipped and no window (how GRPO ran before packing,
which differs from the rollout prompts whenever a window or clipping is set).

Memory: an optimizer step of `batch_size` transcripts runs one transcript per forward/backward pass and
accumulates (`accumulate_step`), the same loss as the whole padded batch in one pass. In one pass, 4 ReAct
transcripts of up to ~2,000 tokens (SmolLM2-135M, float32, full-vocabulary logits and eager activations
for every position) took the update process to 19.4 GiB RSS and the OOM killer on the 24 GiB machine
(cpu-comparison-scienceworld's `grpo`, update step 8 of k=1).

Why not TRL's GRPOTrainer: it generates inside the trainer, one completion per prompt; its
multi-turn paths are tool calling (`environment_factory`, which needs a tool-calling chat
template and envs exposed as tool methods; our envs take free-text actions and SmolLM2-135M's
template has no tools) and an experimental `rollout_func`. Driving ScienceWorld/WebShop/ALFWorld
episodes of up to 30-50 turns through either would bypass the engine, store and resumable
rollouts every other method uses. So the rollouts stay in the harness, and the update uses TRL's
own pieces: `selective_log_softmax` for per-token log-probs and `pad` for batching.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from flywheel.core.options import Bound, check_bounds, option
from flywheel.core.prompting import PromptShape
from flywheel.core.trajectory import Trajectory
from flywheel.policy.dpo import (
    HISTORY_WINDOW,
    LEARNING_RATE,
    MAX_LENGTH,
    OBSERVATION_CHARS,
    SEED,
    agent_tokens,
    transcript,
)
from flywheel.policy.logging_targets import ScalarLog, report_to_option
from flywheel.policy.models import load_model, load_tokenizer, require_model
from flywheel.policy.packing import DEFAULT_PACKING, packs_logps, use_packed_attention
from flywheel.policy.sft import episode_packs, keep_fitting, unpublished_dirs

log = logging.getLogger(__name__)


class NoLearningSignal(ValueError):
    """Every group's rewards were equal (or no group had two episodes): the gradient is zero."""


@dataclass(frozen=True)
class GRPOSettings:
    """One GRPO update's knobs; the method resource exposes each as `grpo_<name>` (max_length,
    max_observation_chars and seed come from the policy's)."""

    # cpu-comparison-scienceworld, from one ReAct SFT (35/100), K=2: 1e-5 35/100 (did not move the greedy policy),
    # 3e-5 14/100, 1e-4 1/100 (experiments/results/cpu-comparison-scienceworld/notes.md).
    learning_rate: float = option(1e-5, help="GRPO learning rate", bound=LEARNING_RATE)
    epochs: int = option(1, help="passes over the rollouts (TRL's num_iterations); > 1 makes the clip matter",
                         bound=Bound(1, 1_000))
    clip: float = option(0.2, help="epsilon of the clipped probability ratio",
                         bound=Bound(0, 1, integer=False, open_lo=True))
    batch_size: int = option(4, help="transcripts per GRPO optimizer step (one per forward pass, accumulated)",
                            bound=Bound(1, 1_024))
    max_length: int = option(3072, help="transcripts longer than this many tokens are dropped, never truncated",
                             bound=MAX_LENGTH)
    max_observation_chars: int | None = option(None, help="past observations cut to this many characters",
                                                 bound=OBSERVATION_CHARS)
    seed: int = option(0, help="the GRPO update's seed", bound=SEED)
    history_window: int | None = option(None, help="past steps a prompt keeps (the policy's; packing tree only)",
                                          bound=HISTORY_WINDOW)
    packing: str = option(DEFAULT_PACKING, help='"tree": every agent turn scored under its own rollout prompt, packed; '
                                       '"per_step": the episode as one transcript (the policy\'s packing)')
    scale_rewards: bool = option(True, help="divide advantages by the group's reward std (GRPO); false: only "
                                            "centre them (Dr. GRPO)")
    report_to: str = report_to_option()

    def __post_init__(self) -> None:
        check_bounds(self, where="GRPOSettings.")



@dataclass(frozen=True)
class GRPOResult:
    path: str
    n_trajectories: int  # with a non-zero advantage, trained on
    n_groups: int  # groups with a learning signal
    n_dropped: int  # too long
    train_loss: float
    steps: int
    mean_reward: float


def group_advantages(trajs: Sequence[Trajectory], *, scale_rewards: bool = True, eps: float = 1e-4
                     ) -> list[tuple[Trajectory, float]]:
    """(trajectory, advantage) for every non-errored episode, grouped by task (errored episodes are left out)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajs:
        if t.status == "ok" and t.steps:
            groups.setdefault(t.task_id, []).append(t)
    out: list[tuple[Trajectory, float]] = []
    for task_id in sorted(groups):
        group = groups[task_id]
        rewards = [float(t.reward) for t in group]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) if len(rewards) > 1 else 0.0
        for t, r in zip(group, rewards, strict=True):
            adv = (r - mean) / (std + eps) if scale_rewards else r - mean
            out.append((t, adv if std > 0 else 0.0))
    return out


def token_logps(model, input_ids, attention_mask):
    """log pi(token_j | tokens_<j) for j >= 1, with TRL's selective_log_softmax."""
    from trl.trainer.utils import selective_log_softmax

    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    return selective_log_softmax(logits.float(), input_ids[:, 1:])


def clipped_loss(logps, old_logps, advantages, mask, clip: float, n_tokens: float | None = None):
    """TRL GRPO's clipped surrogate, token-level normalised; `mask` selects the agent's tokens. `n_tokens`:
    normalise by the agent tokens of the whole optimizer step instead of this batch's (accumulation)."""
    import torch

    ratio = torch.exp(logps - old_logps)
    adv = advantages.unsqueeze(1)
    per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    return (per_token * mask).sum() / (mask.sum().clamp_min(1) if n_tokens is None else n_tokens)


def accumulate_step(model, rows: Sequence[dict[str, Any]], old: Sequence[Any], pad_token_id: int, clip: float) -> float:
    """Backpropagate one optimizer step's loss over `rows` one episode at a time (`old[i]`: the playing
    policy's token log-probs of `rows[i]`); gradients accumulate in the model. Returns the step's loss: the
    clipped surrogate over every agent token of the step, as `clipped_loss` on the whole padded batch."""
    import torch

    n_tokens = max(sum(agent_token_count(r) for r in rows), 1)
    total = 0.0
    for row, old_lp in zip(rows, old, strict=True):
        if "packs" in row:  # every agent turn under its own prompt (packing tree)
            logps = packs_logps(model, row["packs"]).unsqueeze(0)
            adv = torch.tensor([row["advantage"]], dtype=torch.float32)
            loss = clipped_loss(logps, old_lp.unsqueeze(0), adv, torch.ones_like(logps), clip, n_tokens=n_tokens)
        else:
            ids, att, mask, adv = collate([row], pad_token_id)
            loss = clipped_loss(token_logps(model, ids, att), old_lp[: ids.shape[1] - 1].unsqueeze(0), adv, mask,
                                clip, n_tokens=n_tokens)
        loss.backward()
        total += float(loss.detach())
    return total


def agent_token_count(row: dict[str, Any]) -> int:
    return sum(len(p.labels) for p in row["packs"]) if "packs" in row else sum(row["mask"][1:])


def episode_rows(tok, traj: Trajectory, instructions: str, advantage: float, cfg: GRPOSettings) -> dict[str, Any]:
    """What GRPO trains on for one episode: its agent turns packed under their own rollout prompts (packing
    tree), or its one transcript with the agent-turn mask (per_step). `length`: the longest sequence the
    episode needs (per-step prompt + answer, or the transcript), checked against max_length."""
    if cfg.packing == "tree":
        shape = PromptShape(history_mode="react", history_window=cfg.history_window,
                            max_observation_chars=cfg.max_observation_chars)
        packs, length = episode_packs(tok, traj, instructions, shape, cfg.max_length)
        return {"packs": packs, "length": length, "advantage": advantage, "task_id": traj.task_id}
    ids, mask = agent_tokens(tok, transcript(traj, instructions, max_observation_chars=cfg.max_observation_chars))
    return {"input_ids": ids, "mask": mask, "length": len(ids), "advantage": advantage, "task_id": traj.task_id}


def collate(rows: Sequence[dict[str, Any]], pad_token_id: int):
    import torch
    from trl.trainer.utils import pad

    ids = [torch.tensor(r["input_ids"]) for r in rows]
    return (pad(ids, padding_value=pad_token_id, padding_side="right"),
            pad([torch.ones_like(i) for i in ids], padding_value=0, padding_side="right"),
            pad([torch.tensor(r["mask"][1:], dtype=torch.float32) for r in rows], padding_value=0, padding_side="right"),
            torch.tensor([r["advantage"] for r in rows], dtype=torch.float32))


def train_grpo(
    start_model: str | Path,
    trajs: Sequence[Trajectory],
    instructions: str,
    out_dir: str | Path,
    cfg: GRPOSettings = GRPOSettings(),
    *,
    progress: Callable[[str], None] = log.info,
) -> GRPOResult:
    """One GRPO update of `start_model` (the policy that played `trajs`) on their group advantages; publish
    a plain HF checkpoint at `out_dir` atomically. Raises NoLearningSignal when every advantage is 0."""
    import torch


    scored = group_advantages(trajs, scale_rewards=cfg.scale_rewards)
    useful = [(t, a) for t, a in scored if a != 0.0]
    if not useful:
        raise NoLearningSignal(f"no learning signal: all {len({t.task_id for t, _ in scored})} group(s) had equal "
                               "rewards (or one episode), so every advantage is 0")
    start = require_model(start_model)
    tok = load_tokenizer(start)
    rows = [episode_rows(tok, t, instructions, a, cfg) for t, a in useful]
    fits = [r["length"] <= cfg.max_length for r in rows]
    kept, dropped = keep_fitting(rows, fits, what="transcript", max_length=cfg.max_length, progress=progress)
    out, work = unpublished_dirs(out_dir)

    torch.manual_seed(cfg.seed)
    model = load_model(start)
    if cfg.packing == "tree":
        use_packed_attention(model)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    order = list(range(len(kept)))
    with torch.no_grad():  # log-probs of the policy that played the episodes (rho's denominator)
        model.eval()
        old = {}
        for i in order:
            if "packs" in kept[i]:
                old[i] = packs_logps(model, kept[i]["packs"])
            else:
                ids, att, _, _ = collate([kept[i]], pad_id)
                old[i] = token_logps(model, ids, att)[0]
        model.train()
    rng = random.Random(cfg.seed)
    losses, steps, started = [], 0, time.monotonic()
    curve = ScalarLog(cfg.report_to, work / "model")  # the loss curve, in the checkpoint's folder
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for s in range(0, len(order), cfg.batch_size):
            b = order[s: s + cfg.batch_size]
            opt.zero_grad()
            losses.append(accumulate_step(model, [kept[i] for i in b], [old[i] for i in b], pad_id, cfg.clip))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
            curve.log(steps, loss=losses[-1])
            progress(f"grpo epoch {epoch + 1}/{cfg.epochs} step {steps} loss={losses[-1]:.4f} "
                     f"({time.monotonic() - started:.0f}s)")
    curve.close()
    model.eval()
    model.save_pretrained(work / "model")
    tok.save_pretrained(work / "model")
    groups = len({r["task_id"] for r in kept})
    (work / "model" / "training.json").write_text(json.dumps({"grpo": asdict(cfg), "n_trajectories": len(kept),
                                                              "n_groups": groups}))
    (work / "model").rename(out)
    shutil.rmtree(work, ignore_errors=True)
    done = [t for t, _ in scored]
    return GRPOResult(path=str(out), n_trajectories=len(kept), n_groups=groups, n_dropped=dropped,
                      train_loss=sum(losses) / len(losses), steps=steps,
                      mean_reward=sum(t.reward for t in done) / max(len(done), 1))
