"""The pooled interval over replicate runs (flywheel.core.quality.hierarchical_difference): its coverage on
synthetic experiments with a known run-level variance, the committed ScienceWorld runs' interval, and the
power arithmetic the report's design section rests on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flywheel.config.presets import RESULTS_DIR
from flywheel.core.quality import (
    discordance,
    hierarchical_difference,
    pooled_bootstrap,
    run_variance,
    runs_needed,
    t_interval,
    t_power,
    t_quantile,
    two_group_difference,
)


def simulated(rng, n: int, effect: float, runs: int, run_sd: float, ref_runs: int, ref_sd: float):
    """One simulated experiment: n tasks drawn anew (the reference's success probability 0.25-0.5, the task's
    own effect effect +- 0.1, shared by every run), `runs` runs and `ref_runs` reference runs, each shifted as a
    whole by N(0, run_sd) or N(0, ref_sd) (the run-level variance); outcomes Bernoulli. (new, old, effects)."""
    p = rng.uniform(0.25, 0.5, n)
    eff = rng.uniform(effect - 0.1, effect + 0.1, n)
    new = rng.random((runs, n)) < np.clip(p + eff + rng.normal(0, run_sd, (runs, 1)), 0, 1)
    old = rng.random((ref_runs, n)) < np.clip(p + rng.normal(0, ref_sd, (ref_runs, 1)), 0, 1)
    return new, old, eff


def coverage(runs: int, run_sd: float, *, experiments: int = 300, n: int = 100, effect: float = 0.07,
             seed: int = 0) -> tuple[float, float, float]:
    """Share of simulated experiments whose 95% interval holds the true effect: (hierarchical bootstrap,
    t-interval over runs, either). Each experiment: n tasks drawn anew (control success probability 0.25-0.5,
    the task's own effect effect +- 0.1), `runs` runs each paired with its own control, each run and each
    control shifted as a whole by N(0, run_sd): `simulated`."""
    rng = np.random.default_rng(seed)
    boot = t = either = 0
    for _ in range(experiments):
        new, old, _ = simulated(rng, n, effect, runs, run_sd, runs, run_sd)
        diffs = new.astype(float) - old
        lo, hi = pooled_bootstrap(diffs, n_boot=1000, rng=rng)
        ti = t_interval([float(x) for x in diffs.mean(axis=1)])
        in_boot, in_t = lo <= effect <= hi, ti["ci_low"] <= effect <= ti["ci_high"]
        boot, t, either = boot + in_boot, t + in_t, either + (in_boot or in_t)
    return boot / experiments, t / experiments, either / experiments


def test_the_pooled_intervals_cover_about_95_percent_of_simulated_experiments():
    """Run shifts of 4 points (standard deviation, each run and each control; about the size measured between
    the committed runs) and of 12, with 3 and with 10 runs, 300 simulated experiments each: the t-interval over
    the runs' differences covers the true effect in 94-97% of them (checked: 92-98%). The hierarchical bootstrap
    covers 98% at 4 points (it counts each run's task noise twice: in the runs' spread and in the task
    resample, so it errs wide) and 94% at 12 points with 10 runs. A claim's verdict asks both to exclude 0, so
    it holds at least the t-interval's coverage (checked: 95% or more)."""
    for runs, run_sd in ((3, 0.04), (10, 0.04), (10, 0.12)):
        boot, t, either = coverage(runs, run_sd)
        assert 0.92 <= t <= 0.98 and 0.93 <= boot and either >= 0.95, (runs, run_sd, boot, t, either)


def test_with_few_runs_and_a_large_run_variance_the_bootstrap_alone_is_too_narrow():
    """Run shifts of 12 points and 3 runs: resampling 3 runs cannot reach past their spread, so the bootstrap
    alone covers about 90% (under 92%); the t-interval (4.30 standard errors at 2 degrees of freedom) stays near
    95%. That is why a pooled claim excludes 0 only when both intervals do."""
    boot, t, either = coverage(3, 0.12)
    assert boot < 0.92 and 0.92 <= t <= 0.98 and either >= 0.95, (boot, t, either)


def two_group_coverage(runs: int, ref_runs: int, run_sd: float, ref_sd: float, *, experiments: int = 300,
                       n: int = 100, effect: float = -0.07, seed: int = 1) -> tuple[float, float, float]:
    """Share of simulated experiments whose 95% interval holds the true effect when two recipes are each run
    several times and no run is paired with one of the other's: (the two-group interval with both groups'
    runs resampled, its Welch t-interval, the one-group interval that pairs every run with the reference's
    first run, as a claim against a recipe run once does). Tasks and run shifts: `simulated`."""
    rng = np.random.default_rng(seed)
    both = welch = one_ref = 0
    for _ in range(experiments):
        new, old, eff = simulated(rng, n, effect, runs, run_sd, ref_runs, ref_sd)
        tasks = [f"t{i}" for i in range(n)]
        got = two_group_difference([dict(zip(tasks, row, strict=True)) for row in new],
                                   [dict(zip(tasks, row, strict=True)) for row in old],
                                   n_boot=1000, seed=int(rng.integers(1 << 30)))
        target = float(eff.mean())
        both += got["ci_low"] <= target <= got["ci_high"]
        welch += got["t_ci_low"] <= target <= got["t_ci_high"]
        one = t_interval([float(x) for x in (new.astype(float) - old[0]).mean(axis=1)])
        one_ref += one["ci_low"] <= target <= one["ci_high"]
    return both / experiments, welch / experiments, one_ref / experiments


def test_two_replicated_recipes_keep_both_run_variances_in_the_interval():
    """bpo's runs against RFT's, neither paired with the other (issue 55's claim against RFT): with RFT's run
    shifts as large as bpo's (5 points sd; 6 runs against 3), Welch's t over the two groups' run means covers
    the true difference in 95% of 300 simulated experiments and the two-group bootstrap in 97% (it counts each
    run's task noise twice, as `pooled_bootstrap` does: it errs wide; checked with other seeds and shifts:
    94-95% and 98%); pairing every run with one RFT run, as a claim against RFT run once must, leaves that
    run's shift out and covers 57% (52-65%)."""
    boot, welch, one_ref = two_group_coverage(6, 3, 0.05, 0.05)
    assert 0.92 <= welch <= 0.98 and boot >= 0.94 and one_ref < 0.8, (boot, welch, one_ref)


def test_the_two_group_difference_is_the_difference_of_means_and_needs_two_runs_a_side():
    a = [{"t1": True, "t2": False}, {"t1": True, "t2": True}]
    b = [{"t1": False, "t2": False}, {"t1": True, "t2": False}, {"t1": False, "t2": False, "t3": True}]
    got = two_group_difference(a, b, n_boot=200)
    assert got["n"] == 2 and got["runs"] == 2 and got["reference_runs"] == 3  # t3: not played by every run
    assert got["delta"] == pytest.approx(0.75 - 1 / 6) and got["per_run"] == pytest.approx([0.5 - 1 / 6, 1 - 1 / 6])
    with pytest.raises(ValueError, match="two runs a side"):
        two_group_difference(a, b[:1])


def _outcomes(arm: str, k: int) -> dict[str, bool]:
    data = json.loads((RESULTS_DIR / "cpu-comparison-scienceworld" / "arms" / f"{arm}.json").read_text())
    return {f"{split}/{t}": bool(v[0]) for split in ("seen", "unseen") for t, v in data["outcomes"][f"{k}|{split}"].items()}


def test_the_committed_scienceworld_runs_reproduce_the_issues_interval():
    """Issue 55: bpo at K=2 against the control, the three runs each paired (as the report then did) with
    `sft-control`: resampling runs, then tasks, gives [-3.0, +16.7] and a t-interval over the three run
    differences [-7.0, +20.3]. The bootstrap's quantiles move by a grid step (1/3 point) with the seed: within
    0.5 points. With each run paired with its own control (`bpo-r2`, `bpo-r3` with `sft-control-r2`, from
    their k=0), the per-run differences are +4, +1, +11 and the interval [-3.0, +15.0], t [-7.4, +18.1]."""
    bpo = [_outcomes(a, 2) for a in ("bpo", "bpo-r2", "bpo-r3")]
    as_reported = hierarchical_difference([(run, _outcomes("sft-control", 2)) for run in bpo])
    assert [round(100 * d) for d in as_reported["per_run"]] == [4, 3, 13]
    assert abs(100 * as_reported["ci_low"] - -3.0) <= 0.5 and abs(100 * as_reported["ci_high"] - 16.7) <= 0.5
    assert round(100 * as_reported["t_ci_low"], 1) == -7.0 and round(100 * as_reported["t_ci_high"], 1) == 20.3
    own = [_outcomes(a, 2) for a in ("sft-control", "sft-control-r2", "sft-control-r2")]
    paired = hierarchical_difference(list(zip(bpo, own, strict=True)))
    assert [round(100 * d) for d in paired["per_run"]] == [4, 1, 11]
    assert (round(100 * paired["ci_low"], 1), round(100 * paired["ci_high"], 1)) == (-3.0, 15.0)
    assert (round(100 * paired["t_ci_low"], 1), round(100 * paired["t_ci_high"], 1)) == (-7.4, 18.1)
    assert not paired["significant"]


def test_the_t_quantile_and_the_power_match_textbook_values():
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(0.975, 9) == pytest.approx(2.2622, abs=1e-4)
    # A paired t-test of 10 with effect = 1 standard deviation: power 0.803 (e.g. G*Power, R's power.t.test).
    assert t_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=1e-3)
    assert runs_needed(1.0, 1.0) == 10
    # +7 points at a run-difference sd of 5.1 points (the spread of the three committed runs) needs 7 runs.
    assert runs_needed(0.07, 0.051) == 7


def test_run_variance_takes_the_task_sample_out_of_two_runs_difference():
    """Two runs 10 points apart that disagree on 18 of 100 tasks (bpo-r2 and bpo-r3 at k=2): the task sample
    accounts for 0.17 / 100 of the squared difference's 0.01, the rest is twice the run variance: 6.4 points;
    two evaluations of the same weights 1 point apart on 3 discordant tasks leave none."""
    a = {f"t{i}": i < 42 for i in range(100)}
    b = {f"t{i}": (i < 38) or (52 <= i < 66) for i in range(100)}  # 4 lost, 14 gained
    d = discordance(b, a)
    assert (d["gained"], d["lost"], round(d["delta"], 2), round(d["discordant"], 2)) == (14, 4, 0.1, 0.18)
    assert round(100 * run_variance([d]) ** 0.5, 1) == 6.4
    same = discordance({f"t{i}": i < 34 for i in range(100)}, {f"t{i}": i < 33 or i == 50 or i == 51 for i in range(100)})
    assert run_variance([same]) == 0.0
