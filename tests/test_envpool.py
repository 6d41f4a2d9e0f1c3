"""Several environment processes (kit/sandbox/envpool.py, `tool_workers`): world w in child w % k, a round's calls in
parallel across children and in order within a world; the same answers as one child.

Run: python -m pytest tests/test_envpool.py
"""

import json
import sys
from pathlib import Path

import pytest

from kit.sandbox.envhost import EnvHost
from kit.sandbox.envpool import EnvPool

sys.path.insert(0, str(Path(__file__).parent))  # scripted_envs, as the children import it


@pytest.fixture(scope="module")
def pool():
    pool = EnvPool("scripted_envs:Rendezvous", workers=2, timeout_s=90)
    yield pool
    pool.close()


def test_a_pool_answers_as_one_child_does(pool):
    one = EnvHost("scripted_envs:Rendezvous", timeout_s=90)
    try:
        rows = [{"id": str(i), "x": i} for i in range(5)]
        calls = [(w, "echo", {}) for w in (3, 0, 4, 1)] + [(2, "boom", {"why": "no"}), (0, "echo", {})]
        assert pool.reset(rows) == one.reset(rows)
        assert pool.call_many(calls) == one.call_many(calls)
        assert pool.rewards([0, 1, 2, 3, 4]) == one.rewards([0, 1, 2, 3, 4]) == [2.0, 1.0, 0.0, 1.0, 1.0]
        assert pool.view(4).row == {"id": "4", "x": 4} and pool.view(3).row == {"id": "3", "x": 3}
        assert sorted(pool.tools) == sorted(one.tools) and pool.has_reward
    finally:
        one.close()


def test_worlds_of_different_children_act_at_once_and_a_world_keeps_its_order(pool, tmp_path):
    pool.reset([{"id": str(i)} for i in range(4)])
    meet = str(tmp_path / "a")
    met, arrived = pool.call_many([(0, "wait", {"path": meet}), (1, "arrive", {"path": meet})])
    assert met == "met"  # world 0 waited while world 1 (the other child) arrived: one child would run them in turn
    pids = [pool.call_many([(w, "arrive", {"path": str(tmp_path / f"p{w}")})])[0].split()[-1] for w in range(4)]
    assert pids[0] == pids[2] != pids[1] == pids[3]  # world w in child w % 2
    # within a world the calls keep their order: world 2 arrives then waits on its own file, in one child
    answers = pool.call_many([(2, "arrive", {"path": str(tmp_path / "b")}), (2, "wait", {"path": str(tmp_path / "b"),
                                                                                       "seconds": 0})])
    assert answers[1] == "met"


def test_a_timeout_restarts_only_its_worlds_child(tmp_path):
    pool = EnvPool("scripted_envs:Recorder", workers=2, timeout_s=2)
    try:
        pool.reset([{"id": "a"}, {"id": "b"}])
        pool.call_many([(0, "echo", {}), (1, "echo", {})])
        slow, echo = pool.call_many([(1, "slow", {"seconds": 30}), (0, "echo", {})])
        assert "timed out" in json.loads(slow)["error"] and json.loads(echo) == {"id": "a"}
        assert pool.rewards([0, 1]) == [2.0, 0.0]  # world 0 kept its calls; world 1 was rebuilt and reset
        assert [h.restarts for h in pool.hosts] == [0, 1] and pool.restarts == 1
    finally:
        pool.close()
    assert all(h._proc is None for h in pool.hosts)  # every child closed


def test_each_worlds_shares_come_back_in_the_worlds_order():
    pool = EnvPool("scripted_envs:Shares", workers=2, timeout_s=30)
    try:
        pool.reset([{"id": str(w)} for w in range(3)])
        pool.call_many([(w, "set_shares", {"shares": json.dumps([w, 10 + w])}) for w in range(3)])
        assert pool.agent_rewards([2, 0, 1], ["left", "right"]) == [[2.0, 12.0], [0.0, 10.0], [1.0, 11.0]]
    finally:
        pool.close()


def test_a_pool_that_cannot_start_every_child_closes_the_ones_it_started(monkeypatch):
    import itertools

    from kit.sandbox import envhost

    built, closed, number = [], [], itertools.count()

    class Host:
        def __init__(self, spec, **_):
            if next(number) == 1:  # one of the two children fails to start
                raise envhost.EnvironmentClassError("the second child failed")
            built.append(self)

        def close(self):
            closed.append(self)

    monkeypatch.setattr(envhost, "EnvHost", Host)
    with pytest.raises(envhost.EnvironmentClassError, match="second child"):
        EnvPool("scripted_envs:Recorder", workers=2)
    assert closed == built and len(built) == 1


def test_a_run_with_tool_workers_reaches_the_pool(tmp_path):
    from kit.engine import tools
    from kit.run.config import ConfigError, load_config
    from kit.tasks.environments import key_rows

    with pytest.raises(ConfigError, match="tool_workers"):
        load_config("tiny_cpu", overrides=["tool_workers=0"])
    with pytest.raises(ConfigError, match="1 without an environment"):
        load_config("tiny_cpu", overrides=["tool_workers=2"])
    rows = key_rows(tmp_path / "rows.jsonl", 4)
    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={tmp_path / 'run'}", "task=rows", f"task_args={{file: {rows}, num_eval: 1, roles: [left, right]}}",
        "environment=kit.tasks.environments:KeyHalves", "tool_workers=2"])

    class Team:
        roles = ["left", "right"]

    sampler = tools.sampler_for(Team(), cfg, log=lambda *_: None)
    try:
        assert isinstance(sampler.host, EnvPool) and len(sampler.host.hosts) == 2
    finally:
        sampler.host.close()
