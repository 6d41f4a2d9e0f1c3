"""MADPO on the tiny model (kit/trainers/preference_trainer.py): the preference fields reach the pairs and the loss (checked
against an independent computation from the model's full logits), the pair buffer is reused between refreshes and
resumes exactly, and the CLI trains it.

Run: python -m pytest tests/test_preference_trainer.py      (about 20 s)
"""

import json
import math

import pytest
import torch

from kit.__main__ import main as cli
from kit.run.checkpoint import seed_everything
from kit.run.config import ConfigError, load_config
from kit.trainers.preference_trainer import MADPOTrainer
from kit.tasks import from_functions
from test_config_reaches_maths import Scripted, joint_reward, model_logprobs

QUIET = dict(log=lambda *_: None)


def config(tmp_path, *overrides, name="run"):
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / name}", "progress=false", "eval_every=0",
                                              "algorithm=madpo", *overrides])


# ---- pairs: a scripted sampler, rewards known by hand

PAIRS = [  # overrides, (winner, loser) pairs of the one item. Sample k of every agent is "k": R = [0, 3, 15, 6]
    (("preference_num_candidates=4", "preference_pairs_per_sample=null"),  # gaps 15, 12, 9, 6, 3, 3
     [(2, 0), (2, 1), (2, 3), (3, 0), (1, 0), (3, 1)]),
    (("preference_num_candidates=4", "preference_pairs_per_sample=2"), [(2, 0), (2, 1)]),
    (("preference_num_candidates=4", "pair_selection=all", "preference_pairs_per_sample=2"), [(1, 0), (2, 0)]),
    (("preference_num_candidates=3", "preference_pairs_per_sample=null"), [(2, 0), (2, 1), (1, 0)]),  # R = [0, 3, 15]
]


@pytest.mark.parametrize("overrides, expected", PAIRS)
def test_pair_fields_choose_the_buffers_pairs(tmp_path, overrides, expected):
    task = from_functions([{"id": "a"}], lambda it: ["x", "y"], joint_reward)
    trainer = MADPOTrainer(config(tmp_path, "batch_size=1", *overrides), task=task, sampler=Scripted(), **QUIET)
    buf = trainer.candidates(trainer.batch_items(0), [0], reference=False)
    assert [(w, l) for _, w, l in buf.pairs] == expected


# ---- the loss: one update of the tiny model, against the model's own full logits

def sampled(tmp_path, *overrides):
    """A MADPO trainer whose adapters differ from the base and from each other, and the buffer of step 0."""
    trainer = MADPOTrainer(config(tmp_path, "batch_size=2", "preference_num_candidates=4", "max_new_tokens=3",
                                  "preference_pairs_per_sample=null", *overrides), **QUIET)
    gen = torch.Generator().manual_seed(0)
    for name, p in trainer.team.models[0].named_parameters():
        if "lora_B" in name:  # zero at init: every adapter would be the base
            p.data.normal_(0.0, 0.05, generator=gen)
    seed_everything(0)
    levels = trainer.sample(trainer.batch_items(0))
    return trainer, levels


def seq(model, seg) -> torch.Tensor:
    """(R,) float64 sum of the completion tokens' log-probs at temperature 1, EOS included."""
    return (model_logprobs(model, seg, 1.0) * seg.completion_mask).sum(-1)


def hand_deltas(trainer, reference: bool, live: str | None = None) -> torch.Tensor:
    """(P, N) Delta of every pair and agent from full logits; `live`: that adapter's with gradient."""
    team, buf = trainer.team, trainer.buffer
    N, K = trainer.cfg.num_agents, trainer.cfg.preference_num_candidates
    seg = buf.level.rollout.segment(0)
    row = {int(s): r for r, s in enumerate(seg.sample)}
    out = []
    for a in range(N):
        model = team.model_of(a)
        model.set_adapter(team.adapter_of[a])
        with torch.set_grad_enabled(team.adapter_of[a] == live):
            policy = seq(model, seg)
        with torch.no_grad(), model.disable_adapter():
            base = seq(model, seg)
        d = []
        for n, w, l in buf.pairs:
            rw, rl = row[(n * N + a) * K + w], row[(n * N + a) * K + l]
            d.append(policy[rw] - policy[rl] - ((base[rw] - base[rl]) if reference else 0.0))
        out.append(torch.stack(d))
    return torch.stack(out, 1)


