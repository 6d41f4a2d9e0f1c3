"""Issue 22: the sampler's log-probs, the rollout correction, clipped multi-iteration updates and the GRPO family's
options, against hand-computed values (kit/maths/losses.py, kit/engine/sampling.py) and on the tiny CPU team.

Run: python -m pytest tests/test_offpolicy.py
"""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from kit.maths import losses, magrpo
from kit.run.config import ConfigError, TrainConfig, from_dict, load_config, saved_values, training_diff, validate
from kit.engine.sampling import SeededSampling


# ---- advantages


def test_max_baseline_is_the_groups_best_return():  # CoMLRL's MAReMax
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0, 3.0, 6.0], "max"), [-5.0, -4.0, -3.0, 0.0])


def test_raw_is_the_return_itself_and_none_is_its_old_name():  # MAREINFORCE
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0], "raw"), [1.0, 2.0])
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0], "none"), [1.0, 2.0])


def test_batch_scaling_divides_by_the_std_of_every_return():
    # group means 1 and 15 -> [-1, 1], [-5, 5]; the std of (0, 2, 10, 20) is sqrt(62)
    a = magrpo.advantages([[0.0, 2.0], [10.0, 20.0]], scale="batch", eps=0.0)
    np.testing.assert_allclose(a, np.array([[-1.0, 1.0], [-5.0, 5.0]]) / math.sqrt(62))
    given = magrpo.advantages([[0.0, 2.0]], scale="batch", eps=0.0, batch_std=4.0)  # the whole step's std wins
    np.testing.assert_allclose(given, [[-0.25, 0.25]])


def test_group_scaling_and_the_old_boolean():
    np.testing.assert_allclose(magrpo.advantages([1.0, 5.0], scale="group", eps=0.0), [-1.0, 1.0])
    np.testing.assert_allclose(magrpo.advantages([1.0, 5.0], scale=True, eps=0.0), [-1.0, 1.0])
    np.testing.assert_allclose(magrpo.advantages([1.0, 5.0], scale=False), [-2.0, 2.0])
    with pytest.raises(ValueError, match="scale_rewards"):
        magrpo.advantages([1.0, 5.0], scale="rows")


# ---- loss aggregation

LOGP = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADV = torch.tensor([2.0, -1.0])  # per-token terms -A*logp: row 0 [2, 4, (18)], row 1 [-0.5, -0.5, -0.5]


@pytest.mark.parametrize("loss_type,expected", [
    ("sum", (6.0 - 1.5) / 2),  # mean over rows of each row's sum
    ("grpo", (6.0 / 2 + -1.5 / 3) / 2),  # mean over rows of each row's token mean
    ("dr_grpo", (6.0 - 1.5) / (2 * 4)),  # over rows x max_new_tokens (4)
    ("token_mean", 4.5 / 5), ("dapo", 4.5 / 5), ("bnpo", 4.5 / 5),  # over the 5 completion tokens
])
def test_each_loss_type_on_a_hand_made_batch(loss_type, expected):
    loss, _ = losses.policy_loss(LOGP, MASK, ADV, loss_type, max_tokens=4)
    assert float(loss) == pytest.approx(expected)


def test_unknown_loss_type_names_the_allowed_ones():
    with pytest.raises(ValueError, match="dr_grpo"):
        losses.policy_loss(LOGP, MASK, ADV, "mean")


# ---- rollout correction

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
SAMPLER = torch.tensor([[-1.5, -1.0, -0.5], [-2.0, -2.0, -1.0]])
CMASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
# log rho: row 0 [0.5, -1, (0)], row 1 [1, 1, 0]


def test_token_truncate_caps_each_ratio():
    w, sums = losses.rollout_weights(OLD, SAMPLER, CMASK, "token_truncate", cap=1.5)
    expected = torch.tensor([[1.5, math.exp(-1.0), 0.0], [1.5, 1.5, 1.0]])
    torch.testing.assert_close(w, expected)
    rho = [math.exp(0.5), math.exp(-1.0), math.e, math.e, 1.0]
    assert sums["tokens"] == 5 and sums["past_cap"] == 3
    assert sums["rho"] == pytest.approx(sum(rho)) and sums["rho_max"] == pytest.approx(math.e)
    assert sums["k3"] == pytest.approx(sum(r - math.log(r) - 1 for r in rho))


