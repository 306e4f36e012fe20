from collections.abc import Iterable
from typing import Literal

import dagster as dg

from flywheel.core.decisions import StopRules
from flywheel.core.options import Bound
from flywheel.core.settings import DEFAULT_ITERATIONS
from flywheel.core.validation import ConfigurationError, check_iterations_fit
from flywheel.orchestration.failures import setup_fails_once
from flywheel.resources.fields import check_fields, same_as, setting


class LoopResource(dg.ConfigurableResource):
    """Knobs of the living flywheel (sensor/schedule decisions, adaptive sampling, the gate's cap).

    `iterations` is K: the loop runs iterations 0..K per benchmark (K <= the profile's `iterations`, the
    iteration partitions' range, which it defaults to). It stops early when the gated dataset stops growing
    (`min_new_successes`) or seen-split success stops improving (`min_improvement`) for
    `patience` iterations in a row.
    """

    # Defaults to the profile's iterations (flywheel.profile.resources_from_sections); set lower, the loop stops there.
    iterations: int = same_as(StopRules, "iterations", default=DEFAULT_ITERATIONS)
    patience: int = same_as(StopRules, "patience")
    min_new_successes: int = same_as(StopRules, "min_new_successes")
    min_improvement: float = same_as(StopRules, "min_improvement")
    benchmarks: list[str] = setting(default_factory=list, help="the benchmarks the sensor and schedule drive "
                                    "(empty: every bootstrapped one)")
    adaptive_sampling: bool = setting(True, help="the samples_per_task x tasks attempts are shared out by what earlier "
                                      "iterations' rollouts say of each task (loop.sampling_rule); false: "
                                      "samples_per_task each")
    # "teaching" since issue 54: a task the policy always solves teaches little, one it never solved may be out of
    # reach; the ones it sometimes solves are where new successes come from. Committed presets pin their rule.
    sampling_rule: Literal["teaching", "hard_first"] = setting(
        "teaching", help='adaptive sampling\'s weights: "teaching" gives tasks sometimes solved more attempts, '
        'tasks always solved fewer, tasks never solved at most samples_per_task (flywheel.core.sampling.'
        'teaching_weights); "hard_first": the fewer successes, the more attempts (failure_weight)')
    min_samples_per_task: int = setting(1, help="adaptive sampling: attempts per task at least",
                                        bound=Bound(0, 1_024))
    max_samples_per_task: int | None = setting(None, help="adaptive sampling: attempts per task at most",
                                               bound=Bound(1, 1_024))
    history_decay: float = setting(1.0, help="weight of older iterations' task stats (1: plain sums)",
                                   bound=Bound(0, 1, integer=False, open_lo=True))
    max_gated_per_task: int | None = setting(None, help="gated successes per task over all iterations at most "
                                             "(null: no cap)", bound=Bound(1, 1_000_000))
    gate_drops_seed_repeats: bool = setting(True, help="the gate drops a success whose action sequence repeats a "
                                            "seed's for the same task (it adds no new behaviour); false keeps "
                                            "them, as plain RFT would")
    # On by default: cpu-webshop's gate admitted 17 of 49 steps at k=0 that the env had rejected (`click[B0`,
    # empty answers) and SFT k+1 imitated them. An invalid action changes no state, so the cleaned success
    # replays the same observations. cpu-scienceworld's arm `keep-invalid` measures it.
    gate_drops_invalid_steps: bool = setting(True, help="the gate strips the steps the env rejected from each "
                                             "success before SFT reads it (flywheel.core.gate."
                                             "without_invalid_steps); false: as played")
    # On by default since issue 54: successes were imitated with their wasted steps (71% `go to` on ALFWorld).
    clean_successes: bool = setting(True, help="the gate cuts each success's no-progress steps (returns to an "
                                    "observation seen before) and keeps the cut only if replaying it in the env "
                                    "wins the same way, then keeps each task's shortest successes "
                                    "(flywheel.core.cleaning); false: successes as played")
    continue_on_empty_gate: bool = setting(False, help="an empty reward gate stops the flywheel for that "
                                           "benchmark; true trains k+1 anyway on the same data (experiments "
                                           "that want all K iterations)")

    # The promotion gate (flywheel.assets.checks.check_promotion, on sft_checkpoint): after each k > 0 SFT,
    # checkpoint k and the promoted predecessor play envs.validation_tasks training tasks greedily; k is
    # promoted unless the paired difference may be below -margin (flywheel.core.quality.non_inferior).
    # Off in the presets whose committed arms ran without it, and for the rft and sft-control baselines.
    # The defaults (50 tasks, 10 points, 5%): two equal checkpoints that disagree on 6 of 50 tasks, 3 each way,
    # have a lower bound of -8 points and k is promoted; one that loses 4 of k-1's wins on ALFWorld-like 8%
    # success (-8 points, as cpu-alfworld's k=1 lost all of k=0's) has -14 and is rejected. Equal checkpoints
    # that disagree on 8 or more of the 50 are rejected too: more validation tasks buy that power.
    promotion_gate: bool = setting(True, sft0=False, help="after each k > 0 SFT, promote checkpoint k only if it is "
                                   "not worse than the promoted predecessor on the validation tasks "
                                   "(envs.validation_tasks) by more than promotion_margin; else the next iteration "
                                   "goes on from the predecessor")
    promotion_steers: bool = setting(True, sft0=False, help="true: after a rejection the loop goes on from the "
                                     "promoted predecessor; false: the gate only selects (the report's @promoted, "
                                     "the UI's check) and the loop goes on from k whatever the verdict, as the "
                                     "equal-compute control's checkpoints are chosen by the same rule without "
                                     "changing what it trains")
    promotion_margin: float = setting(0.1, sft0=False, help="the promotion gate's margin: how much lower a "
                                      "checkpoint's validation success may be than its predecessor's (0.1 = 10 points)",
                                      bound=Bound(0, 1, integer=False, open_lo=True))
    promotion_alpha: float = setting(0.05, sft0=False, help="the promotion gate's error rate: the chance of "
                                     "promoting a checkpoint worse by more than the margin (one-sided, paired "
                                     "bootstrap over the validation tasks)",
                                     bound=Bound(0, 0.25, integer=False, open_lo=True))

    def validate(self, max_partition: int | None = None, partitions: Iterable[str] | None = None) -> None:
        """`max_partition` / `partitions` (the highest iteration, the benchmark partitions) check K and
        `benchmarks` when known: the loop can only drive benchmarks that are partitions."""
        check_iterations_fit(self.iterations, max_partition=max_partition)
        if partitions is not None:
            known = sorted(partitions)
            for name in self.benchmarks:
                if name not in known:
                    raise ConfigurationError(
                        f"Unknown benchmark {name!r} in loop.benchmarks: the benchmark partitions are "
                        f"{', '.join(known)}. Fix the name, or add the benchmark to the profile's benchmarks.")
        check_fields(self, where="loop.")  # each field within its declared bound
        if self.max_samples_per_task is not None and self.max_samples_per_task < max(self.min_samples_per_task, 1):
            raise ConfigurationError(
                f"loop.max_samples_per_task ({self.max_samples_per_task}) must be >= max(1, min_samples_per_task): "
                "raise loop.max_samples_per_task or lower loop.min_samples_per_task")

    def stop_rules(self, max_partition: int | None = None, partitions: Iterable[str] | None = None) -> StopRules:
        """The stop rules; `max_partition` (the highest iteration partition) bounds K when known."""
        self.validate(max_partition, partitions)
        return StopRules(iterations=self.iterations, patience=self.patience,
                          min_new_successes=self.min_new_successes, min_improvement=self.min_improvement)

    @setup_fails_once  # a bad configuration fails the run once, not 1 + max_retries times
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self.validate()
