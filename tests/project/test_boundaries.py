"""Guards on the project's boundaries, read from the source: flywheel uses public Dagster APIs
only, and the SQL lives in the store (the package flywheel/core/store/ and the curriculum's table module)."""

import re
from pathlib import Path

FLYWHEEL = Path(__file__).resolve().parents[2] / "flywheel"
# The store package (one module per group of tables, its connection and schema) and the curriculum's tables.
STORE = "core/store/"
SQL_OWNERS = {"curriculum/tables.py"}
SQL = re.compile(r"\.(query|execute|sql)\(|\b(SELECT|INSERT INTO|DELETE FROM|CREATE TABLE)\b")


def _sources() -> dict[str, str]:
    return {p.relative_to(FLYWHEEL).as_posix(): p.read_text(encoding="utf-8") for p in FLYWHEEL.rglob("*.py")}


def test_sources_are_found():
    sources = _sources()
    assert {"core/store/__init__.py", "core/store/store_trajectories.py", "sensors.py", "assets/refinement.py"} <= set(sources)
    assert SQL.search(sources["core/store/store_trajectories.py"]) and re.search(r"^import dagster as dg$", sources["sensors.py"], re.M)


def test_no_private_dagster_imports():
    private = re.compile(r"^\s*(from|import)\s+dagster\._|\bdagster\._[a-z]", re.M)
    offenders = sorted(name for name, text in _sources().items() if private.search(text))
    assert offenders == [], f"private Dagster modules (dagster._...) used in flywheel/{offenders}: use `import dagster as dg`"


def test_sql_lives_in_the_store():
    users = {name for name, text in _sources().items() if SQL.search(text)}
    assert {n for n in users if n.startswith(STORE)} >= {STORE + "store_trajectories.py", STORE + "store_schema.py"}
    offenders = sorted(n for n in users - SQL_OWNERS if not n.startswith(STORE))
    assert offenders == [], f"SQL outside the store in flywheel/{offenders}: add a named Store method instead"
