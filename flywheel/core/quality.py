"""Is policy k better than policy k-1? Success-rate differences with confidence intervals.

- `wilson_interval`: score interval of one proportion.
- `newcombe_difference`: Newcombe's hybrid score interval (method 10) for p1 - p0 from two
  Wilson intervals; good coverage for small n, never outside [-1, 1].
- `paired_bootstrap`: when both checkpoints played the *same* tasks (the seen split is fixed),
  resample tasks with replacement and take the percentile interval of the mean difference.
- `compare_iterations`: both, for evaluation(b, k) vs evaluation(b, k-1) on a split, read
  from the store. The primary interval is the paired one when every task pairs up.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flywheel.core.store import Store

Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact ends at 0 and n (the formula leaves a rounding error there).
    low = 0.0 if successes <= 0 else max(0.0, centre - half)
    high = 1.0 if successes >= n else min(1.0, centre + half)
    return low, high


def newcombe_difference(s1: int, n1: int, s0: int, n0: int, z: float = Z95) -> tuple[float, float, float]:
    """(p1 - p0, low, high) by Newcombe's method 10."""
    p1 = s1 / n1 if n1 else 0.0
    p0 = s0 / n0 if n0 else 0.0
    l1, u1 = wilson_interval(s1, n1, z)
    l0, u0 = wilson_interval(s0, n0, z)
    d = p1 - p0
    low = d - math.sqrt((p1 - l1) ** 2 + (u0 - p0) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p0 - l0) ** 2)
    return d, max(-1.0, low), min(1.0, high)


def paired_bootstrap(
    pairs: Sequence[tuple[float, float]], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(new - old), low, high) over tasks; `pairs` = (new_outcome, old_outcome) per task."""
    if not pairs:
        return 0.0, -1.0, 1.0
    diffs = [a - b for a, b in pairs]
    mean = sum(diffs) / len(diffs)
    rng = random.Random(seed)
    n = len(diffs)
    stats = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo_i = int(math.floor((1 - level) / 2 * n_boot))
    hi_i = min(n_boot - 1, int(math.ceil((1 + level) / 2 * n_boot)) - 1)
    return mean, stats[lo_i], stats[hi_i]


@dataclass
class Comparison:
    passed: bool
    verdict: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _outcomes(db: Store, benchmark: str, iteration: int, split: str) -> dict[str, bool]:
    return {task: ok for task, (ok, _reward) in db.policy_outcomes(benchmark, iteration, split).items()}


def compare_iterations(db: Store, benchmark: str, k: int, *, split: str = "seen", level: float = 0.95) -> Comparison:
    """Evaluation of checkpoint k vs k-1 on `split`. Fails (for a WARN check) only when k is
    significantly worse: the whole interval of the difference lies below 0."""
    if k == 0:
        return Comparison(True, "no previous checkpoint (k=0)", {"split": split, "previous": "none"})
    rows = {i: ev[split] for i in (k - 1, k) if split in (ev := db.evaluations_at(benchmark, i))}
    if k not in rows or (k - 1) not in rows:
        missing = [i for i in (k - 1, k) if i not in rows]
        return Comparison(True, f"evaluation missing for iteration(s) {missing}: nothing to compare",
                          {"split": split, "missing_iterations": str(missing)})
    new, old = rows[k], rows[k - 1]
    n1, n0 = int(new["episodes"]), int(old["episodes"])
    s1, s0 = round(new["success_rate"] * n1), round(old["success_rate"] * n0)
    z = Z95 if level == 0.95 else _z_for(level)
    d, lo, hi = newcombe_difference(s1, n1, s0, n0, z)
    meta: dict[str, Any] = {
        "split": split, "iteration": k, "previous_iteration": k - 1,
        "success_k": s1 / n1 if n1 else 0.0, "success_k_minus_1": s0 / n0 if n0 else 0.0,
        "episodes_k": n1, "episodes_k_minus_1": n0, "delta": d,
        "newcombe_ci_low": lo, "newcombe_ci_high": hi, "confidence": level,
    }
    method = "newcombe"
    a, b = _outcomes(db, benchmark, k, split), _outcomes(db, benchmark, k - 1, split)
    common = sorted(set(a) & set(b))
    if common and len(common) == len(a) == len(b):
        pd, plo, phi = paired_bootstrap([(float(a[t]), float(b[t])) for t in common], level=level)
        meta.update({"paired_tasks": len(common), "paired_delta": pd, "paired_ci_low": plo, "paired_ci_high": phi,
                     "tasks_gained": sum(a[t] and not b[t] for t in common),
                     "tasks_lost": sum(b[t] and not a[t] for t in common)})
        method, lo, hi = "paired_bootstrap", plo, phi
    meta.update({"method": method, "ci_low": lo, "ci_high": hi})
    if hi < 0:
        verdict = f"policy k={k} is significantly worse than k={k - 1} on {split} (delta {d:+.3f}, CI [{lo:+.3f}, {hi:+.3f}])"
    elif lo > 0:
        verdict = f"policy k={k} is significantly better than k={k - 1} on {split} (delta {d:+.3f}, CI [{lo:+.3f}, {hi:+.3f}])"
    else:
        verdict = f"no significant difference between k={k} and k={k - 1} on {split} (delta {d:+.3f}, CI [{lo:+.3f}, {hi:+.3f}])"
    meta["verdict"] = verdict
    return Comparison(hi >= 0, verdict, meta)


def _z_for(level: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf((1 + level) / 2)


def mcnemar_exact_p(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs (tasks gained vs lost)."""
    n = gained + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_difference(new: dict[str, bool], old: dict[str, bool], *, level: float = 0.95,
                      n_boot: int = 10000) -> dict[str, Any]:
    """SR(new) - SR(old) on the tasks both played: paired bootstrap interval, discordant counts,
    exact McNemar p. `new`/`old` map task -> success."""
    common = sorted(set(new) & set(old))
    pairs = [(float(new[t]), float(old[t])) for t in common]
    d, lo, hi = paired_bootstrap(pairs, n_boot=n_boot, level=level)
    gained = sum(new[t] and not old[t] for t in common)
    lost = sum(old[t] and not new[t] for t in common)
    return {"n": len(common), "delta": d, "ci_low": lo, "ci_high": hi, "gained": gained, "lost": lost,
            "mcnemar_p": mcnemar_exact_p(gained, lost), "method": "paired bootstrap over tasks",
            "significant": len(common) > 0 and (lo > 0 or hi < 0)}


