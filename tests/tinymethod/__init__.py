"""A method that exists only in the tests: the flywheel evaluated at K alone ("bpo-k-only").

Why: it proves that a method is a value, as tests/tinybench proves it for a benchmark. Nothing in
`flywheel/` names it; `register(METHOD)` adds it to `flywheel.orchestration.methods.METHODS`, and from there the
presets, the stage planner, the Dagster job of each stage and the paper's tables take it like any other.

What it is: BPO's stages (SFT, rollouts and the reward gate at every k) with one evaluation, of checkpoint K
(saving the evaluations of k < K), and a larger SFT batch. Its own plan is a plain function of the stage
plans in flywheel/orchestration/methods.py; its place in the paper: Table 2's per-k rows and Table 4's last row.
"""

from __future__ import annotations

from collections.abc import Callable

from flywheel.orchestration.methods import Method, PaperPlace, Stage, flywheel_plan

NAME = "bpo-k-only"


def k_only_plan(key: Callable[[int], str], iterations: int, evaluate_start: bool) -> list[Stage]:
    """BPO's stages without the evaluations of k < K."""
    return [s for s in flywheel_plan(key, iterations, evaluate_start)
            if not s[0].startswith("evaluation:") or s[0] == f"evaluation:{iterations}"]


METHOD = Method(NAME, "BPO, K evaluated", k_only_plan, implies={"policy": {"batch_size": 8}}, samples=True,
                paper=PaperPlace(ablation="+ stage 3 (K only)", ablation_per_k=True, comparison="BPO, K only",
                                 row=5))
