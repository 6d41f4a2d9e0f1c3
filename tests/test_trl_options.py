"""Issue 33: the rest of TRL's GRPO options, each against numbers worked out by hand: sequence-level ratios (GSPO),
delta, cispo, sapo, the off-policy mask, the bias-corrected KL, the entropy mask and bonus (and the chunked head's
entropy), normalize_then_sum, reward logging hooks and the zero-advantage groups.

Run: python -m pytest tests/test_trl_options.py      (a few seconds; the trainer tests build the tiny model)
"""

import json
import math

import numpy as np
import pytest
import torch

from kit.maths import losses, magrpo
from kit.run.config import ConfigError, load_config
from kit.tasks.rewards import Reward, RewardModel, Scorer, log_metric

# Two rows: row 0 has 2 completion tokens and one padding position, row 1 has 3.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# ---- sequence-level ratios (GSPO), delta, cispo, sapo

def test_the_sequence_ratio_is_exp_of_the_masked_mean_log_ratio():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    old = torch.tensor([[-1.1, -2.5, -9.0], [-0.4, -0.5, -0.3]])  # the padding's -9 would move row 0's mean
    log_r = losses.log_importance_weights(logp, old, MASK, "sequence")
    # row 0: (0.1 + 0.5) / 2 = 0.3; row 1: (-0.1 + 0 - 0.2) / 3 = -0.1
    torch.testing.assert_close(log_r, torch.tensor([[0.3], [-0.1]]))
    torch.testing.assert_close(losses.log_importance_weights(logp, old, MASK, "token")[1], torch.tensor([-0.1, 0, -0.2]))


def test_the_sequence_ratio_is_clipped_per_completion():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.1, -2.5, -9.0], [-0.4, -0.5, -0.3]])
    loss, st = losses.policy_loss(logp, MASK, torch.tensor([1.0, -1.0]), "sum", old_logp=old,
                                  importance_sampling_level="sequence")
    # row 0: s = e^0.3 = 1.35 > 1.2 with A = 1: -1.2 on each of its 2 tokens, clipped (no gradient);
    # row 1: s = e^-0.1 = 0.905 inside [0.8, 1.2] with A = -1: +0.905 on each of its 3 tokens
    assert float(loss.detach()) == pytest.approx((2 * -1.2 + 3 * math.exp(-0.1)) / 2, rel=1e-6)
    assert st["clip_fraction"] == pytest.approx(2 / 5)
    loss.backward()
    # row 1 adds 3 s / 2 (3 tokens of -s A, mean over 2 rows), s = exp(mean of its 3 log-ratios): s / 2 per token
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [math.exp(-0.1) / 2] * 3]))


# Each loss type at ratio 1 (old = logp): its gradient is Eq. 2's, -A / (its normaliser) on every completion token.
# A = [1, -2]; sum: mean over 2 rows; grpo/sapo: each row also divided by its length (2, 3); token_mean, dapo,
# bnpo, cispo: divided by the 5 completion tokens; dr_grpo: by 2 rows x max_tokens 4.
RATIO_ONE = [
    ("sum", [-1 / 2, 2 / 2]), ("grpo", [-1 / 4, 2 / 6]), ("sapo", [-1 / 4, 2 / 6]), ("token_mean", [-1 / 5, 2 / 5]),
    ("dapo", [-1 / 5, 2 / 5]), ("bnpo", [-1 / 5, 2 / 5]), ("cispo", [-1 / 5, 2 / 5]), ("dr_grpo", [-1 / 8, 2 / 8]),
]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type, per_row", RATIO_ONE, ids=[r[0] for r in RATIO_ONE])
def test_at_ratio_one_every_loss_type_has_the_policy_gradient_of_eq2(loss_type, per_row, level):
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -0.3]], requires_grad=True)
    loss, _ = losses.policy_loss(logp, MASK, torch.tensor([1.0, -2.0]), loss_type, old_logp=logp.detach(),
                                 max_tokens=4, importance_sampling_level=level)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([per_row]).t().expand(2, 3) * MASK)


