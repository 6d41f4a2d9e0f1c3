"""algorithm=centralized (kit/engine/centralized.py): one policy writes every part; the task's reward scores the parts.

Run: python -m pytest tests/test_centralized.py      (seconds, the tiny model)
"""

import json

import pytest

from kit.engine.centralized import Centralized
from kit.run.config import ConfigError, load_config
from kit.tasks.toy import DigitSum
from kit.trainers.trainer import Trainer

QUIET = dict(log=lambda *_: None)


def test_the_wrapper_prompts_once_and_scores_the_split_parts():
    task = Centralized(DigitSum(num_agents=2))
    item = {"id": "sum7_0", "target": 7}
    assert task.num_agents == 1 and task.prompts(item) == ["all sum 7"]
    # "34" -> parts ("3", "4"): sum 7 = the target, the full reward 1.0; "3" alone -> ("3", ""): format 0.1 only
    assert task.reward(item, ("34",)).total == pytest.approx(1.0)
    assert task.reward(item, ("3",)).total == pytest.approx(0.1)
    assert task.feedback(item, ("34",), task.reward(item, ("34",))) == ["sum 7 a0 had 3 got 7\nsum 7 a1 had 4 got 7"]


def test_a_task_without_a_single_prompt_is_refused():
    from kit.tasks import from_functions

    with pytest.raises(ValueError, match="single_prompt"):
        Centralized(from_functions([{"id": "a"}], lambda it: ["x", "y"], lambda it, c: 0.0))


def test_centralized_trains_one_adapter_and_resumes_with_the_runs_config(tmp_path):
    common = [f"run_dir={tmp_path / 'r'}", "progress=false", "algorithm=centralized", "num_steps=2", "save_every=1",
              "eval_every=0", "batch_size=1", "num_generations=2", "log_rollouts=true"]
    trainer = Trainer(load_config("tiny_cpu", overrides=common), **QUIET)
    assert trainer.team.adapters == ["agent_0"] and trainer.cfg.num_agents == 1
    trainer.train(max_steps=1)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["num_agents"] == 2  # the run's N parts
    row = json.loads((tmp_path / "r" / "rollouts.jsonl").read_text().splitlines()[0])
    assert row["prompts"][0].startswith("all sum") and len(row["completions"]) == 1
    resumed = Trainer(load_config("tiny_cpu", overrides=common), resume=True, **QUIET)
    assert resumed.step == 1
    resumed.train()


def test_games_are_refused():
    with pytest.raises(ConfigError, match="algorithm"):
        load_config("tiny_hanabi", overrides=["algorithm=centralized"])
