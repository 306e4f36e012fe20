"""`flywheel report --all-benchmarks` (every benchmark side by side, one row per k) is not `flywheel paper` (the
paper's tables from experiments' stores); its old name `--paper` still works for one release, with a warning
naming the new one."""

from flywheel.cli import main
from flywheel.core.store import Store


def test_report_all_benchmarks_and_its_old_name(tmp_path, capsys):
    db = Store(tmp_path / "flywheel.duckdb")
    for split, v in (("seen", 0.5), ("unseen", 0.25)):
        db.write_evaluation({"benchmark": "alfworld", "iteration": 0, "split": split, "checkpoint_id": "c",
                             "episodes": 4, "success_rate": v})
    assert main(["report", "--runs-dir", str(tmp_path), "--all-benchmarks"]) == 0
    new = capsys.readouterr()
    assert "| k | ALFWorld seen | ALFWorld unseen |" in new.out and "| 0 | 50.0 | 25.0 |" in new.out
    assert "deprecated" not in new.err
    assert main(["report", "--runs-dir", str(tmp_path), "--paper"]) == 0
    old = capsys.readouterr()
    assert old.out == new.out
    assert "report --paper is deprecated (accepted for one release): use report --all-benchmarks" in old.err
