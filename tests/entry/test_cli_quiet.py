"""What the command line prints and how fast it answers: --help imports nothing heavy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("dagster", "torch", "transformers", "duckdb", "polars", "ray")


def test_help_imports_no_heavy_module():
    """`--help` answers in well under a second: it imports neither Dagster nor torch (0.6 s and more). `demo
    --help` alone reads its setting flags' help from the resource fields that declare them (it imports the
    resources: 9 s measured on the 2-core machine, a known cost): tests/project/test_options.py."""
    code = ("import sys\nfrom flywheel import cli\n"
            "for argv in (['--help'], ['report', '--help'], ['experiment', '--help']):\n"
            "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
            "cli.build_parser().parse_args(['demo', '--samples', '2', '--no-stop-on-loop'])\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"


def test_a_command_prints_no_dagster_beta_warnings_or_alembic_chatter(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "flywheel.cli", "free-slots"], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "freed the slots of 0 run(s)" in out.stdout
    for noise in ("BetaWarning", "Context impl", "setup plugin", "non-transactional DDL"):
        assert noise not in out.stderr


def test_commands_load_and_save_models_without_library_progress_bars(tiny, tmp_path):
    """The libraries' bars ("Loading weights", "Writing model shards") are off in every command, unless the user
    set the variable themselves; a checkpoint's load and save then print no bar."""
    code = ("import os, sys\nfrom flywheel import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "from flywheel.policy.models import load_model\n"
            f"load_model({tiny!r}).save_pretrained({str(tmp_path / 'copy')!r})\n"
            "print(os.environ['HF_HUB_DISABLE_PROGRESS_BARS'], os.environ['HF_DATASETS_DISABLE_PROGRESS_BARS'])")
    env = {k: v for k, v in os.environ.items() if "PROGRESS_BARS" not in k}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "1 1"
    assert "Loading weights" not in out.stderr and "Writing model shards" not in out.stderr
    mine = {**env, "HF_HUB_DISABLE_PROGRESS_BARS": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=mine, timeout=120)
    assert out.stdout.splitlines()[-1] == "0 1"  # the user's own setting wins
