"""Terminal progress bars (tqdm) for long work: SFT steps, rollouts, evaluation, unpacking.

A bar shows count, rate and ETA on a terminal and is silent otherwise (`disable=None`: tqdm
checks that stderr is a TTY), so logs, CI and Dagster's captured compute logs stay clean;
the Dagster assets keep logging their own progress lines besides. No Dagster import here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def progress_bar(total: int | None, desc: str, *, unit: str = "it", **kwargs: Any) -> Any:
    """A tqdm bar on stderr, disabled when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=None, dynamic_ncols=True, mininterval=0.5,
                leave=True, **kwargs)


def counting_bar(desc: str, *, unit: str = "episode") -> Callable[[int, int], None]:
    """A (done, total) callback driving one bar; it closes itself when done == total."""
    state: dict[str, Any] = {"bar": None}

    def update(done: int, total: int) -> None:
        bar = state["bar"]
        if bar is None:
            bar = state["bar"] = progress_bar(total, desc, unit=unit)
        if bar.total != total:
            bar.total = total
        bar.update(max(done - bar.n, 0))
        if done >= total:
            bar.close()
            state["bar"] = None

    return update
