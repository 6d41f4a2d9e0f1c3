"""A bf16 base on a CPU (issue 77): what holds in fp32 holds in bf16, each check with the tolerance it holds to.

Run: python -m pytest tests/test_bf16.py

The tiny model with dtype=bfloat16 set (dtype=auto keeps it in fp32: kit/engine/precision.py). The base's weights
and activations are bf16; the LoRA weights, their gradients, Adam's state and the output layer are fp32. On a CPU
without native bf16 (AVX2) torch emulates it: the same numbers, more slowly. What is exact stays exact (a resume, a
step taken twice); what fp32 holds to float rounding holds here to bf16's rounding (8 significant bits), stated at
each check.
"""

import json

import pytest
import torch

from test_distributed import ARGS, adapters, launch, rows
from test_trainer import adapter_weights, cfg_for, metric_rows, one_update

from kit.engine.forward import completion_logprobs
from kit.run.checkpoint import seed_everything
from kit.run.config import load_config
from kit.trainers.trainer import Trainer

BF16 = "dtype=bfloat16"
QUIET = dict(log=lambda *_: None)


def test_a_bf16_run_resumes_bitwise(tmp_path):
    """k steps, stop, resume, k more == 2k steps in one go: bitwise adapters, identical metrics and rollouts."""
    common = (BF16, "num_steps=4", "save_every=2", "eval_every=2", "batch_size=4", "num_generations=4")
    straight = Trainer(cfg_for(tmp_path, *common, name="a"), **QUIET)
    straight.train()
    first = Trainer(cfg_for(tmp_path, *common, name="b"), **QUIET)
    first.train(max_steps=2)
    resumed = Trainer(cfg_for(tmp_path, *common, name="b"), resume=True, **QUIET)
    resumed.train()
    assert next(resumed.team.models[0].get_base_model().model.parameters()).dtype == torch.bfloat16
    wa, wb = adapter_weights(straight), adapter_weights(resumed)
    assert all(x.dtype == torch.float32 and torch.equal(x, y) for a in wa for x, y in zip(wa[a], wb[a]))
    assert metric_rows(tmp_path / "a") == metric_rows(tmp_path / "b")
    assert (tmp_path / "a" / "rollouts.jsonl").read_text() == (tmp_path / "b" / "rollouts.jsonl").read_text()


def test_a_bf16_run_records_its_precision_and_weighs_the_samplers_mismatch(tmp_path):
    """environment.json says bf16 and why; rollout_correction=auto weighs the sampler (the KV-cached decode, rounded to
    bf16) against the update's forward, and every step logs a mismatch that is small but not nothing."""
    trainer = Trainer(cfg_for(tmp_path, BF16, "num_steps=2", "eval_every=0", "top_p=1.0"), **QUIET)
    assert trainer.correction == "token_truncate"  # fp32 with top_p=1 is "none" (tests/test_offpolicy.py)
    trainer.train()
    env = json.loads((tmp_path / "run" / "environment.json").read_text())
    assert env["precision"][0]["dtype"] == "bfloat16" and env["precision"][0]["why"] == "dtype=bfloat16"
    for row in metric_rows(tmp_path / "run"):
        for adapter in trainer.team.adapters:
            # measured on the tiny model: ratios within ~2% of 1, KL ~1e-5; fp32's are 1 to 1e-5 and 0 to 1e-8
            assert row[f"mismatch/ratio_mean/{adapter}"] == pytest.approx(1.0, abs=0.05)
            assert 0 <= row[f"mismatch/kl/{adapter}"] < 1e-2


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_bf16_micro_batches_give_the_one_batch_step(tmp_path):
    """The same rollouts, the update in micro-batches of 3, 3 and 2 rows or in one: the loss and every gradient agree
    to bf16's rounding of other batch shapes and paddings: 3e-2 relative (measured 1.1% on the gradients; fp32 holds
    1e-4, tests/test_trainer.py). A micro-batch whose loss were not weighed by its share would be off by ~3x."""
    results = []
    for micro in (0, 3):
        cfg = cfg_for(tmp_path, BF16, "loss_type=token_mean", f"micro_batch_size={micro}", "batch_size=2",
                      "num_generations=4", "max_new_tokens=4", name=f"micro{micro}")
        results.append(one_update(cfg))
    (texts, stats, grads), (texts_mb, stats_mb, grads_mb) = results
    assert texts == texts_mb
    for key in stats:
        if key.startswith("loss/") or key.startswith("kl/"):
            assert stats_mb[key] == pytest.approx(stats[key], rel=3e-2, abs=1e-4), key
    for adapter in grads:
        for a, b in zip(grads[adapter], grads_mb[adapter]):
            assert a.dtype == torch.float32
            assert float((a - b).norm()) <= 3e-2 * float(a.norm()) + 1e-7, adapter


