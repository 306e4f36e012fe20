"""Export the store for TRL / Hugging Face users: JSONL files and `datasets` folders with a card.

Per benchmark, under `out/<benchmark>/`:

- `trajectories`: every trajectory (expert, teacher, synthetic, policy rollouts and evaluation
  episodes), one row each, its steps nested (observation, thought e_t, plan p_t, action a_t, ...);
- `quaternions`: the teacher's planning quaternions (o_t, e_t, p_t, a_t), one row per step
  (sources teacher and synthetic: the stage-1/2 SFT data);
- `gated_k<k>`: the trajectories reward gate k let through (stage-3 data of iteration k+1);
- `sft_k<k>`: the (prompt, completion) pairs checkpoint k was given, in training order, in
  TRL's conversational prompt-completion format (`SFTTrainer` takes it as it is); examples dropped
  as too long are left out (they are in the store's `training_examples` with kept = false). The card
  says whether all were trained on: a step cap below one pass (`examples_never_trained` in the
  checkpoint's lineage) leaves the last, hardest ones untrained.

Each dataset is written as `<name>.jsonl` and as a `datasets` folder `hf/<name>/`
(`datasets.load_from_disk`) holding a dataset card (README.md) that names the benchmark, the
iteration, the teacher and the split. Plain code: no Dagster.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flywheel.core.store import Store
from flywheel.core.trajectory import Trajectory
from flywheel.core.validation import ConfigurationError


def _traj_row(t: Trajectory) -> dict[str, Any]:
    return {"traj_id": t.traj_id, "benchmark": t.benchmark, "split": t.split, "iteration": t.iteration,
            "source": t.source, "task_id": t.task_id, "sample": t.sample, "goal": t.goal, "success": bool(t.success),
            "reward": float(t.reward), "status": t.status, "model_id": t.model_id or "",
            "steps": [{k: v for k, v in asdict(s).items()} for s in t.steps]}


def _quaternion_rows(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    return [{"traj_id": t.traj_id, "task_id": t.task_id, "source": t.source, "t": i, "goal": t.goal,
             "observation": s.observation, "thought": s.thought, "plan": s.plan, "action": s.action}
            for t in trajs for i, s in enumerate(t.steps)]


def teacher_name(db: Store) -> str:
    """The teacher behind the quaternions: the cached model(s) of an OpenAI-compatible teacher, else scripted."""
    models = db.teacher_models()
    return ", ".join(models) if models else "scripted"


def _card(name: str, *, benchmark: str, iteration: str, teacher: str, split: str, rows: int, what: str,
          source: Path, details: dict[str, Any] | None = None, empty: str = "") -> str:
    extra = "".join(f"| {k} | {v} |\n" for k, v in (details or {}).items())
    note = (f"\n**This dataset is empty**: {empty}. Its `datasets` folder still loads (0 rows, the columns of a "
            f"non-empty one); its JSONL file has no line, which `load_dataset(\"json\")` cannot read (it infers the "
            f"columns from the first row): load this folder instead.\n") if not rows else ""
    return f"""---
pretty_name: flywheel {benchmark} {name}
tags: [flywheel, agents, {benchmark}, sft]
---

# flywheel {benchmark}: {name}

{what}
{note}
| | |
|---|---|
| benchmark | {benchmark} |
| iteration | {iteration} |
| teacher | {teacher} |
| split | {split} |
| rows | {rows} |
{extra}| exported from | `{source}` |

```python
from datasets import load_from_disk
ds = load_from_disk("{name}")  # this folder
```