def non_inferior(new: dict[str, bool], old: dict[str, bool], *, margin: float, alpha: float) -> dict[str, Any]:
    """The promotion gate's rule: `new` may replace `old` (task -> success, paired over the tasks both played)
    when the one-sided (1 - alpha) lower bound of SR(new) - SR(old) (the lower end of the two-sided 1 - 2 alpha
    paired bootstrap interval) is above -margin. A non-inferiority test: a checkpoint truly worse by more than
    `margin` is promoted with probability at most about `alpha`; an equal one needs enough tasks to pass.
    No paired task: not promoted."""
    diff = paired_difference(new, old, level=1 - 2 * alpha)
    return {**diff, "margin": margin, "alpha": alpha, "promote": diff["n"] > 0 and diff["ci_low"] > -margin}


def reward_difference(new: dict[str, float], old: dict[str, float]) -> dict[str, Any]:
    """Mean reward(new) - mean reward(old) over the tasks both played (task -> reward), with a paired bootstrap
    95% interval: the average-reward counterpart of `paired_difference` (WebShop's usual metric)."""
    common = sorted(set(new) & set(old))
    d, lo, hi = paired_bootstrap([(float(new[t]), float(old[t])) for t in common])
    return {"n": len(common), "delta": d, "ci_low": lo, "ci_high": hi}


# -- an arm's evaluated checkpoints (the paper's tables and the committed arm results) ----------
BOOT = 2000


