"""Evaluation metrics for a checkpoint on a split, and their tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flywheel.trajectory import Trajectory


def summarize(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """Success rate etc. Errored episodes (env crashes) are excluded from rates, and counted."""
    done = [t for t in trajs if t.status == "ok"]
    steps = [s for t in done for s in t.steps]
    n_steps = len(steps) or 1
    n = len(done) or 1
    return {
        "episodes": len(done),
        "errored": len(trajs) - len(done),
        "success_rate": sum(t.success for t in done) / n,
        "avg_reward": sum(t.reward for t in done) / n,
        "mean_steps": len(steps) / n,
        "tokens_per_step": sum(s.prompt_tokens + s.completion_tokens for s in steps) / n_steps,
        "prompt_tokens_per_step": sum(s.prompt_tokens for s in steps) / n_steps,
        "invalid_action_rate": sum(s.invalid for s in steps) / n_steps,
    }


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
