"""Stage 1 (bootstrapping): expert trajectories, then teacher planning quaternions."""


import dagster as dg

from flywheel.assets._common import progress_logger, rounded
from flywheel.core.prompting import system_message
from flywheel.orchestration.failures import fail_once, fails_once
from flywheel.orchestration.partitions import benchmark_partitions
from flywheel.resources import EnvResource, StoreResource, TeacherResource
from flywheel.rollout.seeds import collect_expert
from flywheel.teacher.base import apply_annotations


@dg.asset(partitions_def=benchmark_partitions, group_name="bootstrap", kinds={"duckdb"})
@fails_once
def expert_trajectories(context: dg.AssetExecutionContext, envs: EnvResource, store: StoreResource) -> dg.MaterializeResult:
    """Replay each seed task's expert path in the real env; keep the ones that succeed."""
    benchmark = context.partition_key
    spec = envs.spec(benchmark)
    tasks = envs.seed_tasks(benchmark)
    db = store.get()
    db.upsert_tasks([{"benchmark": t.benchmark, "split": t.split, "task_id": t.task_id, "goal": t.goal,
                      "max_steps": t.max_steps, "meta": t.meta} for t in tasks])
    ok, failed = collect_expert(spec, tasks, make_env=lambda: envs.make_env(benchmark),
                                progress=progress_logger(context, "expert replay"))
    db.write_trajectories(ok, replace_scope={"benchmark": benchmark, "source": "expert"})
    for task_id, reason in failed:
        context.log.warning(f"expert failed on {task_id}: {reason}")
    lengths = [len(t.steps) for t in ok]
    return dg.MaterializeResult(metadata=rounded({
        "tasks": len(tasks), "expert_successes": len(ok), "expert_failures": len(failed),
        "mean_length": sum(lengths) / max(len(lengths), 1), "max_length": max(lengths, default=0),
    }))


@dg.asset(partitions_def=benchmark_partitions, group_name="bootstrap", deps=[expert_trajectories], kinds={"duckdb"})
@fails_once
def teacher_quaternions(
    context: dg.AssetExecutionContext, envs: EnvResource, teacher: TeacherResource, store: StoreResource
) -> dg.MaterializeResult:
    """Annotate expert trajectories into (o_t, e_t, p_t, a_t) with the configured teacher."""
    benchmark = context.partition_key
    spec = envs.spec(benchmark)
    db = store.get()
    experts = db.load_trajectories(benchmark=benchmark, source="expert")
    if not experts:
        fail_once(context, f"no expert trajectories for {benchmark}: materialize expert_trajectories {benchmark} first")
    annotator = teacher.build(spec, db)
    instructions = spec.system_prompt()
    report = progress_logger(context, "teacher annotation")
    annotated = []
    for i, traj in enumerate(experts, 1):
        annotated.append(apply_annotations(traj, annotator.annotate(traj, instructions)))
        report(i, len(experts))
    db.write_trajectories(annotated, replace_scope={"benchmark": benchmark, "source": "teacher"})
    steps = [s for t in annotated for s in t.steps]
    sample = annotated[0].steps[min(1, len(annotated[0].steps) - 1)]
    return dg.MaterializeResult(metadata=rounded({
        "teacher": annotator.name,
        "trajectories": len(annotated),
        "quaternions": len(steps),
        "mean_thought_chars": sum(len(s.thought) for s in steps) / max(len(steps), 1),
        "mean_plan_chars": sum(len(s.plan) for s in steps) / max(len(steps), 1),
        "example": dg.MetadataValue.md(
            f"**system**\n\n```\n{system_message(instructions)[:1500]}\n```\n\n"
            f"**o_t**\n\n```\n{sample.observation[:800]}\n```\n\n**e_t** {sample.thought}\n\n"
            f"**p_t** {sample.plan}\n\n**a_t** `{sample.action}`"
        ),
    }))
