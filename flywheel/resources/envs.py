import itertools
import threading
from typing import Any

import dagster as dg
from pydantic import PrivateAttr

from envs import check_env_options, configure_spec, get_benchmark
from envs.base import BenchmarkSpec, Env, Task
from flywheel.core.options import Bound
from flywheel.core.validation import (
    check_benchmark,
    check_benchmark_refs,
    check_benchmarks,
    check_data,
)
from flywheel.orchestration.failures import setup_fails_once
from flywheel.orchestration.partitions import benchmark_of
from flywheel.resources.fields import check_fields, setting
from flywheel.rollout.ray_pool import EnvFactory


class EnvResource(dg.ConfigurableResource):
    """Which tasks each benchmark uses, and how its envs are built.

    `task_types` / limits pick a subset per benchmark (empty = all); the full
    ETO splits are the default. `benchmark_refs` (name -> "module:attribute") are the benchmarks
    the profile names by reference beside `envs.REGISTRY`'s (the profile fills it).
    """

    benchmark_refs: dict[str, str] = setting(default_factory=dict, help='benchmarks named by reference, name -> '
                                             '"package.module:SPEC" (the profile fills it)')
    task_types: dict[str, list[str]] = setting(default_factory=dict, help="the task types each benchmark plays, "
                                               "by benchmark (empty: all)")
    # Rollouts play all `train_limit` tasks, so gated successes can cover tasks no seed covers.
    train_limit: int | None = setting(None, sft0=False, play=False, help="training tasks (rollouts; null: all)",
                                      bound=Bound(1, 100_000, why="the number of training tasks"))
    seed_limit: int | None = setting(None, help="expert seeds come from the first seed_limit training tasks "
                                     "(null: all train_limit)", bound=Bound(1, 100_000))
    eval_limit: int | None = setting(None, sft0=False, play=False, help="evaluation tasks per split (null: all)",
                                     bound=Bound(1, 10_000, why="the number of evaluation tasks per split"))
    # In the k=0 SFT's configuration: the set-aside tasks are no seed's, rollout's or synthesized task's.
    validation_tasks: int = setting(50, help="training tasks set aside as the promotion gate's validation set "
                                    "(loop.promotion_gate): the train split's last ones, each task type in turn, at "
                                    "most a quarter of the split; no seed, curriculum task or rollout uses them "
                                    "(0: none)", bound=Bound(0, 10_000, why="the number of validation tasks"))
    # In the k=0 SFT's configuration: stage 2 keeps only synthesized tasks whose expert path fits this cap.
    max_steps: int | None = setting(None, help="env steps per episode at most, on top of each task's own limit "
                                    "(synthesized tasks too)", bound=Bound(1, 1_000, why="the step cap of an episode"))
    env_options: dict[str, dict[str, Any]] = setting(default_factory=dict, help="options of each benchmark's env "
                                                     "constructor, by benchmark")
    spec_options: dict[str, dict[str, Any]] = setting(default_factory=dict, help='fields of a benchmark\'s spec, '
                                                      'by benchmark, e.g. {"<benchmark>": {"prompt": "compact"}}')

    _specs: dict[str, BenchmarkSpec] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @setup_fails_once  # invalid configuration: the run fails once (flywheel.orchestration.failures)
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Fail the run at its first step, naming the fix, on unknown benchmarks or missing data."""
        check_fields(self, where="envs.")
        check_benchmark_refs(self.benchmark_refs, where="envs.benchmark_refs")
        refs = self.benchmark_refs
        check_benchmarks(self.task_types, where="envs.task_types", refs=refs)
        check_benchmarks(self.env_options, where="envs.env_options", refs=refs)
        check_benchmarks(self.spec_options, where="envs.spec_options", refs=refs)
        for name in self.spec_options:
            self.spec(name)  # unknown or invalid options fail here, naming the valid ones
        for name, options in self.env_options.items():
            check_env_options(self.spec(name), options)  # an option the env does not take, likewise
        benchmark = run_benchmark(context)
        if benchmark is not None:
            check_data(check_benchmark(benchmark, where="the run's partition", refs=refs), refs=refs)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def spec(self, benchmark: str) -> BenchmarkSpec:
        """This resource's own copy of the benchmark's spec, configured by `spec_options`.

        One per benchmark for the resource's lifetime (a run): the spec's caches and expert helpers
        (a gold-path JVM, a worker process) are shared by the run's steps and ended by `close()`,
        which Dagster calls when the run's execution ends.
        """
        with self._lock:
            if benchmark not in self._specs:
                spec = get_benchmark(check_benchmark(benchmark, refs=self.benchmark_refs), self.benchmark_refs)
                self._specs[benchmark] = configure_spec(spec, self.spec_options.get(benchmark, {}))
            return self._specs[benchmark]

    def close(self) -> None:
        """End the helpers of every spec this resource handed out (idempotent)."""
        with self._lock:
            specs, self._specs = list(self._specs.values()), {}
        for spec in specs:
            close = getattr(spec, "close", None)
            if close is not None:
                close()

    def tasks(self, benchmark: str, split: str) -> list[Task]:
        """The split's tasks in the spec's order, `train_limit` / `eval_limit` of them; the training tasks
        never include the validation set (`validation_set`) nor a task an evaluation split holds."""
        types = tuple(self.task_types.get(benchmark, ())) or None
        if split != "train":
            return self.spec(benchmark).load_tasks(split, limit=self.eval_limit, task_types=types)
        every = self.training_split(benchmark)
        aside = {t.task_id for t in set_aside(every, self.validation_tasks)} if self.validation_tasks else set()
        kept = [t for t in every if t.task_id not in aside]
        return kept if self.train_limit is None else kept[: self.train_limit]

    def training_split(self, benchmark: str) -> list[Task]:
        """The training split (of the preset's task types) without the tasks an evaluation split also holds:
        ETO's ScienceWorld train index shares 54 of its dev ("seen") index's 194 [task, variation] pairs, which
        rollouts or the validation set would otherwise play (none of the CPU presets' first 40 to 54 tasks)."""
        types = tuple(self.task_types.get(benchmark, ())) or None
        spec = self.spec(benchmark)
        held = {t.task_id for split in self.eval_splits(benchmark) for t in spec.load_tasks(split, task_types=types)}
        return [t for t in spec.load_tasks("train", task_types=types) if t.task_id not in held]

    def validation_set(self, benchmark: str) -> list[Task]:
        """The promotion gate's validation tasks: training-split tasks that `tasks(b, "train")` (so seeds and
        rollouts) never includes, no evaluation split holds, and the curriculum holds out (`set_aside`)."""
        if not self.validation_tasks:
            return []
        return set_aside(self.training_split(benchmark), self.validation_tasks)

    def seed_tasks(self, benchmark: str) -> list[Task]:
        """The training tasks whose expert paths become seeds: a prefix of `tasks(b, "train")`."""
        tasks = self.tasks(benchmark, "train")
        return tasks if self.seed_limit is None else tasks[: self.seed_limit]

    def eval_splits(self, benchmark: str) -> tuple[str, ...]:
        """The splits evaluation plays: the spec's `eval_splits` (one WebShop test set), else seen and unseen."""
        return tuple(getattr(self.spec(benchmark), "eval_splits", ("seen", "unseen")))

    def make_env(self, benchmark: str) -> Env:
        return self.spec(benchmark).make_env(**self.env_options.get(benchmark, {}))

    def env_factory(self, benchmark: str) -> EnvFactory:
        """`make_env` for one benchmark as a plain picklable callable (what Ray env actors receive)."""
        ref = {benchmark: self.benchmark_refs[benchmark]} if benchmark in self.benchmark_refs else {}
        return EnvFactory(check_benchmark(benchmark, refs=self.benchmark_refs), dict(self.spec_options.get(benchmark, {})),
                          dict(self.env_options.get(benchmark, {})), ref)


# Task.meta keys that name a task's type in the shipped benchmarks (ALFWorld, ScienceWorld, WebShop, tests).
TYPE_KEYS = ("task_type", "task_name", "category", "type")


def set_aside(train: list[Task], n: int) -> list[Task]:
    """The validation set carved out of the training split `train` (in the spec's order): from its end, each
    task type in turn (`TYPE_KEYS`), `n` tasks but at most a quarter of the split, in a fixed order.

    From the end, so that the prefixes that seeds (`seed_limit`) and rollouts (`train_limit`) take keep their
    tasks unless they reach that far; by type in turn, so that a split ordered by type (ALFWorld interleaves
    its types, and the most numerous fill its end) still gives every type validation tasks."""
    by_type: dict[str, list[Task]] = {}
    for task in reversed(train):
        kind = next((str(task.meta[key]) for key in TYPE_KEYS if key in task.meta), "")
        by_type.setdefault(kind, []).append(task)
    rounds = [t for group in itertools.zip_longest(*by_type.values()) for t in group if t is not None]
    return rounds[: min(n, len(train) // 4)]


def run_benchmark(context: dg.InitResourceContext) -> str | None:
    """The benchmark of the run's partition (a benchmark or a (benchmark, k) key), if the run is partitioned."""
    run = context.run
    key = run.tags.get("dagster/partition") if run is not None else None
    return benchmark_of(key) if key else None
