"""Stage 2 (extrapolation): task synthesis and the complexity-graded curriculum. No Dagster here.

- proposals.py: what a teacher proposes, and the per-benchmark synthesizers (envs/<b>/synthesis.py)
- solving.py:   propose -> instantiate in the real env -> solve -> judge -> annotate
- complexity.py: pluggable complexity signals (length, locations, subgoals) and scorer
- buckets.py:   easy/medium/hard edges, success by bucket
- order.py:     the easy-to-hard sampler (ordered or staged) that replaces the shuffle
- tables.py:    the curriculum's DuckDB tables
"""

from flywheel.curriculum.buckets import BUCKETS, Buckets, eval_buckets, quantile_buckets, success_by_bucket
from flywheel.curriculum.complexity import SIGNALS, Complexity, ComplexityScorer, register_signal
from flywheel.curriculum.order import MODES, CurriculumSampler, assign_buckets, grade, order_trajectories

__all__ = [
    "BUCKETS", "Buckets", "Complexity", "ComplexityScorer", "CurriculumSampler", "MODES", "SIGNALS",
    "assign_buckets", "eval_buckets", "grade", "order_trajectories", "quantile_buckets", "register_signal",
    "success_by_bucket",
]
