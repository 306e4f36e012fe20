"""The one small protocol every environment adapter implements.

The rollout loop owns history; an env only turns an action string into the next
observation. An invalid action is an observation, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Task:
    """One episode to play: which benchmark, which split, which instance.

    `expert_actions` is the gold/expert path where the benchmark provides one
    (filled lazily by the adapter's `expert_actions()` helper when cheap).
    """

    benchmark: str
    split: str
    task_id: str
    goal: str = ""
    max_steps: int = 30
    expert_actions: tuple[str, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    success: bool
    info: dict[str, Any] = field(default_factory=dict)


class EnvError(RuntimeError):
    """The environment itself broke (JVM died, engine exception).

    Distinct from a bad action: the episode is marked errored, not failed.
    """


@runtime_checkable
class Env(Protocol):
    def reset(self, task: Task) -> str:
        """Start `task`; return the first observation (goal included)."""
        ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


SPLITS = ("train", "seen", "unseen")


class StepView(Protocol):
    """What a complexity signal may read of one played step (flywheel's `Step` has these fields)."""

    observation: str  # what the agent saw before acting
    action: str
    next_observation: str  # what the env answered
    reward: float
    invalid: bool  # the env flagged the action as invalid (`StepResult.info["invalid"]`)


@runtime_checkable
class BenchmarkSpec(Protocol):
    """Everything the flywheel needs to know about one benchmark.

    Lives beside the env so adding a benchmark touches its own package plus one
    line in the registry (`envs/__init__.py`); `flywheel/` never names a benchmark.

    Optional attributes and methods (the flywheel uses the default when a spec lacks one):

    - `display_name` (default: `name`): how tables and reports title the benchmark.
    - `eval_splits` (default `("seen", "unseen")`): the splits evaluation plays; a benchmark
      with one test set names one split so it is not played twice. The results tables have
      one column per evaluation split (titled by `display_name` alone when there is one).
    - `primary_metric` (default `"success_rate"`, or `"avg_reward"`): what the paper's main
      table reports for this benchmark (a reward column is titled "avg reward").
    - `paper_notes` (default `()`): sentences the paper report adds under "What differs from
      the paper" (e.g. which test index or data stands in for the paper's).
    - `eval_bucket_edges` (default `(5, 10)`): inclusive upper gold-path-length edges of the
      easy / medium evaluation buckets (hard is above the last).
    - `gold_length(task) -> int` (default `len(expert_actions(task))`): the gold path length
      that grades an evaluation task, when a cheaper or shorter reference exists. A task whose
      `expert_actions` is filled is graded by that, without asking the spec.
    - `complexity_signals() -> {name: fn(steps) -> float}` (default `{}`): this benchmark's
      own versions of the flywheel's complexity signals (`locations`, `subgoals`), over a
      trajectory's steps (`StepView`); a signal it does not define uses the generic one
      (flywheel/curriculum/complexity.py).
    - `synthesizer()` (default: none, so stage-2 synthesis refuses the benchmark): the
      benchmark's task synthesizer (`envs/<name>/synthesis.py`, imported lazily), built from this
      spec's fields, so that its tasks get the seeds' step limit (and data).
    - `demo_task_types` (default `None`: all tasks), `demo_spec_options` and
      `demo_env_options` (default `{}`): what `flywheel demo` uses for this benchmark unless
      its flags say otherwise (e.g. a small model's compact prompt).
    - `close()` (default: nothing to end): ends the helpers this spec object started for its
      expert paths (ScienceWorld's gold-path JVM, ALFWorld's expert worker; `envs/owned.py`).
      Each spec object owns its own; the registry's value is a template that `configure_spec`
      copies, and a run's `EnvResource` closes the copies it handed out when the run ends.
    - `needs_data_dir` (default `True`): runs check that the data folder exists before any work;
      `False` for a benchmark whose tasks live in code (e.g. the tests' tiny benchmark).

    Spec options (`configure_spec`, `EnvResource.spec_options`) are the spec's dataclass init
    fields; env options (`EnvResource.env_options`) are the keyword arguments of the env
    class its `make_env` is annotated to return (see `env_option_names`).
    """

    name: str

    def load_tasks(self, split: str, *, limit: int | None = None, task_types: tuple[str, ...] | None = None) -> list[Task]:
        """Tasks of a split (`train`, `seen`, `unseen`), in a fixed order."""
        ...

    def make_env(self, **options: Any) -> Env: ...

    def system_prompt(self) -> str:
        """Instructions + action space shown to policy and teacher."""
        ...

    def expert_actions(self, task: Task) -> list[str]:
        """A successful action sequence for `task` (gold path / expert / oracle)."""
        ...

    def normalize_action(self, raw: str) -> str:
        """Clean a model-written action line into the env's action syntax."""
        ...

    def describe_action(self, action: str) -> str:
        """A short natural-language intent for an action, used by the scripted teacher."""
        ...
