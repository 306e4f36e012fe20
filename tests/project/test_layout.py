"""The folder tree is the architecture (docs/layout.md): read from the source, each folder keeps its rule.

- at most 8 modules at the top of flywheel/ (entry points); the rest live in folders named for their layer;
- imports go down docs/layout.md's table of layers, never up (read from the doc, so the two cannot drift), counting
  imports made inside functions; every folder and top-level module is in exactly one row; envs/ never imports
  flywheel;
- no import cycle among flywheel/ modules, counting imports made inside functions and the package
  `__init__` every import runs;
- the plain core imports only the core; core, rollout, policy, curriculum and teacher never import Dagster,
  directly or through another flywheel module;
- reports read stores and never write one;
- `flywheel` imports sit at the top of each file, except in the CLI (fast `--help`);
- no two modules share a file name, so a name in a traceback or a review says which file it is;
- the tests mirror the packages: every test module sits in a folder of tests/ named after the package it
  tests (tests/core for flywheel/core, tests/envs for envs/), or in one of the folders for what spans them
  (entry points, whole-chain runs, project-wide rules); no test module imports another, and the tiny-model
  fixture is tests/conftest.py's alone.
"""

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

FLYWHEEL = Path(__file__).resolve().parents[2] / "flywheel"
TESTS = FLYWHEEL.parent / "tests"
LAYOUT_DOC = FLYWHEEL.parent / "docs" / "layout.md"
TOP_LEVEL = {"__init__", "cli", "definitions", "profile", "sensors"}
NO_DAGSTER = ("core", "rollout", "policy", "curriculum", "teacher")
# Test folders that name no package: the test benchmark, the entry points (cli, definitions, profile, sensors),
# whole-chain runs and project-wide rules.
TEST_SUPPORT_FOLDERS = {"tinybench", "tinymethod", "entry", "e2e", "project"}
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


def doc_layers(text: str) -> list[list[str]]:
    """The rows of the layers table (the one whose header starts `| layer |`), top to bottom: each row's
    first cell, as the names it holds (`drivers/` -> "drivers", `cli.py` -> "cli")."""
    rows: list[list[str]] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| layer |"):
            in_table = True
        elif in_table and line.startswith("|---"):
            continue
        elif in_table and line.startswith("|"):
            cell = line.split("|")[1]
            rows.append([re.sub(r"(/|\.py)$", "", name) for name in re.findall(r"`([^`]+)`", cell)])
        elif in_table:
            break
    return rows


def unit_of(module: str) -> str:
    """The table's name for a module's layer: its folder under flywheel/, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "cli"  # the package's own __init__ sits with the entry point


def upward_imports(g: dict[str, set[str]], rows: list[list[str]]) -> list[str]:
    """Every import from a module to a module in a row above its own (row 0 is the top of the table)."""
    row = {name: i for i, names in enumerate(rows) for name in names}
    return sorted(f"{m} -> {d} ({unit_of(m)} imports {unit_of(d)}, a row above it in docs/layout.md)"
                  for m, deps in g.items() for d in deps if row[unit_of(d)] < row[unit_of(m)])


def test_the_layer_reader_and_checker():
    text = "intro\n\n| layer | what | rule |\n|---|---|---|\n| `cli.py` | x | |\n| `a/`, `b.py` | y | `c/` is below |\n" \
           "| `c/` | z | |\n\nafter | `d/` |\n"
    rows = doc_layers(text)
    assert rows == [["cli"], ["a", "b"], ["c"]]
    down = {"flywheel.cli": {"flywheel.a.x"}, "flywheel.a.x": {"flywheel.b", "flywheel.c.y"}, "flywheel.b": {"flywheel.a.x"}}
    assert upward_imports(down, rows) == []
    assert upward_imports({**down, "flywheel.c.y": {"flywheel.b"}}, rows) == [
        "flywheel.c.y -> flywheel.b (c imports b, a row above it in docs/layout.md)"]


def test_the_layers_table_names_every_folder_once():
    rows = doc_layers(LAYOUT_DOC.read_text(encoding="utf-8"))
    named = [name for names in rows for name in names]
    assert len(rows) > 8 and named[0] == "cli" and named[-1] == "core"
    units = {unit_of(m) for m in modules()}
    assert sorted(n for n, c in Counter(named).items() if c > 1) == []
    assert sorted(units - set(named)) == [], "a folder or top-level module missing from docs/layout.md's table"
    assert sorted(set(named) - units) == [], "docs/layout.md's table names a folder or module that is gone"


def test_imports_only_point_down_the_layers():
    """docs/layout.md's table is the order: a module imports from its own row and the rows below, never above."""
    g = graph()
    assert "flywheel.policy.inference" in g["flywheel.rollout.engine"]  # the graph sees real imports
    assert "flywheel.drivers.demo" in g["flywheel.cli"]  # and imports inside functions (the CLI's)
    assert upward_imports(g, doc_layers(LAYOUT_DOC.read_text(encoding="utf-8"))) == []


def test_envs_never_imports_flywheel():
    envs = FLYWHEEL.parent / "envs"
    found = sorted(f"{p.relative_to(envs.parent)}: {name}" for p in envs.rglob("*.py") for name in _external(p)
                   if name.split(".")[0] == "flywheel")
    assert len(list(envs.rglob("*.py"))) > 10 and found == []


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
    # Store's methods come from the classes of the store package (one per group of tables, over the connection).
    classes = [n for p in (FLYWHEEL / "core" / "store").glob("*.py")
               for n in ast.parse(p.read_text(encoding="utf-8")).body if isinstance(n, ast.ClassDef)]
    assert "Store" in {c.name for c in classes}
    writers = {f.name for c in classes for f in c.body
               if isinstance(f, ast.FunctionDef) and f.name.startswith(STORE_WRITES)}
    assert {"write_trajectories", "record_checkpoint", "transaction", "cache_put", "claim_decision"} <= writers
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


