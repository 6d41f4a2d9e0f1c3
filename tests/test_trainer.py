"""The training loop, checkpoints, exact resume, rewards and the CLI on the tiny model.

Run: python -m pytest tests/test_trainer.py      (the learning test takes ~30 s)
"""

import json
import subprocess
import sys
import time

import pytest
import torch

from kit import checkpoint
from kit.config import load_config
from kit.rewards import parse_processor
from kit.tasks.toy import DigitSum
from kit.trainer import PERF_PREFIX, Trainer


def cfg_for(tmp_path, *overrides, name="run"):
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / name}", "progress=false", *overrides])


def adapter_weights(trainer):
    return {a: [p.detach().clone() for p in trainer.team.parameters_of(a)] for a in trainer.team.adapters}


def metric_rows(run_dir):
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [{k: v for k, v in r.items() if not k.startswith(PERF_PREFIX)} for r in rows]


@pytest.mark.slow
def test_tiny_cpu_learns_the_toy_task(tmp_path):
    """Fixed seed: greedy team reward goes from the random-digit level to >= 0.8 of the max in 200 steps."""
    start = time.time()
    trainer = Trainer(cfg_for(tmp_path, "log_rollouts=false"), log=lambda *_: None)
    summary = trainer.train()
    assert summary["eval_start"] < 0.5  # uniform random digits score ~0.42 (best constant answer: 0.45)
    assert summary["eval_end"] >= 0.8  # max 1.0
    assert summary["reward_end"] > summary["reward_start"] + 0.3
    assert time.time() - start < 120


def test_resume_is_exact(tmp_path):
    """k steps, stop, resume, k more == 2k steps in one go: bitwise weights, identical metrics."""
    common = ("num_steps=6", "save_every=3", "eval_every=3", "batch_size=4", "num_generations=4")
    straight = Trainer(cfg_for(tmp_path, *common, name="a"), log=lambda *_: None)
    straight.train()
    first = Trainer(cfg_for(tmp_path, *common, name="b"), log=lambda *_: None)
    first.train(max_steps=3)  # the disconnect
    resumed = Trainer(cfg_for(tmp_path, *common, name="b"), resume=True, log=lambda *_: None)
    assert resumed.step == 3
    resumed.train()
    wa, wb = adapter_weights(straight), adapter_weights(resumed)
    assert all(torch.equal(x, y) for a in wa for x, y in zip(wa[a], wb[a]))
    assert metric_rows(tmp_path / "a") == metric_rows(tmp_path / "b")
    ra = (tmp_path / "a" / "rollouts.jsonl").read_text()
    assert ra == (tmp_path / "b" / "rollouts.jsonl").read_text()