Written by `python -m flywheel.cli export` (flywheel/reports/export.py).
"""


def _write(out: Path, name: str, rows: list[dict[str, Any]], card: dict[str, Any], *, hf: bool,
           shape: dict[str, Any]) -> dict[str, Any]:
    """`name`.jsonl and, with `hf`, the `datasets` folder hf/`name`/ with its card. An empty set's folder is written
    too, with the columns of `shape` (a row of the same kind), so that `load_from_disk` loads it (0 rows)."""
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{name}.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
    entry: dict[str, Any] = {"name": name, "rows": len(rows), "jsonl": str(jsonl)}
    if hf:
        from datasets import Dataset

        folder = out / "hf" / name
        dataset = Dataset.from_list(rows) if rows else Dataset.from_list([shape]).select([])
        dataset.save_to_disk(str(folder), num_shards=1 if not rows else None)
        (folder / "README.md").write_text(_card(name, rows=len(rows), **card), encoding="utf-8")
        entry["hf"] = str(folder)
    return entry


_SHAPE_STEP = {"observation": "", "thought": "", "plan": "", "action": "", "next_observation": "", "reward": 0.0,
               "done": False, "invalid": False, "prompt_tokens": 0, "completion_tokens": 0}
# One row of each kind: the columns (and their types) of an empty dataset of that kind.
SHAPES = {
    "trajectory": {"traj_id": "", "benchmark": "", "split": "", "iteration": 0, "source": "", "task_id": "",
                   "sample": 0, "goal": "", "success": False, "reward": 0.0, "status": "", "model_id": "",
                   "steps": [_SHAPE_STEP]},
    "quaternion": {"traj_id": "", "task_id": "", "source": "", "t": 0, "goal": "", "observation": "", "thought": "",
                   "plan": "", "action": ""},
    "sft": {"prompt": [{"role": "", "content": ""}], "completion": [{"role": "", "content": ""}], "traj_id": "",
            "task_id": "", "t": 0},
}


def _lineage(ck: dict[str, Any]) -> dict[str, Any]:
    raw = ck.get("lineage") or {}
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def _training_details(ck: dict[str, Any]) -> dict[str, Any]:
    """The card's rows about the training: base model, trainer settings and what was trained (from the lineage)."""
    lineage = _lineage(ck)
    details: dict[str, Any] = {"checkpoint": f"`{ck['checkpoint_id']}`",
                               "base model": f"`{ck.get('base_model') or lineage.get('base_model') or 'not recorded'}`",
                               "method": ck.get("method") or "bpo"}
    settings = {key: lineage[key] for key in ("train_steps", "batch_size", "micro_batch_size", "whole_passes",
                                              "refine_from", "replay") if key in lineage}
    if settings:
        details["trainer settings"] = ", ".join(f"{k}={v}" for k, v in settings.items())
    if lineage.get("dataset"):
        details["trained on"] = ", ".join(f"{k}: {v}" for k, v in lineage["dataset"].items())
    if "gated_iterations" in lineage:
        details["gated iterations read"] = str(lineage["gated_iterations"])
    for key, label in (("examples", "examples"), ("tokens_trained", "tokens trained"),
                       ("examples_sha256", "examples sha256")):
        if lineage.get(key) is not None:
            details[label] = lineage[key]
    if ck.get("train_loss") is not None:
        details["train loss"] = round(float(ck["train_loss"]), 4)
    return details


def _identical_to(db: Store, benchmark: str, ck: dict[str, Any], earlier: list[dict[str, Any]]) -> str:
    """Why sft_k<k> holds the same pairs as an earlier checkpoint's set ("" when it does not)."""
    sha = _lineage(ck).get("examples_sha256")
    same = [e for e in earlier if sha and _lineage(e).get("examples_sha256") == sha]
    if not same:
        return ""
    j, k = same[-1]["iteration"], ck["iteration"]
    empty = [g["iteration"] for g in db.gated_growth(benchmark)
             if j <= g["iteration"] < k and not int(g["new_unique_successes"] or 0)]
    why = (f"reward gate(s) k={', '.join(map(str, empty))} admitted no new trajectory (the loop went on, "
           "`continue_on_empty_gate`), so there was nothing new to add" if empty else
           "no gate between them added a training example")
    return f" **Identical to `sft_k{j}`** (the same pairs, in the same order): {why}."


def _sft_what(ck: dict[str, Any], n: int) -> str:
    """The card's sentence for `sft_k<k>`: which pairs these are, and whether the checkpoint trained on all of them."""
    lineage = ck.get("lineage") or {}
    never = (json.loads(lineage) if isinstance(lineage, str) else lineage).get("examples_never_trained")
    fmt = "in training order, in TRL's conversational prompt-completion format (`SFTTrainer(train_dataset=ds)`)"
    if never == 0:
        return f"The exact (prompt, completion) pairs checkpoint `{ck['checkpoint_id']}` trained on, {fmt}."
    given = f"The (prompt, completion) pairs checkpoint `{ck['checkpoint_id']}` was given, {fmt}"
    if never is None:
        return f"{given}. This store does not record whether its step cap stopped training before the last of them."
    return (f"{given}. Only the first {n - never} were trained on: its step cap (max_train_steps) stopped training "
            f"before the end, so the last {never} of these {n} (the hardest, in the curriculum's order) never were.")


