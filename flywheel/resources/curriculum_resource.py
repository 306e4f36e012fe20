"""Stage 2 settings (synthesis and the easy->hard order) as a Dagster resource; the logic is in flywheel/curriculum."""

import math

import dagster as dg

from envs.base import BenchmarkSpec
from flywheel.curriculum.buckets import Buckets, eval_buckets
from flywheel.curriculum.complexity import ComplexityScorer
from flywheel.curriculum.order import MODES


class CurriculumResource(dg.ConfigurableResource):
    """Stage-2 settings. `synthesize` and `order` are the ablation switches (Table 2: stage 1 = both off)."""

    synthesize: bool = True  # propose, solve and keep synthetic tasks
    order: str = "curriculum"  # "curriculum" (sorted by score) | "staged" (bucket by bucket) | "shuffle" (off)
    proposals_per_seed: float = 0.5  # proposals per seed trajectory ...
    max_proposals: int = 64  # ... at most this many per benchmark partition
    candidate_limit: int = 64  # concrete candidates the env offers the teacher
    scorer_weights: dict[str, float] = {"length": 1.0}  # complexity score = sum(weight * signal)
    other_signal: str = "locations"  # second signal recorded beside length: locations | subgoals
    train_bucket_edges: dict[str, list[float]] = {}  # per benchmark, score units; default: terciles
    eval_bucket_edges: dict[str, list[float]] = {}  # per benchmark, gold-length units; default: the spec's
    seed: int = 0

    def mode(self) -> str:
        if self.order not in MODES:
            raise dg.Failure(f"curriculum.order must be one of {', '.join(MODES)}, got {self.order!r}")
        return self.order

    def scorer(self) -> ComplexityScorer:
        try:
            return ComplexityScorer(dict(self.scorer_weights), self.other_signal)
        except ValueError as exc:
            raise dg.Failure(str(exc)) from None

    def n_proposals(self, n_seeds: int) -> int:
        return min(self.max_proposals, max(1, math.ceil(self.proposals_per_seed * n_seeds)))

    def train_edges(self, benchmark: str) -> list[float] | None:
        return self.train_bucket_edges.get(benchmark) or None

    def eval_buckets(self, spec: BenchmarkSpec) -> Buckets:
        return eval_buckets(spec, self.eval_bucket_edges.get(spec.name))
