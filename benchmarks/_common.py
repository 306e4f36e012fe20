"""Tiny shared helpers for benchmark scripts: aligned tables on stdout, JSON under results/."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on (they mean little without it)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": psutil.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def median_ms(seconds: Sequence[float]) -> float:
    return round(statistics.median(seconds) * 1000, 2) if seconds else float("nan")


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}\n{line}")
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print(line)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """results/<name>.json with the machine description added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    return path