def imported_test_modules(source: str) -> list[str]:
    """The test modules (`test_*`) that `source` imports, by absolute or relative name."""
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.ImportFrom):
            base = "." * n.level + (n.module or "")
            if n.level or base.split(".")[0] == "tests":
                out += [name for name in (base, *(f"{base}.{a.name}" for a in n.names))
                        if any(part.startswith("test_") for part in name.split("."))][:1]
        elif isinstance(n, ast.Import):
            out += [a.name for a in n.names if a.name.split(".")[0] == "tests"
                    and any(part.startswith("test_") for part in a.name.split("."))]
    return out


def test_the_import_finder_finds_test_modules():
    for source in ("from tests.core.test_store import x", "from .test_store import x",
                   "from tests.core import test_store", "import tests.core.test_store", "from . import test_store"):
        assert imported_test_modules(source), source
    assert imported_test_modules("from tests.fakes import make_traj\nimport tests.helpers\nfrom flywheel import cli") == []


def test_no_test_module_imports_another():
    """Shared fixtures live in tests/conftest.py, doubles in tests/fakes.py, helpers in tests/helpers.py."""
    found = sorted(TESTS.rglob("test_*.py"))
    assert len(found) > 50 and (TESTS / "core" / "test_store.py") in found
    offenders = sorted(f"{p.relative_to(TESTS)}: {name}" for p in found
                       for name in imported_test_modules(p.read_text(encoding="utf-8")))
    assert offenders == []


def misplaced_tests(tests: Path, flywheel: Path, envs: Path) -> list[str]:
    """What breaks the mirror: a test module at the top of `tests`, a folder that names neither a package of
    `flywheel` or `envs` nor a support folder, a folder without `__init__.py` (module names stay unique)."""
    problems = [f"{p.name}: at the top of tests/, move it into the folder of the package it tests"
                for p in sorted(tests.glob("test_*.py"))]
    for folder in sorted(d for d in tests.rglob("*") if d.is_dir()):
        rel = folder.relative_to(tests).parts
        if any(part.startswith((".", "__")) for part in rel):
            continue  # __pycache__ and tool caches
        package = (envs.parent if rel[0] == envs.name else flywheel) / Path(*rel)
        mirrors = (package / "__init__.py").is_file()
        if not mirrors and not (len(rel) == 1 and rel[0] in TEST_SUPPORT_FOLDERS):
            problems.append(f"{'/'.join(rel)}/: names no package under flywheel/ or envs/")
        if not (folder / "__init__.py").is_file():
            problems.append(f"{'/'.join(rel)}/: no __init__.py")
    return problems


def test_the_mirror_check_finds_misplaced_tests(tmp_path):
    for path in ("flywheel/core/__init__.py", "envs/__init__.py", "envs/webshop/__init__.py", "tests/__init__.py",
                 "tests/test_top.py", "tests/core/__init__.py", "tests/core/test_a.py", "tests/envs/webshop/test_b.py",
                 "tests/envs/__init__.py", "tests/e2e/__init__.py", "tests/misc/__init__.py", "tests/core/deep/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    problems = misplaced_tests(tmp_path / "tests", tmp_path / "flywheel", tmp_path / "envs")
    assert problems == ["test_top.py: at the top of tests/, move it into the folder of the package it tests",
                        "core/deep/: names no package under flywheel/ or envs/",
                        "envs/webshop/: no __init__.py",
                        "misc/: names no package under flywheel/ or envs/"]


def test_the_tests_mirror_the_packages():
    """tests/core tests flywheel/core, tests/envs tests envs/, ...; entry points, whole-chain runs and
    project-wide rules have their own folders (TEST_SUPPORT_FOLDERS)."""
    assert (TESTS / "core" / "test_store.py").is_file() and not (TESTS / "test_store.py").exists()
    assert misplaced_tests(TESTS, FLYWHEEL, FLYWHEEL.parent / "envs") == []


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in FLYWHEEL.rglob("*.py") if p.name != "__init__.py")
    assert [n for n, c in names.items() if c > 1] == []


def test_the_tiny_model_fixture_is_conftest_s_alone():
    """One tiny-model fixture (tests/conftest.py), not one per module with its own vocabulary."""
    pattern = re.compile(r"^\s*def tiny\(", re.M)
    defined = [p.relative_to(TESTS).as_posix() for p in sorted(TESTS.rglob("*.py"))
               if p != TESTS / "conftest.py" and pattern.search(p.read_text(encoding="utf-8"))]
    assert not defined and pattern.search((TESTS / "conftest.py").read_text(encoding="utf-8"))


def test_no_symlink_is_tracked():
    """A tracked symlink (e.g. a worktree's `.cache` link to another checkout's models) replaces, on checkout,
    the ignored folder of that name: git treats ignored files as expendable, so the models went with it."""
    import shutil
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-s"], capture_output=True, text=True, check=True)
    links = [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    assert links == [], f"tracked symlinks: {links}; `git rm --cached` them (and ignore them in .gitignore)"
