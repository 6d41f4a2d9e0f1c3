"""A joint action the judge left unscored is not a bad one: its judge term gets no advantage either way.

Run: python -m pytest tests/test_judge_unscored.py
"""

import json

import numpy as np
import pytest

from kit.maths import magrpo
from kit.tasks.rewards import JudgeReward, Reward, RewardModel, impute_unscored
from kit.tasks import from_functions


class FakeJudge:
    """Scores by a marker in the text: `[s=0.8]` is 0.8, anything else is unscored (a failed call)."""

    enabled = True

    def score(self, rubric, text):
        if "[s=" not in text:
            return None
        return float(text.split("[s=")[1].split("]")[0])


def task_reward(item, completions):
    return Reward(1.0, {"task": 1.0})  # the same for every joint action: only the judge term differs


def test_unscored_judge_terms_take_the_scored_mean_of_their_group():
    task = from_functions([{"id": "a"}], lambda it: ["p", "q"], task_reward)
    model = RewardModel(task, [JudgeReward(FakeJudge(), "r")], weights=[1.0, 2.0])
    group = [model({"id": "a"}, (text, "x")) for text in ("[s=0.2]", "down", "[s=0.6]", "down")]
    assert [r.parts["judge_unscored"] for r in group] == [0.0, 1.0, 0.0, 1.0]
    assert [r.total for r in group] == pytest.approx([1.4, 1.0, 2.2, 1.0])  # raw: unscored counts 0
    filled = impute_unscored(group)
    assert [r.parts["judge"] for r in filled] == pytest.approx([0.2, 0.4, 0.6, 0.4])
    assert [r.total for r in filled] == pytest.approx([1.4, 1.8, 2.2, 1.8])  # 1 + 2 x 0.4
    adv = magrpo.advantages(np.array([[r.total for r in filled]]), "mean", False, None)[0]
    assert adv[1] == pytest.approx(0.0) and adv[3] == pytest.approx(0.0)  # no push either way
    assert adv[0] == pytest.approx(-0.4) and adv[2] == pytest.approx(0.4)  # the scored ones, among themselves


def test_a_group_with_nothing_scored_or_nothing_unscored_is_left_as_it_is():
    judge = JudgeReward(FakeJudge(), "r")
    none_scored = [RewardModel(None, [judge])({"id": "a"}, ("down", "x")) for _ in range(3)]
    assert [r.total for r in impute_unscored(none_scored)] == [0.0, 0.0, 0.0]
    all_scored = [RewardModel(None, [judge])({"id": "a"}, (f"[s=0.{i}]", "x")) for i in range(3)]
    assert impute_unscored(all_scored) == all_scored


def test_the_trainer_gives_unscored_joint_actions_no_judge_advantage(tmp_path):
    """Only the judge rewards (a constant task reward): an unscored joint action's advantage is exactly 0."""
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    class HalfJudge(FakeJudge):  # scores when agent 0 answered an even digit (about half the time)
        def score(self, rubric, text):
            first = text.split("\n")[1].strip()
            return 0.1 * int(first[0]) if first[:1].isdigit() and int(first[0]) % 2 == 0 else None

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "num_steps=1",
                                             "eval_every=0", "batch_size=4", "num_generations=4"])
    task = from_functions([{"id": f"i{k}", "target": k} for k in range(4)], lambda it: [f"a0 sum {it['target']}",
                                                                                    f"a1 sum {it['target']}"],
                          lambda it, comps: 0.0)
    trainer = Trainer(cfg, task=task, reward_funcs=[JudgeReward(HalfJudge(), "r")], log=lambda *_: None)
    trainer.train()
    trainer.close()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    unscored = [r for r in rows if r["parts"]["judge_unscored"] == 1.0]
    groups = {r["item"]: {x["parts"]["judge_unscored"] for x in rows if x["item"] == r["item"]} for r in rows}
    mixed = [r for r in unscored if groups[r["item"]] == {0.0, 1.0}]  # a group with scored ones beside it
    assert mixed, "the fixture should leave some joint actions unscored beside scored ones"
    assert all(a == pytest.approx(0.0) for r in mixed for a in r["advantages"])
    metrics = json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
    assert metrics["reward/judge_unscored"] == pytest.approx(len(unscored) / len(rows))