@pytest.mark.parametrize("loss_type", ["sum", "token_mean", "dapo", "bnpo", "dr_grpo", "cispo"])
def test_sequence_ratios_with_a_token_summing_loss_warn_that_it_is_not_gspo(loss_type):
    """Issue 41: each completion's clipped sequence term counted once per token is weighed by its length (not GSPO);
    TRL warns, and so does the kit, naming the pairing that is GSPO."""
    with pytest.warns(UserWarning, match=f"loss_type={loss_type}.*not GSPO.*loss_type=grpo"):
        load_config("tiny_cpu", overrides=["importance_sampling_level=sequence", f"loss_type={loss_type}"])


@pytest.mark.parametrize("overrides", [("importance_sampling_level=sequence", "loss_type=grpo"),
                                       ("importance_sampling_level=sequence", "loss_type=sapo"),
                                       ("importance_sampling_level=token", "loss_type=sum")])
def test_gspo_and_token_ratios_do_not_warn(overrides):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        load_config("tiny_cpu", overrides=list(overrides))


def test_gspo_is_sequence_ratios_with_grpo_one_term_per_completion():
    """Under grpo the sequence level's loss is GSPO's (1 / G) sum_i -min(s_i A_i, clip(s_i) A_i): row 0 (2 tokens)
    s = e^0.3 clipped to 1.2 with A = 1; row 1 (3 tokens) s = e^-0.1 with A = -1; under sum row 1 counts 3 times."""
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    old = torch.tensor([[-1.1, -2.5, -9.0], [-0.4, -0.5, -0.3]])
    loss, _ = losses.policy_loss(logp, MASK, torch.tensor([1.0, -1.0]), "grpo", old_logp=old,
                                 importance_sampling_level="sequence")
    assert float(loss) == pytest.approx((-1.2 + math.exp(-0.1)) / 2, rel=1e-6)


def test_delta_caps_the_unclipped_ratio_of_a_negative_advantage():
    logp, old, mask, adv = torch.tensor([[0.0]]), torch.tensor([[-math.log(1.5)]]), torch.ones(1, 1), torch.tensor([-1.0])
    plain, _ = losses.policy_loss(logp, mask, adv, "sum", old_logp=old)
    capped, _ = losses.policy_loss(logp, mask, adv, "sum", old_logp=old, delta=1.3)
    assert float(plain) == pytest.approx(1.5)  # -min(1.5 * -1, 1.2 * -1): the unclipped branch, unbounded
    assert float(capped) == pytest.approx(1.3)  # -min(1.3 * -1, 1.2 * -1)


def test_cispo_weighs_log_pi_by_the_capped_ratio_without_its_gradient():
    logp = torch.tensor([[-0.7], [-0.7]], requires_grad=True)
    old = torch.tensor([[-0.7 - math.log(1.5)], [-0.7 - math.log(0.5)]])  # ratios 1.5 and 0.5
    loss, _ = losses.policy_loss(logp, torch.ones(2, 1), torch.tensor([2.0, 2.0]), "cispo", old_logp=old,
                                 epsilon_high=0.2)
    # weights min(1.5, 1.2) = 1.2 and 0.5 (no lower cap); -w * 2 * -0.7 per token, mean over the 2 tokens
    assert float(loss.detach()) == pytest.approx((1.2 * 1.4 + 0.5 * 1.4) / 2)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2 * 2 / 2], [-0.5 * 2 / 2]]))  # through log pi only


def test_sapo_gates_the_ratio_softly_with_a_temperature_per_sign():
    ratio = torch.tensor([[1.5], [1.5], [1.0]])
    terms = losses.sapo_terms(ratio, torch.tensor([[1.0], [-1.0], [2.0]]), temperature_pos=1.0, temperature_neg=1.05)
    expected = [-4 * sigmoid(0.5), (4 / 1.05) * sigmoid(1.05 * 0.5), -(4 / 1.0) * 0.5 * 2]
    torch.testing.assert_close(terms[:, 0], torch.tensor(expected))


# ---- the off-policy mask, the bias-corrected KL

