"""Small helpers the asset modules share."""


import time
from collections.abc import Callable

import dagster as dg


def progress_logger(context: dg.AssetExecutionContext, label: str, every_s: float = 10.0) -> Callable[[int, int], None]:
    """A (done, total) callback that logs at most every `every_s` seconds, plus the last item."""
    state = {"last": 0.0, "start": time.monotonic()}

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - state["last"] >= every_s:
            state["last"] = now
            rate = done / max(now - state["start"], 1e-9) * 60
            context.log.info(f"{label}: {done}/{total} ({rate:.1f}/min)")

    return report
