"""One launch, one failure, one reason: failures that cannot pass on retry are not retried.

`dagster.yaml` enables run retries (a killed rollout run resumes from the store on retry)
and assets carry op retry policies (an env crash, an OOM, a teacher 5xx). Neither helps
when the failure is *deterministic*: a bad configuration, a missing model or checkpoint,
a failed blocking check, an iteration k+1 started before gate k. Those fail once:

- `fail_once(context, message)` raises `dg.Failure(..., allow_retries=False)` (op retry
  policies are bypassed) after tagging the run `dagster/retry_on_asset_or_op_failure=false`
  (Dagster's documented run tag; the run-retry daemon reads the run's tags when the run
  fails and then does not retry it) and `flywheel/fail_once=<reason>` (shown in the UI).
- `@fails_once` on an asset turns the deterministic exception types below, raised anywhere
  in its body, into `fail_once` with the exception's message (which names the fix).
- `mark_run_not_retryable(context, reason)` only tags the run (also `dagster/max_retries=0`):
  for a blocking check that failed (the step fails, and a re-run on the same data would fail
  the same way) and, through `@setup_fails_once`, for a resource whose configuration is
  invalid (its `setup_for_execution` fails the run before any step).

Everything else (EnvError, TeacherError, CUDA OOM, a killed worker) keeps its retries.

An interrupt is not a failure to retry either: Dagster answers an interrupted step that has a retry policy
with a retry ("respect retry policy when interrupts occur"), so `kill PID` (SIGTERM through the CLI) or
Ctrl-C during `rollouts` played on in a second attempt and it took three to stop an experiment.
`@fails_once` turns an interrupt raised in its body into a step failure without op retries; the run ends,
and the same command later resumes from what the store holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import dagster as dg

from envs.data import MissingDataError
from flywheel.core.store import ForeignStoreError
from flywheel.core.validation import ConfigurationError
from flywheel.policy.models import ModelNotFoundError

NO_RUN_RETRY_TAG = "dagster/retry_on_asset_or_op_failure"
MAX_RETRIES_TAG = "dagster/max_retries"
FAIL_ONCE_TAG = "flywheel/fail_once"


class NotRetryable(RuntimeError):
    """Raised by helpers without a Dagster context (a missing checkpoint): a retry cannot fix it."""


# Errors that a retry of the same run cannot fix: the user has to change something first.
DETERMINISTIC: tuple[type[BaseException], ...] = (
    ConfigurationError, ModelNotFoundError, MissingDataError, ForeignStoreError, NotRetryable,
)


def _run_of(context: Any) -> tuple[dg.DagsterInstance | None, str | None]:
    ctx = getattr(context, "op_execution_context", context)
    return getattr(ctx, "instance", None), getattr(ctx, "run_id", None)


def mark_run_not_retryable(context: Any, reason: str) -> None:
    """Tag the current run so that run retries leave it failed (a no-op outside a run)."""
    instance, run_id = _run_of(context)
    if instance is None or not run_id or instance.get_run_by_id(run_id) is None:
        return
    # Both documented run tags: retry_on_asset_or_op_failure covers step failures, max_retries=0 a run
    # that failed before its steps (a resource whose configuration is invalid).
    instance.add_run_tags(run_id, {NO_RUN_RETRY_TAG: "false", MAX_RETRIES_TAG: "0",
                                   FAIL_ONCE_TAG: " ".join(reason.split())[:200]})


def fail_once(context: Any, message: str, *, metadata: dict[str, Any] | None = None) -> NoReturn:
    """Fail this step and its run for good: no op retry, no run retry. `message` names the fix."""
    mark_run_not_retryable(context, message)
    raise dg.Failure(description=f"{message} (not retried: a retry cannot change this)",
                     metadata=metadata, allow_retries=False)


@contextmanager
def deterministic_errors(context: Any) -> Iterator[None]:
    """Inside: a DETERMINISTIC exception becomes `fail_once` with its message; an interrupt fails the step
    without op retries (run retries are left to the deployment: a terminated run is not retried by them)."""
    try:
        yield
    except DETERMINISTIC as exc:
        fail_once(context, f"{type(exc).__name__}: {' '.join(str(exc).split())}")
    except (KeyboardInterrupt, dg.DagsterExecutionInterruptedError) as exc:
        raise dg.Failure(description="interrupted (Ctrl-C, SIGTERM or a terminated run): not retried; the same "
                         "command resumes from what the store holds", allow_retries=False) from exc


def fails_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for an asset or check body (under `@dg.asset`): see `deterministic_errors`."""

    @functools.wraps(fn)
    def wrapper(context: Any, *args: Any, **kwargs: Any) -> Any:
        with deterministic_errors(context):
            return fn(context, *args, **kwargs)

    return wrapper


@contextmanager
def config_errors_fail_once(context: dg.InitResourceContext) -> Iterator[None]:
    """In a resource's `setup_for_execution`: an invalid configuration fails the run once."""
    try:
        yield
    except DETERMINISTIC as exc:
        mark_run_not_retryable(context, f"{type(exc).__name__}: {exc}")
        raise


def setup_fails_once(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a resource's `setup_for_execution(self, context)`: see `config_errors_fail_once`."""

    @functools.wraps(method)
    def wrapper(self: Any, context: dg.InitResourceContext) -> Any:
        with config_errors_fail_once(context):
            return method(self, context)

    return wrapper