def test_the_off_policy_mask_drops_exactly_the_negative_advantage_completions_past_the_threshold():
    logp = torch.full((4, 3), -1.0)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 4)
    # sampler minus policy, per token: rows 0, 1, 3 average 0.6 (> 0.5), row 2 averages 0.2; padding is -inf
    sampler = logp + torch.tensor([[0.4, 0.8, -math.inf], [0.4, 0.8, -math.inf], [0.3, 0.1, -math.inf],
                                   [0.6, 0.6, -math.inf]])
    keep = losses.off_policy_mask(logp, sampler, mask, torch.tensor([1.0, -1.0, -1.0, 0.0]), threshold=0.5)
    assert keep[:, 0].tolist() == [1.0, 0.0, 1.0, 1.0]  # dropped: A < 0 and KL 0.6 > 0.5
    loss, st = losses.policy_loss(logp, mask, torch.tensor([1.0, -1.0, -1.0, 0.0]), "sum", sampler_logp=sampler,
                                  off_policy_mask_threshold=0.5)
    assert float(loss.detach()) == pytest.approx((2 * 1.0 + 0.0 + 2 * -1.0 + 0.0) / 4) and st["masked_rows"] == 1.0


def test_the_bias_corrected_kl_is_weighted_by_the_ratio_and_keeps_its_gradient():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    ref, old, mask, adv = torch.tensor([[-1.5]]), torch.tensor([[-1.2]]), torch.ones(1, 1), torch.zeros(1)
    k3 = math.exp(-0.5) + 0.5 - 1  # exp(ref - logp) - (ref - logp) - 1
    loss, st = losses.policy_loss(logp, mask, adv, "sum", ref, 1.0, old_logp=old, use_bias_correction_kl=True)
    assert st["kl"] == pytest.approx(k3 * math.exp(0.2))  # times r = exp(logp - old)
    on_policy, _ = losses.policy_loss(logp, mask, adv, "sum", ref, 1.0, use_bias_correction_kl=True)
    (grad,) = torch.autograd.grad(on_policy, logp)
    # at r = 1: d(k3 r)/dlogp = dk3/dlogp + k3 = (1 - e^-0.5) + (e^-0.5 - 0.5) = 0.5; without it 1 - e^-0.5
    assert float(on_policy.detach()) == pytest.approx(k3) and float(grad) == pytest.approx(0.5)


def test_the_bias_corrected_kl_under_sequence_ratios_uses_each_completions_one_ratio():
    """Issue 41: with importance_sampling_level=sequence the k3 of every token is weighed by its completion's
    sequence ratio s = exp(mean log-ratio), not by its own token ratio. One row, 2 tokens: log-ratios 0.4 and 0
    (s = e^0.2), ref - logp = -0.5 and 0.5."""
    logp = torch.tensor([[-1.0, -1.0]])
    old, ref, mask, adv = torch.tensor([[-1.4, -1.0]]), torch.tensor([[-1.5, -0.5]]), torch.ones(1, 2), torch.zeros(1)
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(0.5) - 0.5 - 1]
    _, st = losses.policy_loss(logp, mask, adv, "sum", ref, 1.0, old_logp=old, use_bias_correction_kl=True,
                               importance_sampling_level="sequence")
    assert st["kl"] == pytest.approx((k3[0] + k3[1]) * math.exp(0.2))  # sum over the row's tokens, one row
    _, tok = losses.policy_loss(logp, mask, adv, "sum", ref, 1.0, old_logp=old, use_bias_correction_kl=True)
    assert tok["kl"] == pytest.approx(k3[0] * math.exp(0.4) + k3[1])  # token level: each its own ratio


def test_the_off_policy_mask_measures_the_current_policy_not_the_old_one():
    """Issue 41: at num_iterations >= 2 the mask's KL is mean_t (logp_sampler - logp) with logp the CURRENT policy
    (TRL's per_token_logps), not the old one's. Sampler = old: the old policy's KL is 0; the current policy has moved
    0.6 nats per token away from the sampler, past 0.5, so the completion (A < 0) is dropped."""
    mask, adv = torch.ones(1, 2), torch.tensor([-1.0])
    old = torch.tensor([[-1.0, -1.0]])
    logp = old - 0.6  # the current policy
    loss, st = losses.policy_loss(logp, mask, adv, "sum", old_logp=old, sampler_logp=old.clone(),
                                  off_policy_mask_threshold=0.5)
    assert st["masked_rows"] == 1.0 and float(loss) == 0.0
    kept, st = losses.policy_loss(logp, mask, adv, "sum", old_logp=old, sampler_logp=old.clone(),
                                  off_policy_mask_threshold=0.7)
    # kept: r = e^-0.6 = 0.549 per token, below 1 - 0.2 with A = -1: -min(-0.549, -0.8) = 0.8 each, 2 tokens
    assert st["masked_rows"] == 0.0 and float(kept) == pytest.approx(1.6)


