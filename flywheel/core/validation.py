"""Fail fast on bad configuration, before any expensive work, with a message that names the fix.

Plain functions (no Dagster): the resources call them in `setup_for_execution` (so a run
fails at its first step, before a JVM starts or a model loads), the sensors call them on
every tick, and `pipeline.run_flywheel` calls them before its first run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from envs import get_benchmark, known_benchmarks
from envs.data import ENV_VAR as DATA_ENV_VAR
from envs.data import MissingDataError, data_dir
from flywheel.core.options import Bound


class ConfigurationError(ValueError):
    """A configuration that cannot work; the message says how to fix it."""


def check_benchmark(name: str, *, where: str = "benchmark", refs: dict[str, str] | None = None) -> str:
    """`name` if the registry or the extra references `refs` (name -> "module:attribute") know it."""
    known = known_benchmarks(refs)
    if name not in known:
        raise ConfigurationError(
            f"Unknown benchmark {name!r} in {where}. Known: {', '.join(sorted(known))}. "
            "Fix the name, or register a new benchmark in envs/__init__.py, or name it by reference in the "
            f"profile (benchmarks: {{{name}: \"package.module:SPEC\"}})."
        )
    return name


def check_benchmarks(names: Iterable[str], *, where: str, refs: dict[str, str] | None = None) -> list[str]:
    return [check_benchmark(n, where=where, refs=refs) for n in names]


def check_benchmark_refs(refs: dict[str, str], *, where: str) -> None:
    """Every reference loads a spec of that name, before any work (an import error names the reference)."""
    for name, ref in refs.items():
        if not isinstance(name, str) or not isinstance(ref, str):
            raise ConfigurationError(f"{where}: a benchmark reference maps a name to 'package.module:SPEC', "
                                     f"got {name!r}: {ref!r}")
        try:
            get_benchmark(name, refs)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise ConfigurationError(f"{where}: benchmark {name!r} = {ref!r} does not load: {exc}") from None


def check_iterations_fit(k: int, *, max_partition: int | None = None) -> int:
    """K (iterations 0..K) must be >= 0 and, when the partition range is known, have a partition for every k."""
    if k < 0:
        raise ConfigurationError(
            f"The iteration budget K must be >= 0, got {k}: set loop.iterations to 0 or more."
        )
    if max_partition is not None and k > max_partition:
        raise ConfigurationError(
            f"The iteration budget K = {k} exceeds the iteration partitions 0..{max_partition}: "
            f"raise the profile's iterations to at least {k}, or lower loop.iterations."
        )
    return k


def check_model_path(path: str | Path, *, what: str = "policy.base_model_path") -> Path:
    p = Path(path)
    if not (p / "config.json").exists():
        raise ConfigurationError(
            f"No Hugging Face model at {p} ({what}; config.json missing). Run `make model` for "
            "SmolLM2-135M, `python -m flywheel.cli prepare-model --tiny --out PATH` for a test model, or set "
            f"{what} / FLYWHEEL_BASE_MODEL to a local HF checkpoint."
        )
    return p


def check_data(benchmark: str, splits: Iterable[str] = ("train", "seen", "unseen"), *,
               refs: dict[str, str] | None = None, task_types: tuple[str, ...] | None = None) -> None:
    """The benchmark's offline data is where the loaders look (cheap: reads the split files only), and
    `task_types` (when given) are task types it has.

    A spec whose tasks live in code says so (`needs_data_dir = False`): no data folder is required."""
    spec = get_benchmark(check_benchmark(benchmark, refs=refs), refs)
    root = data_dir()
    if getattr(spec, "needs_data_dir", True) and not root.is_dir():
        raise ConfigurationError(
            f"Data folder {root} does not exist ({benchmark} needs its offline data): put the project's "
            f"shared data there or set {DATA_ENV_VAR} to the folder that holds it."
        )
    for split in splits:
        try:
            spec.load_tasks(split, limit=1, task_types=task_types)
        except MissingDataError as exc:
            raise ConfigurationError(f"{benchmark} data missing for split {split!r}: {exc}") from None
        except ValueError as exc:  # an unknown task type
            raise ConfigurationError(f"{benchmark}: {exc} Fix --task-types / envs.task_types.") from None


def check_writable_dir(path: Path, what: str) -> Path:
    """`path` is a folder this process can write into (made later if missing), or a one-line error naming `what`."""
    if path.exists() and not path.is_dir():
        raise ConfigurationError(f"{what} {path} is a file, not a folder: point {what} at a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{what} {path} cannot be written ({existing} is not a writable folder): "
                                 f"point {what} at a writable folder")
    return path


def check_plain_name(name: str, what: str) -> str:
    """`name` if it is a plain file name (it becomes a folder or file name): no '/', no '..'."""
    if not name or Path(name).name != name or name in (".", "..") or "\\" in name:
        raise ConfigurationError(f"{what} {name!r} must be a plain file name (no '/', no '..'): rename it")
    return name


def check_positive(value: int | float, name: str) -> None:
    if value <= 0:
        raise ConfigurationError(f"{name} must be > 0, got {value}")


# -- numeric options: each bound is declared on its field (flywheel/core/options.py) -------------------------

# Rollouts play (training tasks x samples) episodes per iteration, held in memory until written; this
# budget is what a run on this project's 2-core / 24 GiB machine can afford (about a day of CPU rollouts).
MAX_EPISODES_PER_ITERATION = 20_000
DTYPES = ("auto", "float32", "bfloat16", "float16")


def check_options(values: dict[str, Any], *, bounds: dict[str, Bound], names: dict[str, str] | None = None,
                  where: str = "") -> None:
    """Every option in `values` that `bounds` bounds within its bound (None = unset, allowed; the bounds of a
    resource's fields: `flywheel.resources.fields.bounds_of`), the dtype known, and the rollout budget
    affordable. `names` maps option names to how the user wrote them (CLI flags)."""
    names = names or {}

    def shown(key: str) -> str:
        return names.get(key, f"{where}{key}")

    for key, value in values.items():
        bound = bounds.get(key)
        if bound is None or value is None:
            continue
        if not bound.allows(value):
            raise ConfigurationError(bound.refusal(shown(key), value))
    if "dtype" in values and values["dtype"] not in DTYPES:
        raise ConfigurationError(f"{shown('dtype')} must be one of {', '.join(DTYPES)}, got {values['dtype']!r}: "
                                 f"set {shown('dtype')} to one of them.")
    tasks, samples = values.get("train_limit"), values.get("samples_per_task")
    if isinstance(tasks, int) and isinstance(samples, int) and tasks * samples > MAX_EPISODES_PER_ITERATION:
        raise ConfigurationError(
            f"{shown('train_limit')} x {shown('samples_per_task')} = {tasks} x {samples} = {tasks * samples:,} rollout "
            f"episodes per iteration, more than the {MAX_EPISODES_PER_ITERATION:,} this machine can hold and play: "
            f"lower {shown('samples_per_task')} or {shown('train_limit')}.")


# -- bounded YAML ------------------------------------------------------------------------------
# Presets and profiles are small: the largest shipped one has ~330 nodes (every alias expanded) and nests 5
# deep. A YAML bomb (anchors expanding to 10^9 elements in `notes` or `env_options`) or a 5,000-deep list
# is refused before it is built, instead of hanging the run or ending in a RecursionError.
YAML_MAX_NODES = 10_000  # scalars, lists and mappings of a document, every alias counted as what it expands to
YAML_MAX_DEPTH = 16  # lists and mappings inside each other, aliases expanded


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that stops composing at YAML_MAX_DEPTH levels or YAML_MAX_NODES nodes."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source, self.depth, self.nodes = source, 0, 0

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        self.depth, self.nodes = self.depth + 1, self.nodes + 1
        try:
            if self.depth > YAML_MAX_DEPTH or self.nodes > YAML_MAX_NODES:
                raise _too_big(self.source, self.nodes, self.depth)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _too_big(source: str, nodes: int, depth: int) -> ConfigurationError:
    what = (f"nests deeper than {YAML_MAX_DEPTH} levels" if depth > YAML_MAX_DEPTH
            else f"has more than {YAML_MAX_NODES} YAML nodes")
    return ConfigurationError(f"{source} {what} (aliases counted as what they expand to): a preset or profile is "
                              "a few hundred plain fields; write them out without deep nesting or anchors")


def load_yaml(text: str, source: str) -> Any:
    """`yaml.safe_load` of a preset or profile, bounded: more than YAML_MAX_NODES nodes or YAML_MAX_DEPTH levels,
    counting each alias as what it expands to, or an alias inside itself, is a ConfigurationError naming
    `source`, raised before anything is built."""
    loader = _BoundedLoader(text, source)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{source} is not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _check_expanded(root: yaml.Node, source: str) -> None:
    """The size and depth `root` has with every alias expanded, computed once per distinct node (no expansion,
    no recursion): over the bounds, or a node inside itself, is refused."""
    done: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if key in done:
            continue
        kids = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if finished:
            open_.discard(key)
            size = 1 + sum(done[id(k)][0] for k in kids)
            depth = 1 + max((done[id(k)][1] for k in kids), default=0)
            if size > YAML_MAX_NODES or depth > YAML_MAX_DEPTH:
                raise _too_big(source, size, depth)
            done[key] = (size, depth)
            continue
        if key in open_:
            raise ConfigurationError(f"{source}: an alias refers to the node that contains it: write the values out")
        open_.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in done)
