"""A lost Ray node mid-rollout, on a real two-node local cluster (`ray.cluster_utils.Cluster`), real WebShop.

The worker node (and with it the env actors SPREAD put there) is removed from the driver while every
env slot is mid-episode: those episodes are replayed on an actor of the head node, every
(task, sample) is written exactly once, and the rows equal an undisturbed local-backend run.

The driver sees the lost actor at once (`ActorUnavailableError`), but the GCS declares the node dead only
~10 s later (its health checks). Plain SPREAD put the first replacement on the dead node in that window, and
it died too, so each lost episode cost two extra attempts and the pool two replacements. The pool now notes
the node of every lost actor and its replacements prefer other nodes (soft), so here one replacement, on
the head, replays every lost episode with a single extra attempt: the test allows only that
(`max_env_retries=1`), and checks that three actors were used, not four, and where the replacement ran.

Its own cluster, not test_ray_rollouts.py's `ray.init` fixture: a driver joins one cluster per session.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest

from envs import get_benchmark
from flywheel.policy.ray_session import RayOptions
from flywheel.rollout.engine import RolloutConfig
from tests.helpers import ExpertGenerator, expected_pairs, play, rows, tasks_of

ray = pytest.importorskip("ray", reason="the Ray backend needs the `ray` extra (make test installs it)")
from ray.cluster_utils import Cluster  # noqa: E402 - after the importorskip


@pytest.fixture(scope="module")
def two_nodes():
    """A head node (the driver's) and one worker node, one CPU each: two 0.5-CPU env actors SPREAD
    over both, and the head keeps room for a replacement once the worker node is gone."""
    ray.shutdown()  # never share a session with another module's cluster
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 150 * 2**20, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1, object_store_memory=150 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="flywheel-test", log_to_driver=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def _node_of(name: str) -> str:
    try:
        return ray.get(ray.get_actor(name).node_id.remote(), timeout=60)
    except Exception as exc:  # noqa: BLE001 - an actor on the dead node: say so, the test asserts on it
        return type(exc).__name__


def remove_node_at(cluster, worker, call: int):
    """`on_call` hook: at the given generate call, note where each env actor runs, then remove `worker`;
    at later calls, note where each actor started since (the replacements) runs."""
    placed: dict[str, str] = {}
    later: dict[str, str] = {}

    def on_call(n: int) -> None:
        names = sorted(a for a in ray.util.list_named_actors() if a.startswith("flywheel-env-"))
        if n == call and not placed:
            placed.update((name, _node_of(name)) for name in names)
            cluster.remove_node(worker, allow_graceful=False)  # a crash, not a drain
        elif placed:
            later.update((name, _node_of(name)) for name in names if name not in placed and name not in later)
    return on_call, placed, later


@pytest.mark.slow
def test_lost_node_replays_its_episodes_on_the_remaining_node(two_nodes, tmp_path, caplog):
    cluster, worker = two_nodes
    spec = get_benchmark("webshop")
    tasks = tasks_of("webshop", 3)
    jobs = [(t, s) for t in tasks for s in range(2)]
    # One extra attempt per lost episode: a replacement placed on the dead node (the old SPREAD-only
    # behaviour) would leave its episodes errored.
    opts = RayOptions(env_actor_cpus=0.5, envs_per_actor=2, max_actor_replacements=2)
    cfg = RolloutConfig(temperature=0.0, parallel_envs=4, max_steps=6, max_env_retries=1, backend="ray", ray=opts)
    on_call, placed, later = remove_node_at(cluster, worker, 1)  # every slot (2 actors x 2 envs) is mid-episode
    with caplog.at_level(logging.INFO, logger="flywheel.rollout.ray_pool"):
        db = play(tmp_path / "lost.duckdb", "webshop", jobs, ExpertGenerator(tasks, spec, on_call), cfg)

    on_worker = sorted(n for n, node in placed.items() if node == worker.node_id)
    on_head = sorted(n for n, node in placed.items() if node == cluster.head_node.node_id)
    assert on_worker and on_head and len(on_worker) + len(on_head) == len(placed) == 2, placed  # not vacuous
    messages = [r.getMessage() for r in caplog.records]
    lost = sorted(m.group(1) for m in (re.match(r"env actor (\S+) lost \(\w+\) on node (\w+)", x) for x in messages)
                  if m and m.group(2) == worker.node_id)
    assert lost == on_worker  # the worker node's actors were lost, on a node the pool knew
    assert sum(" lost (" in m for m in messages) == 1, messages  # and nothing else: no replacement died
    assert later == {n: cluster.head_node.node_id for n in later} and len(later) == 1, later  # one, on the head
    assert any(re.search(r"3 env actor\(s\) used \(1 lost\)", m) for m in messages), messages  # one replacement
    got = rows(db)
    assert sorted((r["task_id"], r["sample"]) for r in got[0]) == expected_pairs(jobs)  # once each
    assert all(r["status"] == "ok" for r in got[0])
    undisturbed = rows(play(tmp_path / "calm.duckdb", "webshop", jobs, ExpertGenerator(tasks, spec),
                            replace(cfg, backend="local")))
    assert got == undisturbed  # replayed from the start on the head node: no step twice, nothing lost
    assert not [n for n in ray.util.list_named_actors() if n.startswith("flywheel-env-")], "env actors left behind"