# ---- entropy: the mask, the bonus, the chunked head

ENTROPY = torch.tensor([[0.1, 0.5, 0.9, 5.0], [0.3, 0.7, 0.2, 0.8]])  # the 5.0 is padding
ENTROPY_MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


@pytest.mark.parametrize("quantile, kept", [(0.5, [0.5, 0.7, 0.8, 0.9]), (1 / 3, [0.7, 0.8, 0.9]), (1.0, None)])
def test_the_entropy_mask_keeps_the_top_share_of_completion_tokens(quantile, kept):
    # 7 completion tokens, sorted 0.1 0.2 0.3 0.5 0.7 0.8 0.9: the (1 - q) quantile sits at position (1 - q) * 6
    keep = losses.high_entropy_mask(ENTROPY, ENTROPY_MASK, quantile)
    got = sorted(float(e) for e in ENTROPY[keep.bool()])
    assert got == pytest.approx(kept or [0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9])  # never the padding's 5.0


def test_the_entropy_mask_zeroes_the_policy_term_of_low_entropy_tokens():
    logp = torch.full((2, 4), -1.0)
    loss, _ = losses.policy_loss(logp, ENTROPY_MASK, torch.ones(2), "sum", entropy=ENTROPY, top_entropy_quantile=0.5)
    assert float(loss.detach()) == pytest.approx((2 * 1.0 + 2 * 1.0) / 2)  # row 0 keeps 0.5, 0.9; row 1 keeps 0.7, 0.8


# TRL's entropy bonus (issue 41): the mean entropy over the completion tokens the entropy mask keeps, whatever the
# loss_type. 7 completion tokens summing to 3.5: 0.5 for every loss_type (the kit's old bonus, reduced like the
# loss, was (1.5 + 2.0) / 2 = 1.75 under `sum`); the top half (0.5 0.9 | 0.7 0.8): 2.9 / 4 = 0.725.
ENTROPY_BONUS = [(lt, q, bonus) for lt in ("sum", "grpo", "token_mean", "dr_grpo")
                 for q, bonus in ((1.0, 0.5), (0.5, 2.9 / 4))]


@pytest.mark.parametrize("loss_type, quantile, bonus", ENTROPY_BONUS, ids=[f"{r[0]}-q{r[1]}" for r in ENTROPY_BONUS])
def test_the_entropy_bonus_is_trls_mean_entropy_of_the_kept_tokens_and_lowers_the_loss(loss_type, quantile, bonus):
    entropy = ENTROPY.clone().requires_grad_()
    loss, st = losses.policy_loss(torch.zeros(2, 4), ENTROPY_MASK, torch.zeros(2), loss_type, entropy=entropy,
                                  entropy_coef=0.1, top_entropy_quantile=quantile, max_tokens=4)
    assert float(loss.detach()) == pytest.approx(-0.1 * bonus)
    assert st["entropy"] == pytest.approx(0.5)  # logged: the mean over every completion token (TRL's `entropy`)
    loss.backward()
    kept = 7 if quantile == 1.0 else 4
    want = torch.full((2, 4), -0.1 / kept) * (ENTROPY_MASK if quantile == 1.0 else
                                              torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]))
    torch.testing.assert_close(entropy.grad, want)  # padding and dropped tokens out; more entropy: lower loss