def test_resume_drops_log_lines_written_after_the_checkpoint(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=4", "save_every=2", "eval_every=0", "batch_size=2", "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train(max_steps=3)  # checkpoint at 2, step 3 logged, then lost
    resumed = Trainer(cfg, resume=True, log=lambda *_: None)
    assert [r["step"] for r in metric_rows(tmp_path / "run")] == [1, 2]
    resumed.train()
    assert [r["step"] for r in metric_rows(tmp_path / "run")] == [1, 2, 3, 4]


def test_incomplete_and_corrupt_checkpoints_are_skipped(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=3", "save_every=1", "keep_last=5", "eval_every=0", "batch_size=2",
                  "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train()
    root = tmp_path / "run" / "ckpt"
    (root / "step_000003" / "COMPLETE").unlink()  # crashed mid-save
    (root / "step_000002" / "optim.pt").write_bytes(b"truncated")  # a flaky Drive
    with pytest.warns(UserWarning) as record:
        resumed = Trainer(cfg, resume=True, log=lambda *_: None)
    messages = " ".join(str(w.message) for w in record)
    assert "incomplete" in messages and "unreadable" in messages
    assert resumed.step == 1


def test_keep_last_prunes_old_checkpoints(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=4", "save_every=1", "keep_last=2", "eval_every=0", "batch_size=2",
                  "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train()
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path / "run")] == ["step_000004", "step_000003"]


def test_saved_adapters_load_with_peft(tmp_path):
    from peft import PeftModel

    from kit.models import build_tiny_model

    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    base, _ = build_tiny_model(0)
    loaded = PeftModel.from_pretrained(base, tmp_path / "run" / "ckpt" / "step_000001" / "adapters" / "agent_1")
    mine = dict(trainer.team.models[0].named_parameters())
    for name, p in loaded.named_parameters():
        if "lora_" in name:
            assert torch.equal(p, mine[name.replace(".default.", ".agent_1.")])


def test_resume_with_a_changed_training_field_lists_the_fields(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train()
    changed = cfg_for(tmp_path, "num_steps=1", "eval_every=5", "batch_size=2", "num_generations=2",
                      "learning_rate=0.5", "seed=4")
    with pytest.raises(ValueError, match=r"learning_rate: 0.003 -> 0.5; seed: 0 -> 4"):
        Trainer(changed, resume=True, log=lambda *_: None)


def test_a_new_run_never_overwrites_an_existing_one(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train()
    with pytest.raises(FileExistsError, match="resume"):
        Trainer(cfg, log=lambda *_: None)


def test_the_run_directory_holds_config_metrics_and_rollouts(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=2", "eval_every=1", "batch_size=2", "num_generations=2")
    Trainer(cfg, log=lambda *_: None).train()
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["num_steps"] == 2
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    step = rows[-1]
    for key in ("reward/mean", "reward/std", "reward/format", "reward/sum", "loss/agent_0", "loss/agent_1",
                "grad_norm/agent_0", "lr", "perf/tokens_per_s", "perf/step_s", "eval/reward_mean"):
        assert key in step, key
    rollouts = [json.loads(line) for line in open(run / "rollouts.jsonl")]
    assert len(rollouts) == 2 * 2 * 2  # steps x items x G (aligned)
    assert set(rollouts[0]) >= {"step", "item", "turn", "prompts", "completions", "reward", "parts", "advantages"}


def test_multi_turn_grows_a_tree_and_logs_each_turn(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "num_turns=2", "eval_every=0", "batch_size=2", "num_generations=2")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    rollouts = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert sum(r["turn"] == 0 for r in rollouts) == 4 and sum(r["turn"] == 1 for r in rollouts) == 8
    turn1 = [r for r in rollouts if r["turn"] == 1]
    assert all(" had " in r["prompts"][0] for r in turn1)  # the task's feedback
    row = json.loads(open(tmp_path / "run" / "metrics.jsonl").read().splitlines()[-1])
    assert "reward/turn_0" in row and "reward/turn_1" in row


def test_cross_joint_mode_scores_g_to_the_n(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "joint_mode=cross", "eval_every=0", "batch_size=1", "num_generations=3")
    Trainer(cfg, log=lambda *_: None).train()
    assert len(open(tmp_path / "run" / "rollouts.jsonl").read().splitlines()) == 9


def test_shared_adapter_and_kl_train(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=2", "share_adapter=true", "beta=0.1", "eval_every=0", "batch_size=2",
                  "num_generations=2", "loss_type=token_mean", "micro_batch_size=3")
    trainer = Trainer(cfg, log=lambda *_: None)
    before = adapter_weights(trainer)
    trainer.train()
    row = json.loads(open(tmp_path / "run" / "metrics.jsonl").read().splitlines()[-1])
    assert "loss/shared" in row and row["kl/shared"] >= 0
    assert not torch.equal(before["shared"][1], adapter_weights(trainer)["shared"][1])


def length_bonus(item, completions):
    return float(len(completions[0]))


def test_plain_reward_functions_with_weights_are_logged_separately(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2",
                  "reward_weights=[1.0, 0.5]")
    Trainer(cfg, reward_funcs=[length_bonus], log=lambda *_: None).train()
    r = json.loads(open(tmp_path / "run" / "rollouts.jsonl").readline())
    assert r["parts"]["toy"] + 0.5 * r["parts"]["length_bonus"] == pytest.approx(r["reward"])
    assert r["parts"]["length_bonus"] == len(r["completions"][0])


def test_a_task_built_from_plain_functions_trains(tmp_path):
    from kit.tasks import from_functions

    items = [{"id": str(i), "n": i} for i in range(4)]
    task = from_functions(items, lambda it: [f"n {it['n']}", f"m {it['n']}"],
                          lambda it, comps: float(comps[0][:1] == comps[1][:1]))
    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2")
    Trainer(cfg, task=task, log=lambda *_: None).train()
    assert len(open(tmp_path / "run" / "rollouts.jsonl").read().splitlines()) == 4


def test_rewards_run_in_worker_processes(tmp_path):
    cfg = cfg_for(tmp_path, "num_steps=1", "eval_every=0", "batch_size=2", "num_generations=2",
                  "reward_workers=2", "reward_pool=process")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    trainer.close()
    assert len(open(tmp_path / "run" / "rollouts.jsonl").read().splitlines()) == 4


def test_reward_processors_compose_left_to_right():
    assert parse_processor("scale(2)|shift(1)|clamp(0, 4)")(3.0) == 4.0
    assert parse_processor("shift(-1)|sigmoid")(1.0) == 0.5
    assert parse_processor("identity")(0.3) == 0.3


def test_toy_reward_needs_both_agents():
    task = DigitSum()
    item = {"id": "x", "target": 7}
    assert task.reward(item, ("3", "4")).total == pytest.approx(1.0)
    assert task.reward(item, ("7", "x")).parts["sum"] == 0.0  # one agent alone earns no joint part
    assert task.reward(item, ("3", "3")).parts["sum"] == pytest.approx(0.8 * (1 - 1 / 6))


def test_cli_demo_runs_end_to_end(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kit", "train", "--preset", "tiny_cpu", "--run-dir",
                          str(tmp_path / "cli"), "--set", "num_steps=4", "--set", "eval_every=2",
                          "--set", "progress=false"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "train reward (sampled)" in out.stdout and "step_000004" in out.stdout


def test_cli_config_error_exits_2_with_the_message(tmp_path):
    out = subprocess.run([sys.executable, "-m", "kit", "train", "--preset", "tiny_cpu", "--set", "top_p=2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "top_p=2" in out.stderr and "(0, 1]" in out.stderr


def test_bad_task_args_name_the_task_and_its_arguments(tmp_path):
    cfg = cfg_for(tmp_path, "task_args={colour: red}")
    with pytest.raises(ValueError, match=r"task_args=\{'colour': 'red'\} do not fit task 'toy'"):
        Trainer(cfg, log=lambda *_: None)
