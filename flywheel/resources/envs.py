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
    train_limit: int | None = setting(None, sft0=False, help="training tasks (rollouts; null: all)",
                                      bound=Bound(1, 100_000, why="the number of training tasks"))
    seed_limit: int | None = setting(None, help="expert seeds come from the first seed_limit training tasks "
                                     "(null: all train_limit)", bound=Bound(1, 100_000))
    eval_limit: int | None = setting(None, sft0=False, help="evaluation tasks per split (null: all)",
                                     bound=Bound(1, 10_000, why="the number of evaluation tasks per split"))
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
        limit = self.train_limit if split == "train" else self.eval_limit
        types = tuple(self.task_types.get(benchmark, ())) or None
        return self.spec(benchmark).load_tasks(split, limit=limit, task_types=types)

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


def run_benchmark(context: dg.InitResourceContext) -> str | None:
    """The benchmark of the run's partition (a benchmark or a (benchmark, k) key), if the run is partitioned."""
    run = context.run
    key = run.tags.get("dagster/partition") if run is not None else None
    return benchmark_of(key) if key else None