def test_sequence_mask_weights_whole_sequences_and_drops_those_past_the_cap():
    w, _ = losses.rollout_weights(OLD, SAMPLER, CMASK, "sequence_mask", cap=1.5)
    # the geometric mean of a row's ratios: row 0 exp(-0.5 / 2) <= 1.5, every token weighted by it; row 1
    # exp(2 / 3) = 1.95 > 1.5, masked
    torch.testing.assert_close(w, torch.tensor([[math.exp(-0.25)] * 2 + [0.0], [0.0, 0.0, 0.0]]))


@pytest.mark.parametrize("correction", ["none", "token_truncate", "sequence_mask"])
def test_every_mode_counts_the_completions_past_the_cap(correction):
    """rows_past_cap counts what MIS drops (row 1 above), in every mode; an empty completion has no ratio."""
    old, sampler = torch.cat([OLD, torch.zeros(1, 3)]), torch.cat([SAMPLER, torch.zeros(1, 3)])
    _, sums = losses.rollout_weights(old, sampler, torch.cat([CMASK, torch.zeros(1, 3, dtype=CMASK.dtype)]),
                                     correction, cap=1.5)
    assert (sums["rows"], sums["rows_past_cap"]) == (2, 1)


def test_non_finite_sampler_log_probs_are_refused():
    with pytest.raises(ValueError, match="not finite"):
        losses.rollout_weights(OLD, torch.full_like(SAMPLER, float("nan")), CMASK)
    # off the mask anything goes (padding after EOS)
    losses.rollout_weights(OLD, torch.where(CMASK.bool(), SAMPLER, -math.inf), CMASK)


def test_a_non_finite_term_off_the_mask_never_reaches_the_loss():
    logp = torch.tensor([[-1.0, -math.inf]])
    loss, _ = losses.policy_loss(logp, torch.tensor([[1, 0]]), torch.tensor([1.0]))
    assert float(loss) == 1.0


def test_no_correction_weighs_one_and_still_measures():
    w, sums = losses.rollout_weights(OLD, SAMPLER, CMASK, "none", cap=1.5)
    torch.testing.assert_close(w, CMASK.float())
    assert sums["past_cap"] == 3


def test_weights_multiply_each_tokens_term():
    logp = torch.tensor([[-1.0, -2.0]])
    loss, _ = losses.policy_loss(logp, torch.ones(1, 2), torch.tensor([2.0]), "sum",
                                 weights=torch.tensor([[1.5, 0.5]]))
    assert float(loss) == pytest.approx(2 * 1 * 1.5 + 2 * 2 * 0.5)


# ---- clipped ratio


def test_the_ratio_is_clipped_where_the_advantage_would_push_it_further():
    logp = torch.tensor([[math.log(1.3)]], requires_grad=True)
    old, mask = torch.zeros(1, 1), torch.ones(1, 1)
    up, st = losses.policy_loss(logp, mask, torch.tensor([1.0]), old_logp=old, epsilon=0.2)
    assert float(up.detach()) == pytest.approx(-1.2) and st["clip_fraction"] == 1.0
    up.backward()
    assert float(logp.grad) == 0.0  # clipped: no gradient
    logp.grad = None
    down, st = losses.policy_loss(logp, mask, torch.tensor([-1.0]), old_logp=old, epsilon=0.2)
    assert float(down.detach()) == pytest.approx(1.3) and st["clip_fraction"] == 0.0
    down.backward()
    assert float(logp.grad) == pytest.approx(1.3)  # d(-(-1) * r)/dlogp = r
    high, _ = losses.policy_loss(logp, mask, torch.tensor([1.0]), old_logp=old, epsilon=0.2, epsilon_high=0.4)
    assert float(high.detach()) == pytest.approx(-1.3)  # clip-higher leaves 1.3 inside [0.8, 1.4]


