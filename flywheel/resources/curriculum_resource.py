"""Stage 2 settings (synthesis and the easy->hard order) as a Dagster resource; the logic is in flywheel/curriculum."""

import math

import dagster as dg

from envs.base import BenchmarkSpec
from flywheel.core.options import Bound
from flywheel.curriculum.buckets import Buckets, eval_buckets
from flywheel.curriculum.complexity import ComplexityScorer
from flywheel.curriculum.order import MODES
from flywheel.resources.fields import check_fields, setting


class CurriculumResource(dg.ConfigurableResource):
    """Stage-2 settings. `synthesize` and `order` are the ablation switches (Table 2: stage 1 = both off)."""

    synthesize: bool = setting(True, help="stage 2: the teacher proposes, solves and keeps synthetic tasks")
    order: str = setting("curriculum", help='the SFT order: "curriculum" (sorted by complexity score), "staged" '
                         '(bucket by bucket) or "shuffle" (no curriculum)')
    proposals_per_seed: float = setting(0.5, help="synthetic task proposals per seed trajectory",
                                        bound=Bound(0, 100, integer=False))
    max_proposals: int = setting(64, help="synthetic task proposals per benchmark partition at most",
                                   bound=Bound(0, 100_000))
    candidate_limit: int = setting(64, help="concrete candidate tasks the env offers the teacher",
                                     bound=Bound(1, 100_000))
    scorer_weights: dict[str, float] = setting(default_factory=lambda: {"length": 1.0},
                                               help="complexity score = sum of weight x signal, by signal")
    other_signal: str = setting("locations", help="the second signal recorded beside length: locations or subgoals")
    train_bucket_edges: dict[str, list[float]] = setting(default_factory=dict, help="training buckets' edges per "
                                                         "benchmark, in score units (default: terciles)")
    eval_bucket_edges: dict[str, list[float]] = setting(default_factory=dict, help="evaluation buckets' edges per "
                                                        "benchmark, in gold-path steps (default: the spec's)")
    seed: int = setting(0, help="the proposals' seed", bound=Bound(0, 2**32 - 1))

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        check_fields(self, where="curriculum.")  # each number within its declared bound, at the run's first step

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
