"""Small helpers the asset modules share."""


import time
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg

from flywheel.core.progress import counting_bar


def progress_logger(context: dg.AssetExecutionContext, label: str, every_s: float = 10.0) -> Callable[[int, int], None]:
    """A (done, total) callback that logs at most every `every_s` seconds, plus the last item, and
    drives a terminal progress bar (rate, ETA) when stderr is a TTY (the CLI)."""
    state = {"last": 0.0, "start": time.monotonic()}
    bar = counting_bar(label)  # a terminal bar with rate and ETA; silent when stderr is not a TTY

    def report(done: int, total: int) -> None:
        bar(done, total)
        now = time.monotonic()
        if done == total or now - state["last"] >= every_s:
            state["last"] = now
            rate = done / max(now - state["start"], 1e-9) * 60
            context.log.info(f"{label}: {done}/{total} ({rate:.1f}/min)")

    return report


def rounded(value: Any, digits: int = 4) -> Any:
    """Floats rounded for the UI (`train_loss 6.1203`, not 6.12031888961792), inside dicts and lists too;
    MetadataValue objects and other values pass through unchanged."""
    if isinstance(value, float):
        return round(float(value), digits)
    if type(value) is dict:
        return {k: rounded(v, digits) for k, v in value.items()}
    if type(value) in (list, tuple):  # plain ones only: MetadataValues are (named) tuples too
        return [rounded(v, digits) for v in value]
    return value


def metadata_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], digits: int = 4) -> dg.MetadataValue:
    """Rows as a `MetadataValue.table` (the UI's sortable table, never cut off like wide markdown)."""
    types = {bool: "bool", int: "int", float: "float"}

    def kind(col: str) -> str:
        seen = {types.get(type(r.get(col)), "string") for r in rows if r.get(col) is not None}
        return seen.pop() if len(seen) == 1 else "string"

    schema = dg.TableSchema(columns=[dg.TableColumn(name=c, type=kind(c)) for c in columns])
    records = [dg.TableRecord({c: _cell(r.get(c), digits, kind(c)) for c in columns}) for r in rows]
    return dg.MetadataValue.table(records=records, schema=schema)


def _cell(value: Any, digits: int, kind: str) -> Any:
    if value is None:
        return None
    if kind == "string":
        return str(round(value, digits)) if isinstance(value, float) else str(value)
    return round(value, digits) if isinstance(value, float) else value
