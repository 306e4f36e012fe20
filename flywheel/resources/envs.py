from typing import Any

import dagster as dg

from envs import get_benchmark
from envs.base import BenchmarkSpec, Env, Task


class EnvResource(dg.ConfigurableResource):
    """Which tasks each benchmark uses, and how its envs are built.

    `task_types` / limits pick a subset per benchmark (empty = all); the full
    ETO splits are the default.
    """

    task_types: dict[str, list[str]] = {}
    train_limit: int | None = None
    eval_limit: int | None = None
    max_steps: int | None = None
    env_options: dict[str, dict[str, Any]] = {}

    def spec(self, benchmark: str) -> BenchmarkSpec:
        return get_benchmark(benchmark)

    def tasks(self, benchmark: str, split: str) -> list[Task]:
        limit = self.train_limit if split == "train" else self.eval_limit
        types = tuple(self.task_types.get(benchmark, ())) or None
        return self.spec(benchmark).load_tasks(split, limit=limit, task_types=types)

    def make_env(self, benchmark: str) -> Env:
        return self.spec(benchmark).make_env(**self.env_options.get(benchmark, {}))
