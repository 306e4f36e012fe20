"""Concurrency-pool slots held by dead runs: find them, free them, or name the live run that holds one.

`sft_checkpoint` runs in pool `accelerator` (limit 1). A run worker killed with SIGKILL (or by
the OOM killer) never releases its slot, and with the default run launcher Dagster cannot see
that the worker is gone: the run stays STARTED and every later SFT waits for the slot forever.

`release_dead_slots` looks at every run that holds or waits for a pool slot:
- a finished run (failed, canceled, ...) still holding slots: its slots are freed (what the
  daemon does after `run_monitoring.free_slots_after_run_end_seconds`, done at once here);
- a run still marked in progress whose processes are all gone (the pids Dagster's executors
  record in the run's engine events: "Executing steps in process (pid: N)", ...): it is marked
  failed, naming the dead pids, and its slots are freed.
A run whose process is alive is left alone; `check_pool_free` then fails at once naming it,
its pid and what frees it, instead of letting the next SFT wait without a word.

Public instance APIs only: run records, the run's engine events, `report_run_failed`, and the
event log storage's `get_concurrency_run_ids` / `get_concurrency_info` / `free_concurrency_slots_for_run`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import psutil

ACCELERATOR_POOL = "accelerator"
FREE_COMMAND = "python -m flywheel.cli free-slots"


class PoolBusyError(RuntimeError):
    """A live run holds the pool's only slot: a new run would wait for it."""


@dataclass
class Holder:
    run_id: str
    status: str
    pools: list[str]
    pids: list[int] = field(default_factory=list)
    alive: list[int] = field(default_factory=list)
    partition: str | None = None
    job: str = ""


def _run_pids(instance: dg.DagsterInstance, run_id: str) -> list[tuple[int, float]]:
    """(pid, event time) of every process the run's executors announced in its engine events."""
    out = []
    for record in instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records:
        event = record.event_log_entry
        data = getattr(event.dagster_event, "event_specific_data", None) if event.dagster_event else None
        pid = (getattr(data, "metadata", None) or {}).get("pid")
        if pid is not None:
            try:
                out.append((int(getattr(pid, "value", pid)), event.timestamp))
            except (TypeError, ValueError):
                continue
    return out


def _alive(pid: int, announced_at: float) -> bool:
    """The process is running and is the one announced (not a later process reusing the pid)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= announced_at + 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def pool_holders(instance: dg.DagsterInstance) -> list[Holder]:
    """Every run that holds (or waits for) a pool slot, with the state of its processes."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    run_ids = storage.get_concurrency_run_ids()
    if not run_ids:
        return []
    pools: dict[str, list[str]] = {}
    for key in storage.get_concurrency_keys():
        info = storage.get_concurrency_info(key)
        for run_id in {s.run_id for s in info.claimed_slots} | {s.run_id for s in info.pending_steps}:
            pools.setdefault(run_id, []).append(key)
    holders = []
    for run_id in sorted(run_ids):
        run = instance.get_run_by_id(run_id)
        if run is None:
            holders.append(Holder(run_id=run_id, status="DELETED", pools=pools.get(run_id, [])))
            continue
        pids = _run_pids(instance, run_id)
        holders.append(Holder(
            run_id=run_id, status=run.status.value, pools=pools.get(run_id, []),
            pids=sorted({p for p, _ in pids}), alive=sorted({p for p, t in pids if _alive(p, t)}),
            partition=run.tags.get("dagster/partition"), job=run.job_name,
        ))
    return holders


def release_dead_slots(instance: dg.DagsterInstance, *, log=None) -> list[str]:
    """Free the slots of finished runs and of in-progress runs whose processes are all gone
    (those are marked failed first). Returns the run ids whose slots were freed."""
    freed = []
    for h in pool_holders(instance):
        if h.status in {"STARTED", "STARTING", "CANCELING"}:
            if h.alive or not h.pids:
                continue  # running, or no process announced yet (just launched): not ours to judge
            run = instance.get_run_by_id(h.run_id)
            if run is not None and not run.is_finished:
                instance.report_run_failed(
                    run, f"Run worker gone (pid {', '.join(map(str, h.pids))} no longer running on "
                    f"{socket.gethostname()}: killed, e.g. SIGKILL or the OOM killer); its pool slots were freed.")
        elif h.status not in {"SUCCESS", "FAILURE", "CANCELED", "DELETED"}:
            continue  # QUEUED / NOT_STARTED: holds nothing yet
        instance.event_log_storage.free_concurrency_slots_for_run(h.run_id)
        freed.append(h.run_id)
        if log is not None:
            log(f"freed pool slot(s) {h.pools} of run {h.run_id} ({h.job} {h.partition or ''}, {h.status}, "
                f"pid(s) {h.pids or 'none'} gone)")
    return freed


def check_pool_free(instance: dg.DagsterInstance, pool: str = ACCELERATOR_POOL, *, log=None) -> None:
    """Release dead runs' slots; then, if a live run still fills `pool`, fail at once naming it."""
    release_dead_slots(instance, log=log)
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    info = storage.get_concurrency_info(pool)
    limit = info.limit if info.limit is not None else info.slot_count
    holding = {s.run_id for s in info.claimed_slots}
    if not holding or limit is None or len(holding) < limit:
        return
    by_id = {h.run_id: h for h in pool_holders(instance)}
    names = []
    for run_id in sorted(holding):
        h = by_id.get(run_id)
        pids = ", ".join(map(str, h.alive or h.pids)) if h else "?"
        names.append(f"run {run_id} ({h.job if h else '?'} {h.partition if h else ''}, "
                     f"{h.status if h else '?'}, pid {pids})")
    raise PoolBusyError(
        f"Pool {pool!r} (limit {limit}) is held by {'; '.join(names)}, which is still running: a new "
        f"{pool} step would wait for it. Wait for it to finish, or stop it (kill that pid, or terminate the "
        f"run in the UI) and run `{FREE_COMMAND}`, which frees the slots of dead and finished runs."
    )


def command_instance() -> dg.DagsterInstance:
    """A command's Dagster instance: $DAGSTER_HOME's (its runs show up in `dagster dev`), else an ephemeral one."""
    if os.environ.get("DAGSTER_HOME"):
        Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
        return dg.DagsterInstance.get()
    return dg.DagsterInstance.ephemeral()


def ready_instance() -> dg.DagsterInstance:
    """The command's instance, with pool slots of dead runs (a killed SFT) freed; a live holder fails at once,
    naming it."""
    instance = command_instance()
    check_pool_free(instance, log=logging.getLogger(__name__).warning)
    return instance
