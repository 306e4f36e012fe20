"""The promotion gate's rule (flywheel.core.quality.non_inferior): promote k unless the one-sided (1 - alpha)
lower bound of its paired success difference against the promoted predecessor is at or below -margin."""

from flywheel.core.quality import non_inferior


def outcomes(both: int, new_only: int, old_only: int, neither: int) -> tuple[dict[str, bool], dict[str, bool]]:
    """Paired outcomes over tasks: solved by both, by the new checkpoint only, by the old only, by neither."""
    pairs = [(True, True)] * both + [(True, False)] * new_only + [(False, True)] * old_only + [(False, False)] * neither
    return ({f"t{i}": a for i, (a, _) in enumerate(pairs)}, {f"t{i}": b for i, (_, b) in enumerate(pairs)})


def test_an_equal_checkpoint_is_promoted_and_a_much_worse_one_is_not():
    same = non_inferior(*outcomes(10, 0, 0, 40), margin=0.1, alpha=0.05)
    assert same["promote"] and same["n"] == 50 and same["delta"] == 0 and same["ci_low"] == 0
    worse = non_inferior(*outcomes(2, 0, 10, 38), margin=0.1, alpha=0.05)  # lost 10 of 50 tasks: -20 points
    assert not worse["promote"] and worse["delta"] == -0.2 and worse["ci_low"] < -0.1 and worse["lost"] == 10
    better = non_inferior(*outcomes(2, 10, 0, 38), margin=0.1, alpha=0.05)
    assert better["promote"] and better["ci_low"] > 0


def test_the_margin_decides_a_small_loss():
    new, old = outcomes(20, 0, 3, 77)  # 3 of 100 lost: -3 points, lower bound about -6.5
    assert non_inferior(new, old, margin=0.1, alpha=0.05)["promote"]
    assert not non_inferior(new, old, margin=0.02, alpha=0.05)["promote"]


def test_alpha_is_the_one_sided_level_of_the_lower_bound():
    new, old = outcomes(10, 2, 4, 34)  # -2 of 50: -4 points; lower bound -0.08 at alpha .25, -0.16 at .01
    loose, strict = (non_inferior(new, old, margin=0.1, alpha=a) for a in (0.25, 0.01))
    assert loose["promote"] and not strict["promote"]
    assert strict["ci_low"] < loose["ci_low"] <= loose["delta"] == strict["delta"]
    assert (loose["alpha"], loose["margin"]) == (0.25, 0.1)


def test_no_paired_task_is_no_promotion():
    assert not non_inferior({"a": True}, {"b": True}, margin=0.5, alpha=0.05)["promote"]
