"""Stage 2 (extrapolation): synthesized harder tasks, and the complexity-graded curriculum.

`synthetic_curriculum(b)`: the teacher proposes new tasks near the seeds; each is built in
the real env, solved by the benchmark's expert, judged by the env, annotated into
quaternions and stored as source="synthetic" (rejections are kept with their reason in
`curriculum_proposals`). Then every training trajectory, seed or synthetic, is scored
and the easy-to-hard order is written to `curriculum`. The logic is in flywheel/curriculum.

`CurriculumResource` (flywheel/resources/curriculum_resource.py) holds the knobs and the ablation switch:
`CurriculumResource(synthesize=False, order="shuffle")` is stage 1 alone.
"""

from collections import Counter

import dagster as dg

from flywheel.assets._common import progress_logger, rounded
from flywheel.assets.bootstrap import teacher_quaternions
from flywheel.core.metrics import markdown_table
from flywheel.curriculum.order import grade
from flywheel.curriculum.proposals import get_synthesizer
from flywheel.curriculum.solving import length_stats, synthesize
from flywheel.curriculum.tables import replace_synthetic_tasks, write_curriculum, write_proposals
from flywheel.orchestration.failures import fail_once, fails_once
from flywheel.orchestration.partitions import benchmark_partitions
from flywheel.resources import CurriculumResource, EnvResource, StoreResource, TeacherResource


@dg.asset(partitions_def=benchmark_partitions, group_name="curriculum", deps=[teacher_quaternions], kinds={"duckdb"})
@fails_once
def synthetic_curriculum(
    context: dg.AssetExecutionContext, envs: EnvResource, teacher: TeacherResource, store: StoreResource,
    curriculum: CurriculumResource,
) -> dg.MaterializeResult:
    """Seeds plus synthesized harder tasks, graded by complexity and ordered easy to hard."""
    benchmark = context.partition_key
    db = store.get()
    mode, scorer = curriculum.mode(), curriculum.scorer()
    seeds = db.load_trajectories(benchmark=benchmark, source="teacher")
    if not seeds:
        fail_once(context, f"no teacher quaternions for {benchmark}: materialize teacher_quaternions {benchmark} first")
    spec = envs.spec(benchmark)
    annotator = teacher.build(spec, db)
    metadata: dict[str, object] = {"teacher": annotator.name, "synthesize": curriculum.synthesize, "order": mode}
    synthetic = []
    if curriculum.synthesize:
        result = synthesize(
            benchmark=benchmark, synthesizer=get_synthesizer(spec), teacher=annotator,
            seed_tasks=envs.tasks(benchmark, "train"), seed_trajs=seeds,
            # The evaluation splits and the promotion gate's validation tasks: no synthesized task is one of them.
            holdout=spec.load_tasks("seen") + spec.load_tasks("unseen") + envs.validation_set(benchmark),
            instructions=spec.system_prompt(),
            n_proposals=curriculum.n_proposals(len(seeds)), candidate_limit=curriculum.candidate_limit,
            seed=curriculum.seed, env_options=envs.env_options.get(benchmark, {}), max_steps=envs.max_steps,
            progress=progress_logger(context, "curriculum synthesis"),
        )
        synthetic = result.trajectories
        db.write_trajectories(synthetic, replace_scope={"benchmark": benchmark, "source": "synthetic"})
        replace_synthetic_tasks(db, benchmark, result.tasks)
        write_proposals(db, benchmark, [p.record() for p in result.proposals])
        for p in result.proposals:
            if p.status != "solved":
                context.log.info(f"proposal {p.proposal_id} {p.status}: {p.reason}")
        reasons = Counter(f"{p.status}: {':'.join(p.reason.split(':')[:2])[:100]}"
                          for p in result.proposals if p.status != "solved")
        metadata.update({**result.counts(), "candidates_offered": result.candidates,
                         "proposer": result.proposals[0].proposer if result.proposals else annotator.name,
                         "not_kept_by_reason": dg.MetadataValue.md(markdown_table(
                             [{"reason": r, "count": n} for r, n in reasons.most_common()], ["reason", "count"]) if reasons else "none"),
                         "proposals_sample": dg.MetadataValue.md(markdown_table(
                             [{**p.record(), "params": str(p.params)[:120]} for p in result.proposals[:12]],
                             ["proposal_id", "kind", "status", "length", "task_id", "reason", "params"]))})
    else:
        db.delete_trajectories(benchmark=benchmark, source="synthetic")
        replace_synthetic_tasks(db, benchmark, [])
        write_proposals(db, benchmark, [])
        metadata.update({"proposals": 0, "valid": 0, "solved": 0, "kept": 0,
                         "status": "synthesis off (ablation): seeds only"})

    trajs = seeds + synthetic
    _, ordered, buckets = grade(trajs, scorer.score_all(trajs, spec), edges=curriculum.train_edges(benchmark),
                                mode=mode if mode != "shuffle" else "curriculum", seed=curriculum.seed)
    write_curriculum(db, benchmark, ordered, other_signal=scorer.other, scorer=scorer.name)
    seed_len, syn_len = [len(t.steps) for t in seeds], [len(t.steps) for t in synthetic]
    seed_median = length_stats(seed_len)["median"]
    by_bucket = Counter((c.bucket, c.source) for c in ordered)
    metadata.update({
        "seed_trajectories": len(seeds),
        "synthesized_trajectories": len(synthetic),
        "seed_length": dg.MetadataValue.json(length_stats(seed_len)),
        "synthetic_length": dg.MetadataValue.json(length_stats(syn_len)),
        "synthetic_longer_than_seed_median": sum(n > seed_median for n in syn_len) / max(len(syn_len), 1),
        "scorer": scorer.name,
        "other_signal": scorer.other,
        "buckets": buckets.describe(),
        "curriculum": dg.MetadataValue.md(markdown_table(
            [{"bucket": b, "seed": by_bucket[(b, "teacher")], "synthetic": by_bucket[(b, "synthetic")]} for b in buckets.names],
            ["bucket", "seed", "synthetic"])),
    })
    return dg.MaterializeResult(metadata=rounded(metadata))
