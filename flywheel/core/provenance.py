"""Where an experiment arm's numbers came from, so that arms run in different sittings, runs folders and
machines merge into one report: the code commit, the machine, the configuration's fingerprint and the
hash of the k=0 weights. Each arm's results are one JSON file, `experiments/results/PRESET/arms/ARM.json`,
written when the arm's report is rebuilt and committed with the repository. Plain code (no Dagster).

A committed arm file is checked before it is believed (`read_arm`): it must parse, its counts, rates, Wilson
intervals and per-task outcomes must agree with each other (`arm_problems`), and it must carry the checksum
the runner wrote over its content (`CHECKSUM`): a file edited afterwards is refused until someone re-signs it
on purpose (`flywheel resign-arm PATH`, `resign_arm`).
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

from flywheel.core.quality import wilson_interval
from flywheel.core.settings import REPO_ROOT

ARMS_DIR = "arms"
CHECKSUM = "content_sha256"  # the field of an arm file holding the sha256 of the rest of it (`content_sha256`)
RESIGN = "flywheel resign-arm"  # the command that re-signs an arm file edited on purpose
TOLERANCE = 1e-9  # a rate or interval end may differ from its recomputed value by this much (float rounding)
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
    bf16 = False
    try:
        text = Path("/proc/cpuinfo").read_text()
        # Native bfloat16 (AMX or AVX512-BF16): where `dtype: auto` trains and generates in bfloat16 (issue 55's blocks).
        bf16 = "amx_bf16" in text or "avx512_bf16" in text
        for line in text.splitlines():
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
    return {"host": platform.node(), "cpu": cpu, "cpu_id": cpu_id, "cores": os.cpu_count(), "bf16_native": bf16,
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


class ArmFileError(ValueError):
    """A committed arm file that cannot be believed: unreadable, inconsistent, or edited after it was written."""


def read_arm(results: Path | None, arm: str) -> dict[str, Any] | None:
    """The committed results of `arm` (None when there are none), checked (`check_arm_file`)."""
    if results is None or not (path := arm_file(results, arm)).is_file():
        return None
    return check_arm_file(path)


def check_arm_file(path: Path, *, signed: bool = True) -> dict[str, Any]:
    """An arm file's content, or ArmFileError in one line naming the file: it does not parse, its numbers
    disagree with each other, or (`signed`) its checksum is missing or does not match its content."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArmFileError(f"arm file {path} cannot be read ({type(exc).__name__}: {exc}): restore it from git "
                           f"(git checkout -- {path}) or run the arm again") from None
    if not isinstance(data, dict):
        raise ArmFileError(f"arm file {path} is not a JSON object: restore it from git or run the arm again")
    if problems := arm_problems(data):
        raise ArmFileError(f"arm file {path} contradicts itself ({len(problems)} problem(s), first: {problems[0]}): "
                           f"restore it from git (git checkout -- {path}) or run the arm again")
    if signed and data.get(CHECKSUM) != content_sha256(data):
        state = "has no checksum" if CHECKSUM not in data else "was edited after the runner wrote it (checksum mismatch)"
        raise ArmFileError(f"arm file {path} {state}: restore it from git (git checkout -- {path}), or, if the edit "
                           f"is intended and its numbers are right, re-sign it with `{RESIGN} {path}`")
    return data


def content_sha256(data: dict[str, Any]) -> str:
    """sha256 of an arm file's content without its checksum field (keys sorted, as JSON reads it back)."""
    body = {k: v for k, v in data.items() if k != CHECKSUM}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_arm(results: Path, arm: str, data: dict[str, Any]) -> Path:
    """Write one arm's results atomically (a reader never sees half a file), signed with its checksum."""
    return write_signed(arm_file(results, arm), data)


def write_signed(path: Path, data: dict[str, Any]) -> Path:
    body = json.loads(json.dumps({k: v for k, v in data.items() if k != CHECKSUM}, default=str))  # as read back
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**body, CHECKSUM: content_sha256(body)}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def resign_arm(path: Path) -> Path:
    """Sign an arm file edited on purpose with the checksum of its content now: refused (ArmFileError) unless it
    parses and its numbers agree with each other; nothing else in it changes."""
    return write_signed(path, check_arm_file(path, signed=False))


# -- consistency of one arm file -------------------------------------------------------------
def arm_problems(data: dict[str, Any]) -> list[str]:
    """What in an arm file disagrees with the rest of it (empty: nothing): every rate (n, successes, rate,
    Wilson interval) with itself, every evaluated split's counts and reward with its per-task outcomes, every
    paired comparison's gained/lost/n with the outcomes it pairs."""
    missing = [k for k in ("arm", "results", "outcomes", "provenance", "config", "splits") if k not in data]
    if missing:
        return [f"missing field(s) {missing}"]
    problems = [f"{where}: {p}" for where, rate in _rates(data, "") if (p := _rate_problem(rate))]
    try:
        outcomes = {key: {t: (bool(v[0]), float(v[1])) for t, v in tasks.items()}
                    for key, tasks in data["outcomes"].items()}
        problems += _split_problems(data["results"].get("per_k", []), outcomes)
        problems += _paper_problems(data.get("paper") or {}, outcomes)
        problems += _comparison_problems(data["results"].get("comparisons", []), outcomes)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        problems.append(f"malformed ({type(exc).__name__}: {exc})")
    return problems