def test_the_chunked_head_entropy_equals_autograd_on_the_full_logits_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    up_logp, up_ent = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    logits = (hidden @ weight.t()) / 0.7
    full = torch.log_softmax(logits, -1)
    ref_logp, ref_ent = full.gather(-1, targets[..., None])[..., 0], -(full.exp() * full).sum(-1)
    ref_grads = {}
    for name, objective in (("both", (ref_logp * up_logp + ref_ent * up_ent).sum()), ("entropy", (ref_ent * up_ent).sum())):
        (ref_grads[name],) = torch.autograd.grad(objective, hidden, retain_graph=True)
    logp, ent = losses.head_logprobs(hidden, weight, targets, chunk=4, temperature=0.7, entropy=True)
    torch.testing.assert_close(logp.double(), ref_logp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent.double(), ref_ent, atol=1e-6, rtol=1e-6)
    (grad,) = torch.autograd.grad((logp.double() * up_logp + ent.double() * up_ent).sum(), hidden)
    torch.testing.assert_close(grad, ref_grads["both"], atol=2e-5, rtol=2e-5)  # the head computes in fp32
    logp, ent = losses.head_logprobs(hidden, weight, targets, chunk=4, temperature=0.7, entropy=True)
    (grad,) = torch.autograd.grad((ent.double() * up_ent).sum(), hidden)  # the log-probs unused: no term of theirs
    torch.testing.assert_close(grad, ref_grads["entropy"], atol=2e-5, rtol=2e-5)


def test_the_chunked_head_keeps_nothing_of_the_size_of_all_logits_for_backward():
    R, T, H, V = 2, 8, 4, 64
    hidden = torch.randn(R, T, H, requires_grad=True)
    weight, targets = torch.randn(V, H), torch.randint(0, V, (R, T))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        logp, ent = losses.head_logprobs(hidden, weight, targets, chunk=4, entropy=True)
        loss = (logp - 0.1 * ent).sum()
    assert saved and max(saved) < R * T * V  # hidden (R T H), weight (V H), targets and entropy (R T)
    loss.backward()
    assert hidden.grad.shape == hidden.shape


def test_no_entropy_is_computed_unless_asked():
    hidden, weight = torch.randn(1, 2, 4), torch.randn(6, 4)
    out = losses.head_logprobs(hidden, weight, torch.zeros(1, 2, dtype=torch.long))
    assert isinstance(out, torch.Tensor) and out.shape == (1, 2)


# ---- clip_fraction on padded rows

def test_clip_fraction_counts_completion_tokens_only():
    logp = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[0.0, 0.0, -5.0], [-1.0, 0.0, 0.0]])  # the padding's ratio e^5 would be clipped
    _, st = losses.policy_loss(logp, MASK, torch.tensor([1.0, 1.0]), "sum", old_logp=old)
    assert st["clipped"] == 1.0 and st["tokens"] == 5.0 and st["clip_fraction"] == pytest.approx(1 / 5)


# ---- several rewards: normalize_then_sum; ties

def test_normalize_then_sum_normalises_each_reward_in_its_group_before_the_weighted_sum():
    # one group of 3: reward 1 is [0, 3, 15] (mean 6, population std sqrt(42)), reward 2 is [0, 0, 1]
    # (mean 1/3, std sqrt(2/9)); weights 1 and 0.5
    got = magrpo.normalize_then_sum([[0.0, 3.0, 15.0], [0.0, 0.0, 1.0]], [1.0, 0.5], eps=0.0)
    a1 = np.array([-6.0, -3.0, 9.0]) / math.sqrt(42)
    a2 = np.array([-1 / 3, -1 / 3, 2 / 3]) / math.sqrt(2 / 9)
    np.testing.assert_allclose(got, a1 + 0.5 * a2, rtol=1e-12)
    np.testing.assert_allclose(got, [-1.279373, -0.816463, 2.095837], atol=1e-6)


