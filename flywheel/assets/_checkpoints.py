"""Finding the checkpoint an iteration's rollouts and evaluation use, and one SFT can reuse."""


import json
import time
import uuid
from pathlib import Path
from typing import Any

from flywheel.failures import NotRetryable
from flywheel.store import Store


def checkpoint_for(db: Store, benchmark: str, iteration: int) -> dict[str, Any]:
    ckpt = db.latest_checkpoint(benchmark, iteration)
    if ckpt is None:
        raise NotRetryable(f"no sft_checkpoint recorded for {benchmark}|{iteration}: materialize sft_checkpoint "
                           f"{benchmark}|{iteration} first (iteration_job runs it before rollouts and evaluation)")
    return ckpt


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
    return ckpt