def _rates(value: Any, where: str):
    """(path, dict) of every rate in a JSON value: a dict with n, successes, rate and a Wilson interval."""
    if isinstance(value, dict):
        if {"n", "successes", "rate", "ci_low", "ci_high"} <= set(value):
            yield where or "/", value
        for key, item in value.items():
            yield from _rates(item, f"{where}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _rates(item, f"{where}/{i}")


def _rate_problem(r: dict[str, Any]) -> str | None:
    n, s, rate = r["n"], r["successes"], r["rate"]
    if not (isinstance(n, int) and isinstance(s, int) and 0 <= s <= n):
        return f"successes {s!r} of n {n!r}"
    if rate is not None and abs(rate - (s / n if n else 0.0)) > TOLERANCE:
        return f"rate {rate!r} is not successes/n = {s}/{n}"
    lo, hi = wilson_interval(s, n)
    if abs(r["ci_low"] - lo) > TOLERANCE or abs(r["ci_high"] - hi) > TOLERANCE:
        return f"interval [{r['ci_low']}, {r['ci_high']}] is not the Wilson interval of {s}/{n}"
    return None


def _counts(tasks: dict[str, tuple[bool, float]]) -> tuple[int, int]:
    return len(tasks), sum(ok for ok, _ in tasks.values())


def _split_problems(per_k: list[dict[str, Any]], outcomes: dict[str, dict[str, tuple[bool, float]]]) -> list[str]:
    problems = []
    for row in per_k:
        for split, r in row.get("splits", {}).items():
            tasks = outcomes.get(f"{row['k']}|{split}")
            where = f"k={row['k']} {split}"
            if tasks is None:
                problems.append(f"{where}: a rate without per-task outcomes")
            elif _counts(tasks) != (r["n"], r["successes"]):
                problems.append(f"{where}: {r['successes']}/{r['n']} but its outcomes count "
                                f"{_counts(tasks)[1]}/{_counts(tasks)[0]}")
            elif (reward := (r.get("reward") or {}).get("value")) is not None and tasks and \
                    abs(reward - sum(v for _, v in tasks.values()) / len(tasks)) > TOLERANCE:
                problems.append(f"{where}: average reward {reward} is not its outcomes' average")
    return problems


def _paper_problems(paper: dict[str, Any], outcomes: dict[str, dict[str, tuple[bool, float]]]) -> list[str]:
    problems = []
    for k, cell in paper.items():
        for split, r in cell.get("splits", {}).items():
            tasks, success = r.get("outcomes") or {}, r.get("success") or {}
            where = f"paper k={k} {split}"
            if success and (len(tasks), sum(map(bool, tasks.values()))) != (success["n"], success["successes"]):
                problems.append(f"{where}: {success['successes']}/{success['n']} but its outcomes count "
                                f"{sum(map(bool, tasks.values()))}/{len(tasks)}")
            own = outcomes.get(f"{k}|{split}")
            if own is not None and {t: ok for t, (ok, _) in own.items()} != {t: bool(v) for t, v in tasks.items()}:
                problems.append(f"{where}: its outcomes differ from the arm's outcomes of k={k} {split}")
    return problems


def _comparison_problems(rows: list[dict[str, Any]], outcomes: dict[str, dict[str, tuple[bool, float]]]) -> list[str]:
    """Each paired comparison between two of this arm's own evaluations: n, gained and lost as the outcomes say."""
    problems = []
    for row in rows:
        if row.get("old_arm"):
            continue  # its k=0 is another arm's evaluation
        pick = [s.split("|")[1] for s in outcomes if s.startswith(f"{row['new']}|")] if row["split"] == "all" \
            else [row["split"]]
        new = {f"{s}/{t}": v[0] for s in pick for t, v in outcomes.get(f"{row['new']}|{s}", {}).items()}
        old = {f"{s}/{t}": v[0] for s in pick for t, v in outcomes.get(f"{row['old']}|{s}", {}).items()}
        common = set(new) & set(old)
        got = (len(common), sum(new[t] and not old[t] for t in common), sum(old[t] and not new[t] for t in common))
        if got != (row["n"], row["gained"], row["lost"]):
            problems.append(f"k={row['new']} vs k={row['old']} {row['split']}: n/gained/lost "
                            f"{row['n']}/{row['gained']}/{row['lost']} but the outcomes give {got[0]}/{got[1]}/{got[2]}")
    return problems


def lineage_of(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row's lineage as a dict (the store keeps it as JSON text)."""
    raw = checkpoint["lineage"]
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})
