"""Finding the checkpoint an iteration's rollouts and evaluation use, and one SFT can reuse."""


import json
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.core.store import Store
from flywheel.orchestration.failures import NotRetryable
from flywheel.policy.sft import saved_state


def checkpoint_for(db: Store, benchmark: str, iteration: int) -> dict[str, Any]:
    ckpt = db.latest_checkpoint(benchmark, iteration)
    if ckpt is None:
        raise NotRetryable(f"no sft_checkpoint recorded for {benchmark}|{iteration}: materialize sft_checkpoint "
                           f"{benchmark}|{iteration} first (iteration_job runs it before rollouts and evaluation)")
    return ckpt


def promoted_checkpoint(db: Store, benchmark: str, iteration: int) -> dict[str, Any]:
    """The checkpoint the loop goes on from after iteration k: checkpoint k, unless the promotion gate rejected it
    (its decision on k's latest checkpoint, in the store's `promotions`); then the one promoted after k-1."""
    ckpt = checkpoint_for(db, benchmark, iteration)
    decision = next((r for r in db.promotions(benchmark) if r["iteration"] == iteration), None)
    if iteration == 0 or decision is None or decision["checkpoint_id"] != ckpt["checkpoint_id"] or decision["promoted"]:
        return ckpt
    return promoted_checkpoint(db, benchmark, iteration - 1)


def continued_checkpoint(db: Store, benchmark: str, iteration: int, *, steers: bool = True) -> dict[str, Any]:
    """The checkpoint the loop goes on from after iteration k (rollouts k, SFT k+1): the promoted one
    (`promoted_checkpoint`) when the gate steers the loop (loop.promotion_steers), else checkpoint k whatever the
    gate decided: then the gate only selects (the report's @promoted), as for the equal-compute control."""
    return promoted_checkpoint(db, benchmark, iteration) if steers else checkpoint_for(db, benchmark, iteration)


def new_checkpoint_id(benchmark: str, iteration: int) -> str:
    """Unique per training run (time plus random suffix): it names the checkpoint's directory."""
    return f"{benchmark}-k{iteration}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def reusable_checkpoint(db: Store, benchmark: str, iteration: int, fingerprint: str) -> dict[str, Any] | None:
    """The recorded checkpoint of (benchmark, k) trained on exactly this job (same fingerprint of base
    model, examples and config), if its directory is still complete; else None (train anew)."""
    ckpt = db.latest_checkpoint(benchmark, iteration)
    if ckpt is None:
        return None
    try:
        lineage = json.loads(ckpt["lineage"] or "{}")
    except ValueError:
        return None
    if lineage.get("fingerprint") != fingerprint or not (Path(ckpt["path"]) / "config.json").is_file():
        return None
    if not db.has_training_examples(ckpt["checkpoint_id"]):  # recorded by an older flywheel without its pairs
        return None
    return ckpt


def begin_checkpoint(db: Store, out: Path, benchmark: str, iteration: int, *,
                     log: Callable[[str], None] = print, resume: str | None = None) -> Path:
    """Before training into `out`: remove what an SFT of (benchmark, k) killed earlier, in this store, left in
    the checkpoints folder (its `.partial` work directory; a directory published but never recorded), then
    mark `out` as started by this store; returns the marker (delete it once the checkpoint is recorded).

    A killed attempt at the same training (its `.partial` holds the fingerprint `resume`: the trainer's saved
    state, `TrainConfig.save_minutes`) is kept instead, and its marker returned: train into
    `marker.with_suffix("")` to resume it. Only directories this store's marker names are removed, never a
    recorded one: the folder may be shared by other stores (a profile's `policy.checkpoints_dir`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    owner = str(db.path.resolve())
    kept = None
    for marker in sorted(out.parent.glob(f"{benchmark}-k{iteration}-*.started")):
        if marker.read_text() != owner:
            continue
        left = marker.with_suffix("")
        if db.checkpoint_recorded(left.name, left):
            marker.unlink()
            continue
        partial = left.with_name(left.name + ".partial")
        if kept is None and resume is not None and not left.exists() and saved_state(partial, resume):
            log(f"keeping {partial}: an SFT of the same training was killed there; it resumes from its saved state")
            kept = marker
            continue
        for d in (partial, left):
            if d.exists():
                log(f"removing {d}: left by an SFT that was killed before its checkpoint was recorded")
                shutil.rmtree(d)
        marker.unlink()
    if kept is not None:
        return kept
    marker = out.with_name(out.name + ".started")
    marker.write_text(owner)
    return marker


def packing_mismatch(db: Store, benchmark: str, iteration: int, packing: str) -> str | None:
    """Why checkpoint `iteration` must not train with `packing` (None: it may): the run's checkpoint k-1 was
    trained the other way (lineage without the field: per step, as before it existed). One run never mixes
    the two; a preset whose arms trained per step pins `policy.packing: per_step`."""
    before = db.latest_checkpoint(benchmark, iteration - 1)
    if before is None:
        return None
    earlier = json.loads(before["lineage"] or "{}").get("packing", "per_step")
    if earlier == packing:
        return None
    return (f"sft_checkpoint {benchmark}|{iteration} would train with policy.packing={packing!r} but checkpoint "
            f"{before['checkpoint_id']} of iteration {iteration - 1} trained with {earlier!r}: one run does not mix "
            f"the two; set policy.packing: {earlier} to go on as this run started, or start a new run (another "
            "runs folder)")
