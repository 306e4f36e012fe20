"""Store faults: text DuckDB cannot encode, a busy file, a file of another schema.

(a) A lone surrogate in generated text (a model emitting half a UTF-16 pair) used to abort the
    whole rollout at the DuckDB write; it is stored as U+FFFD, and ScienceWorld treats such an
    action as an invalid action, not a JVM failure.
(b) A connection left open by another process (a notebook) fails the store after its lock
    timeout naming that process (pid, command line), not with DuckDB's bare lock error.
(c) A DuckDB file of another schema is refused before a single table or row is added.
"""

import logging
import subprocess
import sys
import time

import duckdb
import pytest

from envs import get_benchmark
from flywheel.core.store import ForeignStoreError, Store, StoreBusyError
from flywheel.core.trajectory import Step, Trajectory

BAD = "focus on \ud83d cup"  # a lone high surrogate


def test_lone_surrogate_in_generated_text_is_stored_not_fatal(tmp_path):
    db = Store(tmp_path / "fw.duckdb")
    traj = Trajectory(benchmark="scienceworld", split="train", task_id="t", source="policy", goal=f"goal {BAD}",
                      steps=[Step(observation="o", thought=f"think {BAD}", plan="p", action=BAD,
                                  next_observation="No known action matches that input.")])
    assert db.write_trajectories([traj]) == 1
    [(action, thought)] = db.query("SELECT action, thought FROM steps").rows()
    assert action == "focus on \ufffd cup" and thought == "think focus on \ufffd cup"
    db.cache_put("k", "m", BAD)
    assert db.cache_get("k") == "focus on \ufffd cup"


def test_scienceworld_takes_a_lone_surrogate_as_an_invalid_action():
    spec = get_benchmark("scienceworld")
    [task] = spec.load_tasks("train", limit=1, task_types=("find-non-living-thing",))
    env = spec.make_env()
    try:
        env.reset(task)
        result = env.step(BAD)
        assert result.info["invalid"] and not result.done
        assert env.step("look around").observation  # the same JVM goes on
    finally:
        env.close()


HOLDER = r'''
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
print("ready", flush=True)
time.sleep(120)
'''


def test_busy_store_names_the_process_holding_it(tmp_path):
    path = tmp_path / "fw.duckdb"
    Store(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        started = time.monotonic()
        with pytest.raises(StoreBusyError) as err:
            Store(path, lock_timeout_s=1.0)
        assert time.monotonic() - started < 30
        msg = str(err.value)
        assert f"process {holder.pid}" in msg and "read_only=True" in msg and "Close that connection" in msg
    finally:
        holder.kill()
        holder.wait()
    Store(path, lock_timeout_s=5.0)  # free again once the holder is gone


def test_a_writer_waiting_on_another_process_says_so_once_naming_it(tmp_path, caplog):
    """Before: a writer blocked by another process's lock waited in silence until the lock timeout."""
    path = tmp_path / "fw.duckdb"
    Store(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with caplog.at_level(logging.WARNING, logger="flywheel.core.store"), pytest.raises(StoreBusyError):
            Store(path, lock_timeout_s=4.0)
    finally:
        holder.kill()
        holder.wait()
    said = [r.getMessage() for r in caplog.records if "is locked by" in r.getMessage()]
    assert len(said) == 1, said
    assert f"process {holder.pid}" in said[0] and "then this write fails with StoreBusyError" in said[0]


def test_foreign_schema_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE customers (id INTEGER, name VARCHAR)")
    con.execute("INSERT INTO customers VALUES (1, 'a')")
    con.close()
    before = path.read_bytes()
    with pytest.raises(ForeignStoreError, match="another schema.*customers.*nothing was written"):
        Store(path)
    assert path.read_bytes() == before
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("customers",)]
    con.close()
    # A flywheel table with other columns (another version) is refused too, naming it.
    other = tmp_path / "old.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE trajectories (traj_id VARCHAR, reward DOUBLE)")
    con.close()
    with pytest.raises(ForeignStoreError, match="table 'trajectories' has columns"):
        Store(other)
    # Our own file opens as before.
    Store(tmp_path / "fw.duckdb").upsert_tasks([{"benchmark": "b", "split": "s", "task_id": "t"}])
    assert Store(tmp_path / "fw.duckdb").query("SELECT count(*) FROM tasks").item() == 1


# -- (d) a store that cannot be read whole, or of a newer schema: refused by every command, nothing written ---

def _filled_store(path):
    """A store with enough rows that DuckDB writes them to data blocks (not only its WAL)."""
    Store(path)
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO steps SELECT 't' || i, i, repeat('observation ', 40) || i, 'th', 'pl', 'look', 'o', "
                "0, false, false, 1, 1 FROM range(40000) r(i)")
    con.close()
    return path