# temperature 0.5: the candidates are sampled at it, but DPO's log-probs (policy and reference) are the model's own,
# at temperature 1 (kit/trainers/preference_trainer.py), whatever score_at_sampling_temperature says (MAGRPO's field)
@pytest.mark.parametrize("beta, reference, temperature", [(0.1, "base", 1.0), (1.0, "base", 1.0), (1.0, "none", 1.0),
                                                          (1.0, "base", 0.5)])
def test_the_dpo_loss_and_its_fields(tmp_path, beta, reference, temperature):
    trainer, levels = sampled(tmp_path, f"dpo_beta={beta}", f"dpo_reference={reference}",
                              f"temperature={temperature}", "score_at_sampling_temperature=true")
    z = hand_deltas(trainer, reference == "base").sum(1).tolist()
    assert len(z) >= 4 and max(abs(x) for x in z) > 1e-3  # pairs, and adapters away from the base
    loss = sum(math.log1p(math.exp(-beta * x)) for x in z) / len(z)  # -log sigmoid(y) = log(1 + e^-y)
    stats = trainer.update(levels)
    for adapter in trainer.team.adapters:
        assert stats[f"loss/{adapter}"] == pytest.approx(loss, rel=1e-4), adapter  # float32 against float64
    assert stats["dpo/loss"] == pytest.approx(loss, rel=1e-4)
    assert stats["dpo/accuracy"] == sum(x > 0 for x in z) / len(z)
    assert stats["dpo/num_pairs"] == len(z)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("micro, temperature", [(0, 1.0), (2, 1.0), (0, 0.5)])
def test_each_agent_is_stepped_on_the_gradient_of_its_own_delta(tmp_path, micro, temperature):
    """agent_0's gradient is that of mean -log sigmoid(beta (Delta_0 + Delta_1)) with Delta_1 held fixed, the pairs
    micro-batched (2 rows: one pair at a time) or not; the log-probs at temperature 1 whatever the sampling's."""
    trainer, levels = sampled(tmp_path, "dpo_beta=1.0", f"micro_batch_size={micro}", f"temperature={temperature}")
    params = trainer.team.parameters_of("agent_0")
    d = hand_deltas(trainer, True, live="agent_0")
    trainer.team.models[0].set_adapter("agent_0")  # PEFT: only the active adapter's weights require grad
    hand = torch.autograd.grad(-torch.nn.functional.logsigmoid(d[:, 0] + d[:, 1].detach()).mean(), params)
    opt, seen = trainer.optimizers["agent_0"], {}

    def step(real=opt.step):
        seen["grads"] = [p.grad.clone() for p in params]
        return real()

    opt.step = step
    trainer.cfg.max_grad_norm = 0.0  # the raw gradient
    trainer.update(levels)
    assert max(float(g.abs().max()) for g in hand) > 1e-4
    for got, want in zip(seen["grads"], hand):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-7)


# ---- the loop: refresh, resume, CLI

def weights(trainer):
    return {a: [p.detach().clone() for p in trainer.team.parameters_of(a)] for a in trainer.team.adapters}


def rows(run, name):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")} for line in open(run / name)]


def test_the_buffer_is_reused_between_refreshes_and_resumes_exactly(tmp_path):
    """refresh every 3, checkpoint at 2: step 2 trains on step 0's pairs, read back from the checkpoint."""
    common = ("num_steps=4", "save_every=2", "preference_refresh_every=3", "batch_size=2", "eval_every=2")
    straight = MADPOTrainer(config(tmp_path, *common, name="a"), **QUIET)
    straight.train()
    first = MADPOTrainer(config(tmp_path, *common, name="b"), **QUIET)
    first.train(max_steps=2)
    resumed = MADPOTrainer(config(tmp_path, *common, name="b"), resume=True, **QUIET)
    assert resumed.step == 2 and resumed.buffer.step == 0
    resumed.train()
    wa, wb = weights(straight), weights(resumed)
    assert all(torch.equal(x, y) for a in wa for x, y in zip(wa[a], wb[a]))
    ma, mb = rows(tmp_path / "a", "metrics.jsonl"), rows(tmp_path / "b", "metrics.jsonl")
    assert ma == mb
    assert [r.get("preference/fresh") for r in ma if "dpo/loss" in r] == [1, 0, 0, 1]
    logged = {r["step"] for r in rows(tmp_path / "a", "rollouts.jsonl")}
    assert logged == {1, 4}  # the candidates once, with the step that sampled them
    assert (tmp_path / "a" / "rollouts.jsonl").read_text() == (tmp_path / "b" / "rollouts.jsonl").read_text()