def test_tied_groups_are_those_whose_returns_all_agree():
    assert magrpo.tied_groups([[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [0.0, 0.0, 0.0]]).tolist() == [True, False, True]


# ---- the config

@pytest.mark.parametrize("override, allowed", [
    ("delta=1.1", "> 1 + epsilon_high"), ("top_entropy_quantile=0", "(0, 1]"), ("entropy_coef=-0.1", ">= 0"),
    ("off_policy_mask_threshold=-1", ">= 0"), ("sapo_temperature_neg=0", "> 0"),
    ("importance_sampling_level=row", "token, sequence"), ("loss_type=gspo", "cispo, sapo"),
])
def test_bad_values_name_the_field_and_what_is_allowed(override, allowed):
    with pytest.raises(ConfigError, match=override.split("=")[0]) as err:
        load_config("tiny_cpu", overrides=[override])
    assert allowed in str(err.value)


def test_normalize_then_sum_refuses_a_second_normalisation():
    with pytest.raises(ConfigError, match="normalize_then_sum .* scale_rewards=none"):
        load_config("tiny_cpu", overrides=["multi_objective_aggregation=normalize_then_sum", "scale_rewards=group"])


def test_the_defaults_keep_the_update_as_it_was():
    cfg = load_config("tiny_cpu")
    assert (cfg.importance_sampling_level, cfg.delta, cfg.off_policy_mask_threshold, cfg.use_bias_correction_kl,
            cfg.top_entropy_quantile, cfg.entropy_coef, cfg.multi_objective_aggregation) == \
        ("token", None, None, False, 1.0, 0.0, "sum_then_normalize")


# ---- logging from reward functions

def length_logger(item, completions) -> float:
    log_metric("length", len(completions[0]))
    log_metric("twice", 0.0)
    log_metric("twice", 2.0)  # the last value of a name wins
    return 1.0


@pytest.mark.parametrize("workers, pool", [(0, "thread"), (2, "thread"), (1, "process")])
def test_log_metric_values_come_back_with_the_reward_from_threads_and_processes(workers, pool):
    scorer = Scorer(RewardModel(funcs=[length_logger]), workers, pool)
    try:
        rewards = scorer.score([({"id": 0}, ("ab", "c")), ({"id": 1}, ("abcd", "c"))])
    finally:
        scorer.close()
    assert [r.details["logged"] for r in rewards] == [{"length": 2.0, "twice": 2.0}, {"length": 4.0, "twice": 2.0}]


def test_log_metric_outside_a_scoring_call_does_nothing():
    log_metric("length", 1.0)  # no error, nowhere to go
    assert RewardModel(funcs=[lambda item, comps: 1.0])({}, ("a",)).details == {}


def test_source_values_follow_the_reward_names():
    model = RewardModel(funcs=[length_logger, lambda item, comps: 3.0], weights=[1.0, 0.5])
    reward = model({}, ("ab",))
    assert model.source_names() == ["length_logger", "reward_1"]
    assert model.source_values(reward) == [1.0, 3.0] and reward.total == 2.5
    assert RewardModel(funcs=[length_logger]).source_values(Reward(0.7, {"x": 1.0})) == [0.7]


def test_logged_values_and_zero_advantage_groups_reach_metrics_and_rollouts(tmp_path):
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "eval_every=0",
                                             "num_steps=1", "batch_size=2", "num_generations=2", "reward_workers=2",
                                             "reward_weights=[1.0, 0.0]"])
    trainer = Trainer(cfg, reward_funcs=[length_logger], log=lambda *_: None)
    trainer.train()
    trainer.close()
    row = json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
    rollouts = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert row["reward_log/length"] == pytest.approx(np.mean([len(r["completions"][0]) for r in rollouts]))
    assert all(r["logged"]["length"] == len(r["completions"][0]) for r in rollouts)
    for a in range(2):  # a group ties when both of the agent's samples got the same return
        ties = [len({r["return"] for r in rollouts if r["item"] == item}) == 1 for item in {r["item"] for r in rollouts}]
        assert row[f"advantage/zero_groups/agent_{a}"] == pytest.approx(np.mean(ties))


def test_the_entropy_bonus_over_a_micro_batch_divides_by_the_steps_tokens_with_its_gradient():
    """entropy_norm (the trainer's: the step's completion tokens times the micro-batch's share): the bonus is the
    kept tokens' entropy summed over the norm, -0.1 / norm on each kept token's gradient (review 7: a detached
    entropy gave the same loss and no gradient)."""
    entropy = ENTROPY.clone().requires_grad_()
    loss, _ = losses.policy_loss(torch.zeros(2, 4), ENTROPY_MASK, torch.zeros(2), "grpo", entropy=entropy,
                                 entropy_coef=0.1, entropy_norm=20.0)
    assert float(loss.detach()) == pytest.approx(-0.1 * 3.5 / 20.0)  # the 7 kept tokens' entropies sum to 3.5
    loss.backward()
    torch.testing.assert_close(entropy.grad, -0.1 / 20.0 * ENTROPY_MASK)