def rate(successes: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_interval(successes, n)
    return {"n": n, "successes": successes, "rate": successes / n if n else None, "ci_low": lo, "ci_high": hi}


def bootstrap_ratio(nums: list[float], dens: list[float], *, seed: int = 0) -> dict[str, Any]:
    """sum(nums)/sum(dens) with a 95% percentile bootstrap over the items (episodes)."""
    n = len(nums)
    if not n or not sum(dens):
        return {"n": n, "value": None, "ci_low": None, "ci_high": None}
    value = sum(nums) / sum(dens)
    rng = random.Random(seed)
    stats = []
    for _ in range(BOOT):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(dens[i] for i in idx)
        if d:
            stats.append(sum(nums[i] for i in idx) / d)
    stats.sort()
    return {"n": n, "value": value, "ci_low": stats[int(0.025 * len(stats))],
            "ci_high": stats[min(len(stats) - 1, int(0.975 * len(stats)))]}


def arm_checkpoints(db: Store, benchmark: str) -> dict[int, dict[str, Any]]:
    """Per evaluated k: per split success (Wilson), mean reward and tokens/step (bootstrap), per-task outcomes."""
    out: dict[int, dict[str, Any]] = {}
    for row in db.evaluation_rows(benchmark):
        k, split = int(row["iteration"]), row["split"]
        outcomes = db.policy_outcomes(benchmark, k, split)
        eps = db.step_tokens(benchmark, k, split)
        rewards = [r for _, r in outcomes.values()]
        steps = [float(e["steps"]) for e in eps]
        entry = out.setdefault(k, {"k": k, "splits": {}, "checkpoint_id": row["checkpoint_id"]})
        entry["splits"][split] = {
            "success": rate(sum(ok for ok, _ in outcomes.values()), len(outcomes)),
            "reward": bootstrap_ratio(rewards, [1.0] * len(rewards)),
            "prompt_tokens_per_step": bootstrap_ratio([float(e["prompt_tokens"]) for e in eps], steps),
            "tokens_per_step": bootstrap_ratio([float(e["prompt_tokens"] + e["completion_tokens"]) for e in eps], steps),
            "mean_steps": bootstrap_ratio(steps, [1.0] * len(steps)),
            "outcomes": {t: ok for t, (ok, _) in outcomes.items()},
        }
        entry["buckets"] = db.eval_buckets_of(benchmark, k)
    return out


# -- pooling replicate runs: runs first, then tasks; and the power of a design ---------------------
# A run's success rate moves with its rollouts' samples and its k=0 training as a whole, not task by task,
# so a pooled interval must resample runs (each paired with its own reference: its own k=0 or its own
# control), then tasks. Every run plays the same tasks, so one resample of the tasks serves every drawn run
# in a bootstrap round: a task that every run gains (or loses) counts once per round, as it would in a new
# evaluation set, instead of averaging out over the runs.
POOL_BOOT = 10000
HIERARCHICAL = ("hierarchical bootstrap: runs with replacement, then the tasks with replacement (one resample "
                "shared by the drawn runs, which play the same tasks); 10,000 resamples")


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (Simpson's rule on the density; |error| < 1e-9)."""
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    steps = 2000
    h = x / steps
    total = sum((1 if i in (0, steps) else 4 if i % 2 else 2) * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2)
                for i in range(steps + 1))
    return 0.5 + c * total * h / 3


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """The t value with P(T <= t) = p (bisection on `t_cdf`); t_quantile(0.975, 2) = 4.303."""
    lo, hi = -1000.0, 1000.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Mean of per-run differences with a t-interval (R - 1 degrees of freedom): each run's difference
    already carries its own task sample, so the spread of the R values carries both variances."""
    r = len(values)
    mean = sum(values) / r if r else 0.0
    if r < 2:
        return {"runs": r, "mean": mean, "sd": None, "ci_low": None, "ci_high": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (r - 1))
    half = t_quantile((1 + level) / 2, r - 1) * sd / math.sqrt(r)
    return {"runs": r, "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half}


def pooled_bootstrap(diffs: Any, *, level: float = 0.95, n_boot: int = POOL_BOOT, rng: Any) -> tuple[float, float]:
    """Percentile interval of the mean over runs of `diffs` (an R x n array: run r's paired difference on task t)
    by the hierarchical bootstrap: per round, R runs drawn with replacement and one multinomial resample of the
    n tasks applied to each of them. It errs wide where the task noise is large against the run-to-run variance
    (each run's task noise counts in the spread of the run means and again in the task resample) and narrow with
    few runs and a large run-to-run variance (3 runs cannot show more spread than they have):
    tests/core/test_pooled_intervals.py measures both."""
    import numpy as np  # only the pooled bootstrap needs numpy

    r, n = diffs.shape
    weights = rng.multinomial(n, np.full(n, 1 / n), size=n_boot)  # how often each task is drawn, per round
    means = weights @ diffs.T / n  # (n_boot, R): each run's mean over that round's tasks
    picks = rng.integers(r, size=(n_boot, r))
    return percentile_interval(np.take_along_axis(means, picks, axis=1).mean(axis=1), level)


def percentile_interval(stats: Any, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap statistics `stats` (one per resample)."""
    import numpy as np

    stats = np.sort(stats)
    n_boot = len(stats)
    lo = float(stats[int(math.floor((1 - level) / 2 * n_boot))])
    hi = float(stats[min(n_boot - 1, int(math.ceil((1 + level) / 2 * n_boot)) - 1)])
    return lo, hi


def hierarchical_difference(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], *, level: float = 0.95,
                            n_boot: int = POOL_BOOT, seed: int = 0) -> dict[str, Any]:
    """Pooled difference over R runs, each a (run, its own reference) pair of task -> outcome maps (success as
    bool, or reward), on the tasks every pair played: the mean of the per-run paired differences, with a
    percentile interval from the hierarchical bootstrap (`pooled_bootstrap`) and, beside it, a t-interval over
    the R per-run differences. The t-interval covers about 95% in the tests' simulated experiments; the
    bootstrap errs wide or, with 3 runs and a large run-to-run variance, narrow (`pooled_bootstrap`), so
    `significant` asks both intervals to exclude 0."""
    import numpy as np

    pairs = [(new, old) for new, old in pairs if set(new) & set(old)]
    common = sorted(set.intersection(*(set(new) & set(old) for new, old in pairs))) if pairs else []
    r = len(pairs) if common else 0
    diffs = np.array([[float(new[t]) - float(old[t]) for t in common] for new, old in pairs[:r]], dtype=float)
    deltas = [float(x) for x in diffs.mean(axis=1)] if r else []
    t = t_interval(deltas, level)
    out: dict[str, Any] = {"runs": r, "n": len(common), "per_run": deltas, "delta": t["mean"], "sd": t["sd"],
                           "spread": (max(deltas) - min(deltas)) if deltas else None,
                           "t_ci_low": t["ci_low"], "t_ci_high": t["ci_high"], "method": HIERARCHICAL}
    if not r:
        return {**out, "ci_low": -1.0, "ci_high": 1.0, "significant": False}
    lo, hi = pooled_bootstrap(diffs, level=level, n_boot=n_boot, rng=np.random.default_rng(seed))
    both = r > 1 and (lo > 0 or hi < 0) and (t["ci_low"] > 0 or t["ci_high"] < 0)
    return {**out, "ci_low": lo, "ci_high": hi, "significant": both}


TWO_GROUPS = ("hierarchical bootstrap over two groups of runs: each side's runs with replacement, then the "
              "tasks with replacement (one resample shared by every drawn run); 10,000 resamples")


def two_group_difference(news: Sequence[dict[str, Any]], olds: Sequence[dict[str, Any]], *, level: float = 0.95,
                         n_boot: int = POOL_BOOT, seed: int = 0) -> dict[str, Any]:
    """Pooled difference between two stochastic recipes, each run several times, whose runs are not paired
    with each other (no run of one is the other's control): the mean success of the `news` runs minus the
    mean of the `olds` runs, on the tasks every run played, with both recipes' run-to-run variance in the
    interval. Bootstrap: per round, each side's runs drawn with replacement and one resample of the tasks
    applied to all of them; beside it, Welch's t-interval over the two sides' run means
    (Welch-Satterthwaite degrees of freedom). `per_run` is each `news` run's mean minus the `olds` mean.
    Needs at least two runs a side (with one, `hierarchical_difference` against it)."""
    import numpy as np

    news = [n for n in news if n]
    olds = [o for o in olds if o]
    tasks = [set(run) for run in (*news, *olds)]
    common = sorted(set.intersection(*tasks)) if tasks else []
    if len(news) < 2 or len(olds) < 2 or not common:
        raise ValueError(f"two_group_difference needs two runs a side on shared tasks (got {len(news)} and "
                         f"{len(olds)} runs, {len(common)} shared tasks)")
    a = np.array([[float(run[t]) for t in common] for run in news])
    b = np.array([[float(run[t]) for t in common] for run in olds])
    ma, mb = a.mean(axis=1), b.mean(axis=1)
    delta = float(ma.mean() - mb.mean())
    va, vb = ma.var(ddof=1) / len(ma), mb.var(ddof=1) / len(mb)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(ma) - 1) + vb ** 2 / (len(mb) - 1)) if se > 0 else float(len(ma) + len(mb) - 2)
    half = t_quantile((1 + level) / 2, max(1, math.floor(df))) * se  # df floored: a little wider, and cached
    rng = np.random.default_rng(seed)
    n = len(common)
    weights = rng.multinomial(n, np.full(n, 1 / n), size=n_boot)
    means_a, means_b = weights @ a.T / n, weights @ b.T / n  # (n_boot, R): each run's mean on that round's tasks
    pick_a = rng.integers(len(ma), size=(n_boot, len(ma)))
    pick_b = rng.integers(len(mb), size=(n_boot, len(mb)))
    lo, hi = percentile_interval(np.take_along_axis(means_a, pick_a, axis=1).mean(axis=1)
                                 - np.take_along_axis(means_b, pick_b, axis=1).mean(axis=1), level)
    per_run = [float(x - mb.mean()) for x in ma]
    both = (lo > 0 or hi < 0) and (delta - half > 0 or delta + half < 0)
    return {"runs": len(ma), "reference_runs": len(mb), "n": n, "per_run": per_run,
            "reference_per_run": [float(x) for x in mb], "delta": delta, "sd": float(ma.std(ddof=1)),
            "reference_sd": float(mb.std(ddof=1)), "spread": max(per_run) - min(per_run),
            "t_ci_low": delta - half, "t_ci_high": delta + half, "df": df, "method": TWO_GROUPS,
            "ci_low": lo, "ci_high": hi, "significant": both}