def test_at_ratio_one_the_clipped_loss_has_the_on_policy_gradient():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, generator=g) - 2
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    adv = torch.tensor([0.7, -1.2, 0.4])
    grads = []
    for old in (None, base.clone()):
        logp = base.clone().requires_grad_(True)
        loss, _ = losses.policy_loss(logp, mask, adv, "grpo", old_logp=old)
        loss.backward()
        grads.append(logp.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ---- the sampler's log-probs


def test_seeded_sampling_records_the_log_prob_of_each_emitted_token_after_temperature_and_top_k():
    proc = SeededSampling(torch.tensor([11, 22]), temperature=0.5, top_p=1.0, top_k=2)
    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 2.5, -1.0]])
    ids = torch.zeros(2, 4, dtype=torch.long)
    emitted = []
    for _ in range(3):
        token = proc(ids, scores.clone()).argmax(-1)
        emitted.append(token)
        ids = torch.cat([ids, token[:, None]], 1)
    completion = torch.stack(emitted, 1)
    # /0.5 then top-2: row 0 keeps logits (4, 2), row 1 keeps (6, 5)
    table = torch.full((2, 4), -math.inf)
    table[0, :2] = torch.log_softmax(torch.tensor([4.0, 2.0]), -1)
    table[1, 1:3] = torch.log_softmax(torch.tensor([6.0, 5.0]), -1)
    torch.testing.assert_close(proc.logprobs(completion), table.gather(1, completion))


@pytest.fixture(scope="module")
def tiny_team():
    from kit.engine.models import build_team

    return build_team(TrainConfig(model_name="tiny", num_agents=2, lora_r=4, lora_alpha=8, seed=3), log=lambda *_: None)


def _sampler_and_trainer(team, temperature, top_p, top_k=0, n=4):
    from kit.engine.rollout import generate
    from kit.engine.forward import completion_logprobs

    ro = generate(team, [(0, "a0 sum 7"), (1, "a1 sum 5 and more")], n, max_new_tokens=6, temperature=temperature,
                  top_p=top_p, top_k=top_k, use_chat_template=False, keys=[("t", 0), ("t", 1)], seed=5)
    seg = ro.segments[0]
    out = []
    model = team.models[0]
    with torch.no_grad():
        for adapter in team.adapters:
            rows = seg.rows([team.adapters.index(adapter)])
            model.set_adapter(adapter)
            out.append((rows, completion_logprobs(model, rows, temperature)))
    return out


def test_same_fp32_model_sampler_and_trainer_agree_to_1e5(tiny_team):
    for rows, trainer in _sampler_and_trainer(tiny_team, 0.7, 1.0):
        m = rows.completion_mask.bool()
        assert m.sum() > 0
        ratio = torch.exp(trainer[m] - rows.sampler_logprobs[m])
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)


def test_top_p_gives_the_sampler_at_least_the_trainers_mass():
    from kit.engine.models import build_team

    team = build_team(TrainConfig(model_name="tiny", num_agents=2, lora_r=4, lora_alpha=8, seed=3), log=lambda *_: None)
    for rows, trainer in _sampler_and_trainer(team, 1.0, 0.5):
        m = rows.completion_mask.bool()
        assert (trainer[m] <= rows.sampler_logprobs[m] + 1e-6).all()  # truncation renormalises upwards
        assert (trainer[m] < rows.sampler_logprobs[m] - 1e-3).any()


def test_greedy_rows_have_sampler_log_prob_zero(tiny_team):
    from kit.engine.rollout import generate

    ro = generate(tiny_team, [(0, "a0 sum 7")], 1, max_new_tokens=4, temperature=0.0, use_chat_template=False)
    assert (ro.segments[0].sampler_logprobs == 0).all()


