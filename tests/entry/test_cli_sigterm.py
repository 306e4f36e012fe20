"""`kill PID` stops a flywheel command started in the background (SIGINT ignored, as a shell starts `cmd &`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A process started as a shell starts a background job: one Dagster run (as the experiment runner's first job),
# then work outside any run (as the runner's stages between jobs).
SCRIPT = """
import signal, sys, time
from pathlib import Path
import dagster as dg

signal.signal(signal.SIGINT, signal.SIG_IGN)
if sys.argv[1] == "cli":
    from flywheel.cli import stoppable_by_sigterm
    stoppable_by_sigterm()

@dg.asset
def quick() -> int:
    return 1

assert dg.materialize([quick]).success
Path(sys.argv[2]).write_text("started")
time.sleep(120)
"""


def _start(mode: str, marker: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(marker)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run did not start (exit {proc.returncode})")
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize("mode", ["dagster", "cli"])
def test_sigterm_stops_a_run_started_with_sigint_ignored(tmp_path, mode):
    proc = _start(mode, tmp_path / "started")
    try:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30 if mode == "cli" else 5)
        except subprocess.TimeoutExpired:
            stopped = False
        else:
            stopped = True
        if mode == "dagster":
            # The defect the CLI works around: after a run, Dagster leaves the ignored SIGINT copied onto SIGTERM.
            assert not stopped, "Dagster no longer copies an ignored SIGINT onto SIGTERM: stoppable_by_sigterm can go"
        else:
            assert stopped and proc.returncode != 0
    finally:
        proc.kill()
        proc.wait()