def _damaged(tmp_path):
    good = _filled_store(tmp_path / "good.duckdb")
    raw = good.read_bytes()
    corrupt = bytearray(raw)
    corrupt[len(raw) // 2 : len(raw) // 2 + 4096] = b"\xff" * 4096  # a block's checksum no longer matches
    return {"truncated": raw[: len(raw) // 2], "zero-byte": b"", "corrupt": bytes(corrupt)}


def _one_line_exit_2(capsys, argv, what):
    from flywheel.cli import main

    assert main(argv) == 2, what
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was written" in err[0], (what, err)
    return err[0]


@pytest.mark.parametrize("command", ["report", "export", "demo", "experiment", "paper"])
def test_a_damaged_store_is_refused_by_every_command_before_anything_is_written(tmp_path, capsys, command):
    preset = tmp_path / "mini.yaml"
    preset.write_text("name: mini\nbenchmark: webshop\niterations: 0\nmodel: tiny\n")  # its one arm: bpo
    for kind, content in _damaged(tmp_path).items():
        runs = tmp_path / kind
        db = runs / ("bpo" if command in ("experiment", "paper") else "") / "flywheel.duckdb"
        db.parent.mkdir(parents=True)
        db.write_bytes(content)
        argv = {"report": ["report", "--runs-dir", str(runs)],
                "export": ["export", "--runs-dir", str(runs), "--out", str(tmp_path / f"out-{kind}")],
                "demo": ["demo", "--benchmark", "webshop", "--runs-dir", str(runs)],
                "experiment": ["experiment", str(preset), "--runs-dir", str(runs),
                               "--results-dir", str(tmp_path / f"res-{kind}")],
                "paper": ["paper", str(preset), "--runs-dir", str(runs),
                          "--results-dir", str(tmp_path / f"res-{kind}")]}[command]
        line = _one_line_exit_2(capsys, argv, kind)
        assert str(db) in line and ("move this one aside" in line), line
        assert db.read_bytes() == content, kind  # not a byte written
        assert sorted(p.name for p in db.parent.iterdir()) == ["flywheel.duckdb"], kind  # no WAL, no checkpoints
        assert not (tmp_path / f"out-{kind}").exists() and not (tmp_path / f"res-{kind}").exists()


def test_a_store_of_a_newer_schema_is_refused_in_one_line(tmp_path, capsys):
    for change in ("ALTER TABLE tasks ADD COLUMN difficulty INTEGER", "CREATE TABLE task_notes (task_id VARCHAR)"):
        runs = tmp_path / change.split()[2]
        db = runs / "flywheel.duckdb"
        Store(db)
        con = duckdb.connect(str(db))
        con.execute(change)
        con.close()
        before = db.read_bytes()
        with pytest.raises(ForeignStoreError, match="newer flywheel.*nothing was written"):
            Store(db)
        line = _one_line_exit_2(capsys, ["report", "--runs-dir", str(runs)], change)
        assert str(db) in line and "upgrade flywheel" in line
        _one_line_exit_2(capsys, ["demo", "--benchmark", "webshop", "--runs-dir", str(runs)], change)
        assert db.read_bytes() == before


# -- (e) readers never write: report, export and paper open the store read-only ------------------------------------

WRITER = r'''
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("ready", flush=True)
time.sleep(120)
'''


def _held(path, script):
    holder = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "ready"
    return holder


def _evaluated_store(tmp_path):
    runs = tmp_path / "runs"
    db = Store(runs / "flywheel.duckdb")
    db.write_evaluation({"benchmark": "webshop", "iteration": 0, "split": "seen", "checkpoint_id": "w0",
                         "episodes": 4, "success_rate": 0.5})
    return runs, runs / "flywheel.duckdb"


def test_readers_share_the_store_with_another_reader_and_change_no_byte(tmp_path, capsys):
    from flywheel.cli import main

    runs, path = _evaluated_store(tmp_path)
    before = path.read_bytes()
    holder = _held(path, HOLDER)  # the docs' read-only one-liner, left open
    try:
        started = time.monotonic()
        assert main(["report", "--runs-dir", str(runs), "--benchmark", "webshop"]) == 0
        assert "50.0 [15.0, 85.0] (2/4)" in capsys.readouterr().out
        assert main(["export", "--runs-dir", str(runs), "--out", str(tmp_path / "out"), "--jsonl-only"]) == 0
        assert time.monotonic() - started < 30  # no wait for the other reader
    finally:
        holder.kill()
        holder.wait()
    assert path.read_bytes() == before
    assert sorted(p.name for p in runs.iterdir()) == ["flywheel.duckdb"]  # no WAL either


def test_a_reader_names_the_writer_that_holds_the_store_at_once(tmp_path, capsys):
    from flywheel.cli import main

    runs, path = _evaluated_store(tmp_path)
    holder = _held(path, WRITER)
    try:
        for argv in (["report", "--runs-dir", str(runs)],
                     ["export", "--runs-dir", str(runs), "--out", str(tmp_path / "out")]):
            started = time.monotonic()
            assert main(argv) == 2
            assert time.monotonic() - started < 15, argv  # seconds, not the writers' 120 s wait
            [line] = capsys.readouterr().err.strip().splitlines()
            assert f"process {holder.pid}" in line and "open for writing" in line and str(path) in line, line
        with pytest.raises(StoreBusyError, match="open for writing"):
            Store.reader(path)
    finally:
        holder.kill()
        holder.wait()
    assert Store.reader(path).evaluated_benchmarks() == ["webshop"]  # free again