def test_a_4bit_base_with_a_dequantized_copy_engine_shows_a_mismatch(tmp_path):
    """The Colab A100 setup on a CPU: an NF4 base computing in bf16 for the update, and the compiled engine sampling
    from a bf16 copy dequantized from it. Their numerics differ: the measured ratio is not 1, the rollout
    correction switches on, and the mismatch stays small (the copy is the trained policy)."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from kit.engine.models import Team, attach_adapters, save_tiny_model
    from kit.engine.rollout import rollout_correction
    from transformers import AutoTokenizer

    path = save_tiny_model(str(tmp_path / "tiny"))
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quant, dtype=torch.bfloat16,
                                                 device_map={"": "cpu"})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    from kit.engine.models import lora_config

    pm = attach_adapters(model, ["agent_0", "agent_1"], lora_config(4, 8, 0.0, "all-linear"))
    team = Team([pm], [AutoTokenizer.from_pretrained(path)], [0, 0], ["agent_0", "agent_1"],
                rollout_engine="compiled", generation_weights="copy")
    cfg = dataclasses.replace(TrainConfig(), temperature=1.0, top_p=1.0, rollout_engine="compiled")
    logs = []
    assert rollout_correction(cfg, team, logs.append) == "token_truncate" and "compiled" in logs[0]
    for rows, trainer in _sampler_and_trainer(team, 1.0, 1.0):
        m = rows.completion_mask.bool()
        assert torch.isfinite(rows.sampler_logprobs[m]).all()
        _, sums = losses.rollout_weights(trainer, rows.sampler_logprobs, rows.completion_mask, "token_truncate")
        kl, ratio = sums["k3"] / sums["tokens"], sums["rho"] / sums["tokens"]
        assert kl > 0 and ratio != 1.0 and sums["rho_max"] > 1.0  # nonzero, measured
        assert kl < 0.05 and abs(ratio - 1) < 0.2  # and small: the copy samples the policy that is trained


# ---- the trainer: metrics, options reaching the update


def _trainer(tmp_path, **fields):
    """tiny_cpu without top-p (so that the hf engine's sampler is the trainer), then `fields`."""
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "num_steps=2", "eval_every=0",
                                             "save_every=0", "progress=false", "log_rollouts=false", "top_p=1.0"])
    return Trainer(dataclasses.replace(cfg, **fields), log=lambda *_: None)


def test_every_step_logs_the_mismatch_per_adapter(tmp_path):
    trainer = _trainer(tmp_path)
    assert trainer.correction == "none"  # hf engine, fp32, no top-k/top-p: the sampler is the trainer
    trainer.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        for adapter in trainer.team.adapters:
            assert row[f"mismatch/ratio_mean/{adapter}"] == pytest.approx(1.0, abs=1e-5)
            assert row[f"mismatch/ratio_max/{adapter}"] == pytest.approx(1.0, abs=1e-5)
            assert 0 <= row[f"mismatch/kl/{adapter}"] < 1e-8
            assert row[f"mismatch/past_cap/{adapter}"] == row[f"mismatch/rows_past_cap/{adapter}"] == 0
    from kit.analysis import plots

    fig = plots.LiveCurve(every=1, run_dir=tmp_path / "run").figure()  # the live curve draws it per adapter
    (panel,) = [ax for ax in fig.axes if ax.get_ylabel() == "KL(sampler || trainer)"]
    assert sorted(line.get_label() for line in panel.get_lines()) == sorted(trainer.team.adapters)


def test_a_resume_on_another_engine_says_from_which_step_the_correction_changes(tmp_path):
    """rollout_engine may change on resume (CPU to GPU); under auto the correction follows it, and says so."""
    from kit.trainers.trainer import Trainer

    trainer = _trainer(tmp_path, save_every=1)
    trainer.train()
    trainer.close()
    assert json.loads((tmp_path / "run/ckpt/step_000002/state.json").read_text())["update"] == {
        "rollout_correction": "none"}
    lines = []
    resumed = Trainer.from_run(tmp_path / "run", ["rollout_engine=compiled", "num_steps=3"], log=lines.append)
    assert resumed.correction == "token_truncate"
    assert any("token_truncate from step 3 on, none at the checkpoint of step 2" in line for line in lines), lines
    lines.clear()
    Trainer.from_run(tmp_path / "run", ["rollout_engine=hf", "num_steps=3"], log=lines.append)  # the same: silent
    assert not any("from step 3 on" in line for line in lines), lines
    state = tmp_path / "run/ckpt/step_000002/state.json"  # a checkpoint from before the record
    state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "update"}))
    lines.clear()
    Trainer.from_run(tmp_path / "run", ["rollout_engine=hf", "num_steps=3"], log=lines.append)
    assert any("none from step 3 on; the checkpoint of step 2 does not record" in line for line in lines), lines