def t_power(effect: float, sd: float, runs: int, level: float = 0.95) -> float:
    """Power of the two-sided t-test over `runs` per-run differences of standard deviation `sd` to detect a true
    mean difference `effect`: P(|T| > t_crit) with T noncentral t (R - 1 df, noncentrality effect / (sd /
    sqrt(R))), integrated over the chi-square of the sample variance. One run (no spread to test with): the
    z-test at a known `sd`."""
    from statistics import NormalDist

    z = NormalDist()
    ncp = effect / sd * math.sqrt(runs)
    if runs < 2:
        crit = z.inv_cdf((1 + level) / 2)
        return 1 - z.cdf(crit - ncp) + z.cdf(-crit - ncp)
    df = runs - 1
    crit = t_quantile((1 + level) / 2, df)
    # E over V ~ chi2(df) of P(|Z + ncp| > crit * sqrt(V / df)); Simpson's rule on V's density
    top, steps = df + 12 * math.sqrt(2 * df) + 30, 4000
    h = top / steps
    total = 0.0
    for i in range(1, steps + 1):
        v = i * h
        dens = math.exp((df / 2 - 1) * math.log(v) - v / 2 - (df / 2) * math.log(2) - math.lgamma(df / 2))
        c = crit * math.sqrt(v / df)
        w = 1 if i == steps else 4 if i % 2 else 2
        total += w * dens * (1 - z.cdf(c - ncp) + z.cdf(-c - ncp))
    return min(1.0, total * h / 3)


