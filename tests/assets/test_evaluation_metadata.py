"""The `evaluation` asset's metadata floats: a rate over 0 episodes is left out, never a 0 Dagster would plot."""

from flywheel.assets.evaluation import rate_entries
from flywheel.curriculum.buckets import Buckets, success_by_bucket


def test_a_bucket_or_split_without_episodes_has_no_rate():
    buckets = Buckets((5, 10))  # easy <= 5 < medium <= 10 < hard
    by_bucket = success_by_bucket([(3, True), (4, False), (12, True)], buckets)  # no medium task
    medium = next(r for r in by_bucket if r["bucket"] == "medium")
    assert medium["episodes"] == 0 and medium["success_rate"] is None
    rows = [{"split": "seen", "episodes": 3, "success_rate": 2 / 3, "avg_reward": 0.5},
            {"split": "unseen", "episodes": 0, "success_rate": 0.0, "avg_reward": 0.0}]
    out = rate_entries(rows, [{"split": "seen", **r} for r in by_bucket])
    assert out["seen_easy_success_rate"] == 0.5 and out["seen_hard_success_rate"] == 1.0
    assert out["seen_medium_episodes"] == 0 and "seen_medium_success_rate" not in out
    assert (out["seen_successes"], out["seen_episodes"], out["unseen_episodes"]) == (2, 3, 0)
    assert out["seen_success_rate"] == 2 / 3 and "unseen_success_rate" not in out and "unseen_successes" not in out and "unseen_avg_reward" not in out