def test_num_iterations_steps_the_optimizer_that_many_times_and_reports_clipping(tmp_path):
    trainer = _trainer(tmp_path, num_iterations=3, epsilon=0.01)
    trainer.train(max_steps=1)
    for adapter, opt in trainer.optimizers.items():  # AdamW counts its steps per parameter
        assert {int(state["step"]) for state in opt.state.values()} == {3}
    assert trainer.schedulers[trainer.team.adapters[0]].last_epoch == 1  # the schedule counts training steps
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 <= row[f"clip_fraction/{trainer.team.adapters[0]}"] <= 1


def test_mask_truncated_completions_drops_rows_without_eos(tmp_path):
    from kit.engine.rollout import Segment

    trainer = _trainer(tmp_path, mask_truncated_completions=True)
    seg = Segment(0, torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
                  torch.tensor([[1, 1], [1, 1]]), 2, torch.tensor([0, 1]), torch.tensor([0, 0]), torch.zeros(2, 2),
                  torch.tensor([True, False]))
    torch.testing.assert_close(trainer.loss_mask(seg), torch.tensor([[1, 1], [0, 0]]))
    trainer.cfg.mask_truncated_completions = False
    torch.testing.assert_close(trainer.loss_mask(seg), seg.completion_mask)


def test_auto_correction_switches_on_for_top_p(tmp_path):
    assert _trainer(tmp_path, top_p=0.9).correction == "token_truncate"


# ---- config


def test_new_fields_validate_with_clear_messages():
    for bad, field in [({"num_iterations": 0}, "num_iterations"), ({"epsilon": 1.0}, "epsilon"),
                       ({"rollout_is_cap": 0.5}, "rollout_is_cap"), ({"rollout_correction": "tis"}, "rollout_correction"),
                       ({"loss_type": "mean"}, "loss_type"), ({"advantage_mode": "median"}, "advantage_mode"),
                       ({"scale_rewards": "rows"}, "scale_rewards")]:
        with pytest.raises(ConfigError, match=field):
            validate(from_dict(bad))


def test_old_configs_keep_their_meaning():
    assert validate(TrainConfig(scale_rewards=True)).scale_rewards == "group"  # set from Python
    assert from_dict({"scale_rewards": True}).scale_rewards == "group"
    assert from_dict({"scale_rewards": False}).scale_rewards == "none"
    old = {k: v for k, v in dataclasses.asdict(TrainConfig()).items()
           if k not in ("rollout_correction", "num_iterations", "epsilon", "epsilon_high", "rollout_is_cap",
                        "mask_truncated_completions", "score_at_sampling_temperature")}
    old["scale_rewards"] = False
    assert saved_values(old)["rollout_correction"] == "none"  # written before the correction existed
    assert saved_values(old)["score_at_sampling_temperature"] is False  # ... and scored at temperature 1
    as_before = dataclasses.replace(TrainConfig(), rollout_correction="none", score_at_sampling_temperature=False)
    assert training_diff(old, as_before) == []
    assert training_diff(old, TrainConfig()) == ["rollout_correction: 'none' -> 'auto'",
                                                 "score_at_sampling_temperature: False -> True"]


def test_lora_dropout_turns_the_auto_correction_on_and_old_log_probs_skip_it(tmp_path):
    trainer = _trainer(tmp_path, lora_dropout=0.3)
    assert trainer.correction == "token_truncate"
    gen = torch.Generator().manual_seed(0)
    for name, p in trainer.team.models[0].named_parameters():
        if "lora_B" in name:  # zero at init, where dropout on the LoRA input changes nothing
            p.data.normal_(0.0, 0.2, generator=gen)
    trainer.train(max_steps=1)
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    for adapter in trainer.team.adapters:  # the sampler's policy against the trainer's without dropout: the same
        assert row[f"mismatch/ratio_max/{adapter}"] == pytest.approx(1.0, abs=1e-5)
