"""Gold (expert) path length of evaluation tasks, cached in DuckDB (`gold_lengths`).

A task's gold length is its `expert_actions` when the task carries them, else the spec's
`gold_length(task)` where it defines one (a benchmark with a cheaper or shorter reference
than its expert, e.g. a shipped walkthrough), else the length of `spec.expert_actions(task)`.

A task whose expert fails gets length None (bucket "unknown") and the error is cached too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from envs.base import BenchmarkSpec, EnvError, Task
from flywheel.core.store import Store
from flywheel.curriculum.tables import cached_gold_lengths, write_gold_lengths


def gold_length(spec: BenchmarkSpec, task: Task) -> int:
    if task.expert_actions:
        return len(task.expert_actions)
    own = getattr(spec, "gold_length", None)
    return own(task) if own is not None else len(spec.expert_actions(task))


def gold_lengths(
    db: Store, spec: BenchmarkSpec, benchmark: str, split: str, tasks: Sequence[Task],
    *, progress: Callable[[int, int], None] | None = None,
) -> dict[str, int | None]:
    """task_id -> gold length (None when no expert path), computing and caching the missing ones."""
    known = cached_gold_lengths(db, benchmark, split)
    todo = [t for t in tasks if t.task_id not in known]
    rows: list[tuple[str, int | None, str]] = []
    for i, task in enumerate(todo, 1):
        try:
            rows.append((task.task_id, gold_length(spec, task), ""))
        except (ValueError, KeyError, EnvError) as exc:
            rows.append((task.task_id, None, f"{type(exc).__name__}: {exc}"[:400]))
        if progress:
            progress(i, len(todo))
    write_gold_lengths(db, benchmark, split, rows)
    known.update({t: n for t, n, _ in rows})
    return {t.task_id: known.get(t.task_id) for t in tasks}