def export_store(db: Store, out: str | Path, *, benchmarks: Sequence[str] | None = None, hf: bool = True,
                 progress: Any = None, replace: bool = False) -> list[dict[str, Any]]:
    """Write every dataset of each benchmark in the store; returns what was written (name, rows, paths).

    Everything is written into a fresh folder beside `out`, then moved into place whole: a failure leaves
    `out` as it was and no partial file. A non-empty `out` is refused unless `replace` (then it is replaced
    whole: no stale file of an earlier export stays)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not replace:
        raise ConfigurationError(f"--out {out} is not an empty folder: choose a new one, or add --replace to "
                                 "replace it with this export")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f".{out.name}.partial-{uuid.uuid4().hex[:8]}")
    work.mkdir()
    try:
        written = _export(db, work, benchmarks=benchmarks, hf=hf, progress=progress)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
            out.rename(old)
            work.rename(out)
            shutil.rmtree(old)
        else:
            work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return [{k: str(out / Path(v).relative_to(work)) if k in ("jsonl", "hf") else v for k, v in w.items()}
            for w in written]


def _export(db: Store, out: Path, *, benchmarks: Sequence[str] | None, hf: bool, progress: Any) -> list[dict[str, Any]]:
    teacher = teacher_name(db)
    have = db.trajectory_benchmarks()
    written = []
    for b in benchmarks or have:
        base = out / b
        trajs = db.load_trajectories(benchmark=b)
        splits = ", ".join(sorted({t.split for t in trajs})) or "none"
        common = {"benchmark": b, "teacher": teacher, "source": db.path}
        written.append({"benchmark": b, **_write(base, "trajectories", [_traj_row(t) for t in trajs], {
            **common, "iteration": "all", "split": splits, "empty": f"the store holds no trajectory of {b}",
            "what": "Every trajectory in the store (expert, teacher, synthetic, policy rollouts, evaluation "
                    "episodes), steps nested: observation, thought (thought e_t), plan p_t, action a_t."}, hf=hf,
            shape=SHAPES["trajectory"])})
        seeds = [t for t in trajs if t.source in ("teacher", "synthetic")]
        written.append({"benchmark": b, **_write(base, "quaternions", _quaternion_rows(seeds), {
            **common, "iteration": "stage 1-2 (before k=0)", "split": "train",
            "empty": "the store holds no teacher or synthetic (seed) trajectory of this benchmark (bootstrap not run?)",
            "what": "The teacher's planning quaternions (o_t, e_t, p_t, a_t), one row per step."}, hf=hf,
            shape=SHAPES["quaternion"])})
        gates = {g["iteration"]: g for g in db.gated_growth(b)}
        for k in sorted(set(db.gated_iterations(b)) | set(gates)):
            ids = set(db.traj_ids_gated_at(b, k))
            gated = [t for t in trajs if t.traj_id in ids]
            candidates = int((gates.get(k) or {}).get("candidates") or 0)
            written.append({"benchmark": b, **_write(base, f"gated_k{k}", [_traj_row(t) for t in gated], {
                **common, "iteration": str(k), "split": "train", "details": {"gate candidates": candidates},
                "empty": f"reward gate {k} admitted none of its {candidates} rollouts (none succeeded, or every success "
                         "repeated an earlier one)",
                "what": f"The successful, new trajectories reward gate {k} let through (trained on from k={k + 1})."},
                hf=hf, shape=SHAPES["trajectory"])})
        earlier: list[dict[str, Any]] = []
        for ck in db.checkpoint_rows(b):
            pairs = db.training_examples(ck["checkpoint_id"])
            rows = [{"prompt": p["prompt"], "completion": p["completion"], "traj_id": p["traj_id"],
                     "task_id": p["task_id"], "t": p["t"]} for p in pairs]
            k = ck["iteration"]
            written.append({"benchmark": b, "checkpoint_id": ck["checkpoint_id"], **_write(base, f"sft_k{k}", rows, {
                **common, "iteration": str(k), "split": "train", "details": _training_details(ck),
                "empty": f"the store keeps no training pair of checkpoint `{ck['checkpoint_id']}` (an older store)",
                "what": _sft_what(ck, len(rows)) + _identical_to(db, b, ck, earlier)}, hf=hf, shape=SHAPES["sft"])})
            earlier.append(ck)
            if progress:
                progress(f"{b}: sft_k{k} {len(rows)} pairs")
    return written