def runs_needed(effect: float, sd: float, *, power: float = 0.8, level: float = 0.95, most: int = 200) -> int | None:
    """The fewest runs per arm (each paired with its own control) whose t-test detects `effect` with `power`;
    None when more than `most` would be needed."""
    for runs in range(2, most + 1):
        if t_power(effect, sd, runs, level) >= power:
            return runs
    return None


def discordance(a: dict[str, bool], b: dict[str, bool]) -> dict[str, Any]:
    """Two evaluations over the tasks both played: the rate difference, the share of tasks they disagree on, and
    the per-task variance of the paired difference (discordant share - difference^2), whose /n is the task
    sample's part of the difference's variance."""
    common = sorted(set(a) & set(b))
    n = len(common)
    gained = sum(a[t] and not b[t] for t in common)
    lost = sum(b[t] and not a[t] for t in common)
    d = (gained - lost) / n if n else 0.0
    share = (gained + lost) / n if n else 0.0
    return {"n": n, "delta": d, "gained": gained, "lost": lost, "discordant": share,
            "task_variance": share - d * d, "mcnemar_p": mcnemar_exact_p(gained, lost)}


def run_variance(pairs: Sequence[dict[str, Any]]) -> float:
    """Between-run variance of one arm's success rate (a fraction^2) from pairs of its runs (each a `discordance`
    of two runs from the same k=0 weights): E[(rate_a - rate_b)^2] = 2 s_run^2 + task_variance / n, so
    s_run^2 = (mean d^2 - mean task_variance / n) / 2, floored at 0. The part that more tasks do not shrink."""
    if not pairs:
        return 0.0
    excess = sum(p["delta"] ** 2 - p["task_variance"] / p["n"] for p in pairs) / len(pairs)
    return max(0.0, excess / 2)
