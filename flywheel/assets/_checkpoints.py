"""Finding the checkpoint an iteration's rollouts and evaluation use."""


from typing import Any

import dagster as dg

from flywheel.store import Store


def checkpoint_for(db: Store, benchmark: str, iteration: int) -> dict[str, Any]:
    ckpt = db.latest_checkpoint(benchmark, iteration)
    if ckpt is None:
        raise dg.Failure(f"no sft_checkpoint recorded for {benchmark}|{iteration}: materialize it first")
    return ckpt