def test_bf16_shared_prompts_give_the_whole_rows_logprobs_and_gradient(tmp_path):
    """The G samples' prompt forwarded once (its KV cache read by every row) against each row forwarded whole: the
    same log-probs to bf16 rounding (2e-2 absolute on log-probs of ~-1 to -5) and the same gradient (2e-2 relative);
    a prompt counted once instead of once per row would be off by O(1)."""
    trainer = Trainer(cfg_for(tmp_path, BF16, "batch_size=2", "num_generations=4", "max_new_tokens=4"), **QUIET)
    seed_everything(0)
    seg = trainer.sample(trainer.batch_items(0))[0].rollout.segments[0]
    model, adapter = trainer.team.models[0], trainer.team.adapters[0]
    params = trainer.team.parameters_of(adapter)
    gen = torch.Generator().manual_seed(1)
    for p in params:  # lora_B is zero at init: move it, so that the gradient reaches lora_A too
        p.data.add_(torch.randn(p.shape, generator=gen) * 0.05)
    out = []
    model.set_adapter(adapter)
    for share in (False, True):
        for p in params:
            p.grad = None
        logp = completion_logprobs(model, seg, temperature=1.0, share_prompts=share)  # (R, T)
        (logp * seg.completion_mask).sum().backward()
        out.append((logp.detach(), [p.grad.clone() for p in params]))
    (whole, g0), (shared, g1) = out
    m = seg.completion_mask.bool()
    assert float((whole - shared)[m].abs().max()) < 2e-2
    assert max(float((x - y).norm() / y.norm()) for x, y in zip(g1, g0) if y.norm() > 0) < 2e-2


@pytest.mark.slow
def test_two_bf16_processes_equal_one(tmp_path):
    """Data parallelism in bf16: 2 processes of 2 items each against 1 of 4, for 2 steps: the same rollouts and
    rewards, advantages to 1e-6, step 1's losses to bf16 rounding, and weights nearly as close as fp32's
    (tests/test_distributed.py says why step 2 is looser than step 1)."""
    one, two = tmp_path / "one", tmp_path / "two"
    overrides = [a for a in ARGS if a != "--set"] + [f"run_dir={one}", "num_steps=2", BF16]
    trainer = Trainer(load_config("tiny_cpu", overrides=overrides), **QUIET)
    trainer.train()
    trainer.close()
    launch(2, "--preset", "tiny_cpu", "--run-dir", str(two), "--set", "num_steps=2", *ARGS, "--set", BF16)
    a, b = rows(one, "rollouts.jsonl"), rows(two, "rollouts.jsonl")
    assert len(a) == len(b) == 2 * 4 * 2
    for x, y in zip(a, b):
        assert (x["step"], x["item"], x["completions"], x["reward"]) == (y["step"], y["item"], y["completions"],
                                                                        y["reward"])
        assert y["advantages"] == pytest.approx(x["advantages"], abs=1e-6)
    for x, y in zip(rows(one, "metrics.jsonl"), rows(two, "metrics.jsonl")):
        # step 1: the same weights, bf16 rounding of other batch shapes (~1%); step 2: that rounding went through
        # Adam, which moves an entry of tiny gradient by ~lr either way (measured: losses of ~0.015 apart by 0.001)
        tol = dict(rel=3e-2, abs=1e-4) if x["step"] == 1 else dict(rel=0.2, abs=5e-3)
        for key in x:
            if key.startswith("loss/"):
                assert y[key] == pytest.approx(x[key], **tol), (x["step"], key)
    wa, wb = adapters(one, 2), adapters(two, 2)
    for agent in wa:  # fp32: <= 1% of a tensor's entries beyond 5e-4; bf16: measured 1.1%, held to 5%. A missing
        # gradient all-reduce moves about half of them (each side's Adam step of another sign)
        for key in wa[agent]:
            diff = (wb[agent][key] - wa[agent][key]).abs()
            assert diff.max().item() <= 6 * 3e-3 * 2, key  # never beyond opposite Adam steps at tiny_cpu's lr
            assert (diff > 5e-4).sum().item() <= max(2, 0.05 * diff.numel()), key
