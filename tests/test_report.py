from flywheel.pipeline import paper_table
from flywheel.store import Store


def test_paper_table_layout_and_average(tmp_path):
    db = Store(tmp_path / "s.duckdb")
    for bench, split, v in [("alfworld", "seen", 0.5), ("alfworld", "unseen", 0.25), ("scienceworld", "seen", 1.0),
                            ("scienceworld", "unseen", 0.0), ("webshop", "seen", 0.4), ("webshop", "unseen", 0.4)]:
        db.write_evaluation({"benchmark": bench, "iteration": 0, "split": split, "checkpoint_id": "c",
                             "episodes": 4, "errored": 0, "success_rate": v, "avg_reward": v, "mean_steps": 1.0,
                             "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0, "invalid_action_rate": 0.0})
    db.write_evaluation({"benchmark": "scienceworld", "iteration": 1, "split": "seen", "checkpoint_id": "c",
                         "episodes": 4, "errored": 0, "success_rate": 0.75, "avg_reward": 0.8, "mean_steps": 1.0,
                         "tokens_per_step": 1.0, "prompt_tokens_per_step": 1.0, "invalid_action_rate": 0.0})
    table = paper_table(db).splitlines()
    assert table[0].startswith("| k | ALFWorld seen | ALFWorld unseen | ScienceWorld seen | ScienceWorld unseen | WebShop | average")
    assert table[2] == "| 0 | 50.0 | 25.0 | 100.0 | 0.0 | 40.0 | 43.0 |"
    assert table[3] == "| 1 | - | - | 75.0 | - | - | 75.0 (1/5 cols) |"
