"""The folder tree is the architecture (docs/layout.md): read from the source, each folder keeps its rule.

- at most 8 modules at the top of flywheel/ (entry points); the rest live in folders named for their layer;
- no import cycle among flywheel/ modules, counting imports made inside functions and the package
  `__init__` every import runs;
- the plain core imports only the core; core, rollout, policy, curriculum and teacher never import Dagster,
  directly or through another flywheel module;
- reports read stores and never write one;
- `flywheel` imports sit at the top of each file, except in the CLI (fast `--help`);
- no two modules share a file name, so a name in a traceback or a review says which file it is.
"""

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

FLYWHEEL = Path(__file__).resolve().parents[1] / "flywheel"
TOP_LEVEL = {"__init__", "cli", "definitions", "profile", "sensors"}
NO_DAGSTER = ("core", "rollout", "policy", "curriculum", "teacher")
STORE_WRITES = ("upsert_", "write_", "delete_", "record_", "clear_", "claim_", "cache_put", "transaction")


def module_name(path: Path) -> str:
    parts = path.relative_to(FLYWHEEL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in FLYWHEEL.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every flywheel module `path` imports anywhere in the file, with the packages each import runs first
    (but not `path`'s own packages, which Python has already started importing when `path` runs)."""
    me = module_name(path).split(".")
    own = {".".join(me[:i]) for i in range(1, len(me) + 1)}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            out |= {name} & known
            out |= {m for m in (".".join(parts[:i]) for i in range(2, len(parts))) if m in known and m not in own}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(p, set(mods)) - {m} for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_top_level_holds_the_entry_points_only():
    top = {p.stem for p in FLYWHEEL.glob("*.py")}
    assert top == TOP_LEVEL and len(top) <= 8, f"modules at the top of flywheel/: {sorted(top - TOP_LEVEL)} belong in a folder"


def test_no_import_cycle():
    g = graph()
    assert {"flywheel.core.store", "flywheel.definitions", "flywheel.reports.paper"} <= set(g)
    assert "flywheel.core.store" in g["flywheel.rollout.engine"]
    assert cycles(g) == []


@pytest.mark.parametrize("folder", NO_DAGSTER)
def test_plain_layers_never_import_dagster(folder):
    g, mods = graph(), modules()
    mine = [m for m in g if m.startswith(f"flywheel.{folder}")]
    assert mine
    reach, todo = set(mine), list(mine)
    while todo:
        for w in g[todo.pop()] - reach:
            reach.add(w)
            todo.append(w)
    users = sorted(m for m in reach if "dagster" in {n.split(".")[0] for n in _external(mods[m])})
    assert users == [], f"flywheel/{folder} reaches Dagster through {users}: keep Dagster in assets/resources"


def _external(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_core_imports_only_the_core():
    offenders = {m: sorted(w for w in deps if not w.startswith("flywheel.core"))
                 for m, deps in graph().items() if m.startswith("flywheel.core")}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_reports_never_write_a_store():
    store = ast.parse((FLYWHEEL / "core" / "store.py").read_text(encoding="utf-8"))
    [cls] = [n for n in store.body if isinstance(n, ast.ClassDef) and n.name == "Store"]
    writers = {f.name for f in cls.body if isinstance(f, ast.FunctionDef) and f.name.startswith(STORE_WRITES)}
    assert {"write_trajectories", "record_checkpoint", "transaction"} <= writers
    calls = {(p.name, n.func.attr) for p in (FLYWHEEL / "reports").glob("*.py")
             for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert any(name == "checkpoint_rows" for _, name in calls)  # reports do read stores
    assert sorted(c for c in calls if c[1] in writers) == []


def test_flywheel_imports_sit_at_the_top_except_in_the_cli():
    """Only cli.py imports flywheel modules inside functions (so that `flywheel --help` stays fast)."""
    local = sorted(f"{module_name(p)}:{n.lineno}" for p in FLYWHEEL.rglob("*.py") if p.name != "cli.py"
                   for top in ast.parse(p.read_text(encoding="utf-8")).body if not isinstance(top, (ast.Import, ast.ImportFrom))
                   for n in ast.walk(top) if isinstance(n, (ast.Import, ast.ImportFrom))
                   and any(name.startswith("flywheel") for name in
                           ([n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names])))
    assert local == [], f"flywheel imports inside functions: {local}; move them to the top of the file"


def test_no_test_module_imports_another():
    """Shared fixtures live in tests/conftest.py, doubles in tests/fakes.py, helpers in tests/helpers.py."""
    tests = FLYWHEEL.parent / "tests"
    offenders = sorted(f"{p.name}: {n.module}" for p in tests.glob("test_*.py")
                       for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                       if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("tests.test_"))
    assert offenders == []


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in FLYWHEEL.rglob("*.py") if p.name != "__init__.py")
    assert [n for n, c in names.items() if c > 1] == []


def test_the_tiny_model_fixture_is_conftest_s_alone():
    """One tiny-model fixture (tests/conftest.py), not one per module with its own vocabulary."""
    pattern = re.compile(r"^def tiny\(", re.M)
    tests = FLYWHEEL.parent / "tests"
    defined = [p.name for p in sorted(tests.glob("test_*.py")) if pattern.search(p.read_text(encoding="utf-8"))]
    assert not defined and pattern.search((tests / "conftest.py").read_text(encoding="utf-8"))