def test_bad_preference_values_fail_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="preference_num_candidates=1 .*>= 2"):
        config(tmp_path, "preference_num_candidates=1")
    with pytest.raises(ConfigError, match="pair_selection='best'.*reward_gap, all, random"):
        config(tmp_path, "pair_selection=best")
    with pytest.raises(ConfigError, match="judge_model"):
        config(tmp_path, "preference_source=judge")
    with pytest.raises(ConfigError, match="num_turns=2"):
        config(tmp_path, "num_turns=2")


def test_cli_trains_madpo(tmp_path, capsys):
    run = tmp_path / "cli"
    assert cli(["train", "--preset", "tiny_cpu", "--set", "algorithm=madpo", "--set", "num_steps=2", "--set",
                "batch_size=2", "--set", f"run_dir={run}", "--set", "progress=false", "--set", "eval_every=0"]) == 0
    assert "dpo/loss" in rows(run, "metrics.jsonl")[-1]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["madpo", "marlhf"])
def test_two_processes_train_as_one(tmp_path, algorithm):
    """2 CPU processes (torchrun, gloo) against 1: the same candidates and rollouts, metrics and adapters to the
    tolerances tests/test_distributed.py explains (float rounding on step 1, Adam on ~1e-8 gradients after it)."""
    from kit.trainers.game_trainer import trainer_class
    from test_distributed import adapters, assert_close_weights, assert_same_metrics, launch

    common = ["batch_size=4", "num_generations=2", "preference_num_candidates=3", "eval_every=0", "save_every=2",
              "num_steps=2", "progress=false", f"algorithm={algorithm}", "preference_refresh_every=2",
              "reward_num_items=4", "reward_num_train_epochs=1", "top_p=1.0"]  # top_p: see test_distributed's ARGS
    one, two = tmp_path / "one", tmp_path / "two"
    trainer_class("toy", algorithm)(load_config("tiny_cpu", overrides=[*common, f"run_dir={one}"]), **QUIET).train()
    launch(2, "--preset", "tiny_cpu", "--run-dir", str(two), *[x for c in common for x in ("--set", c)])
    for x, y in zip(rows(one, "rollouts.jsonl"), rows(two, "rollouts.jsonl"), strict=True):
        assert (x["step"], x["item"], x["completions"]) == (y["step"], y["item"], y["completions"])
        # marlhf: the reward model's scores, after its fit on 2 processes (Adam, as below) and in batches of 2 rows
        # or of 4 (2.5e-6 apart with AVX2 kernels); then every step's metrics follow them
        assert y["reward"] == pytest.approx(x["reward"], abs=1e-4)
    assert_same_metrics(rows(one, "metrics.jsonl"), rows(two, "metrics.jsonl"),
                        tight_until=1 if algorithm == "madpo" else 0)
    wa, wb = adapters(one, 2), adapters(two, 2)
    for agent in wa:
        assert_close_weights(wa[agent], wb[agent], lr=3e-3, steps=2)  # tiny_cpu's learning_rate


def test_the_notebook_picks_the_algorithm_from_its_overrides(tmp_path, monkeypatch):
    from kit import colab
    from kit.trainers.game_trainer import trainer_class
    from kit.trainers.marlhf import MARLHFTrainer

    monkeypatch.setenv("KIT_SMOKE_DIR", str(tmp_path / "smoke"))
    cfg = colab.notebook_config("colab_a100", "toy", {}, "x", smoke=True, algorithm="marlhf", log=lambda *_: None)
    assert cfg.algorithm == "marlhf" and trainer_class(cfg.task, cfg.algorithm) is MARLHFTrainer
    assert trainer_class("toy", "madpo") is MADPOTrainer


def test_the_preference_bench_runs_a_tiny_marlhf():
    from test_bench import load

    row = load("preferences").toy("marlhf", 1, ("num_steps=2", "eval_every=1", "batch_size=2", "reward_num_items=4"))
    assert row["algorithm"] == "marlhf" and 0 <= row["rm_heldout_accuracy"] <= 1 and row["s_per_step"] > 0
