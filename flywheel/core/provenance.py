"""Where an experiment arm's numbers came from, so that arms run in different sittings, runs folders and
machines merge into one report: the code commit, the machine, the configuration's fingerprint and the
hash of the k=0 weights. Each arm's results are one JSON file, `experiments/results/PRESET/arms/ARM.json`,
written when the arm's report is rebuilt and committed with the repository. Plain code (no Dagster).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from flywheel.core.settings import REPO_ROOT

ARMS_DIR = "arms"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def code_commit(repo: Path = REPO_ROOT) -> str:
    """HEAD's commit, with `+dirty` when tracked files differ from it; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    """What ran it: host, CPU model and cores, accelerator, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    ident: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "stepping") and key not in ident:
                ident[key] = value.strip()
            if line.startswith("processor") and ident:  # the first CPU's block is enough
                break
    except OSError:
        pass
    cpu = ident.get("model name", cpu)
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    # family/model/stepping tell CPU generations apart where the model name does not (a VM's "AMD EPYC"):
    # float results, and so retrained weights, can differ between them.
    cpu_id = "/".join(ident[k] for k in ("cpu family", "model", "stepping") if k in ident) or None
    return {"host": platform.node(), "cpu": cpu, "cpu_id": cpu_id, "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch}


def fingerprint(value: Any) -> str:
    """sha256 of a JSON value (keys sorted): the identity of an arm's configuration."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over a checkpoint's weight files (names and bytes, in name order): equal weights, equal hash."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {model_dir}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def arm_file(results: Path, arm: str) -> Path:
    return results / ARMS_DIR / f"{arm}.json"


def read_arm(results: Path | None, arm: str) -> dict[str, Any] | None:
    """The committed results of `arm` (None when there are none)."""
    if results is None or not (path := arm_file(results, arm)).is_file():
        return None
    return json.loads(path.read_text())


def write_arm(results: Path, arm: str, data: dict[str, Any]) -> Path:
    """Write one arm's results atomically (a reader never sees half a file)."""
    path = arm_file(results, arm)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)
    return path


def lineage_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row's lineage as a dict (the store keeps it as JSON text)."""
    raw = checkpoint["lineage"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})
