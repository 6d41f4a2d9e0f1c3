"""Preference maths (kit/maths/preference.py) against numbers worked out by hand: pair selection, the MADPO loss and its
per-agent gradient (the others' Delta detached), with and without the reference, the Bradley-Terry loss.

Run: python -m pytest tests/test_preference.py      (under a second)

Hand values: sigmoid(x) = 1 / (1 + e^-x); e^-0.4 = 0.670320, so sigmoid(0.4) = 0.598688, sigmoid(-0.4) = 0.401312,
-log sigmoid(0.4) = 0.513015; e^-0.1 = 0.904837, sigmoid(-0.1) = 0.475021, sigmoid(0.1) = 0.524979,
-log sigmoid(-0.1) = 0.744397; e^-1 = 0.367879, sigmoid(-1) = 0.268941, -log sigmoid(1) = 0.313262;
e^0.5 = 1.648721, -log sigmoid(-0.5) = log(2.648721) = 0.974077.
"""

import numpy as np
import pytest
import torch

from kit.maths.preference import (agent_dpo_loss, bradley_terry_loss, dpo_delta, dpo_losses, dpo_stats, pair_accuracy,
                            select_pairs, sequence_logprobs)

REWARDS = [0.2, 1.0, 0.5, 1.0]  # answers 1 and 3 tie: never a pair
# r_w > r_l in (w, l) order, with their gaps: (1,0) .8, (1,2) .5, (2,0) .3, (3,0) .8, (3,2) .5
ALL = [(1, 0), (1, 2), (2, 0), (3, 0), (3, 2)]


def test_all_is_every_strict_pair_in_winner_loser_order():
    assert select_pairs(REWARDS, "all") == ALL
    assert select_pairs(REWARDS, "all", 2) == [(1, 0), (1, 2)]


def test_reward_gap_puts_the_largest_gaps_first_and_equal_gaps_in_order():
    assert select_pairs(REWARDS, "reward_gap") == [(1, 0), (3, 0), (1, 2), (3, 2), (2, 0)]
    assert select_pairs(REWARDS, "reward_gap", 1) == [(1, 0)]  # best vs worst


def test_ties_are_never_pairs():
    assert select_pairs([0.5, 0.5, 0.5], "reward_gap") == []
    assert select_pairs([1.0, 1.0], "all") == []


def test_random_is_a_seeded_order_of_every_pair():
    picks = [select_pairs(REWARDS, "random", None, np.random.default_rng([7, s])) for s in range(6)]
    assert all(sorted(p) == ALL for p in picks)
    assert picks[0] == select_pairs(REWARDS, "random", None, np.random.default_rng([7, 0]))  # same seed, same
    assert len({tuple(p) for p in picks}) > 1  # 5! orders: six seeds do not all agree
    assert select_pairs(REWARDS, "random", 2, np.random.default_rng([7, 0])) == picks[0][:2]
    with pytest.raises(ValueError, match="rng"):
        select_pairs(REWARDS, "random", 2)


def test_the_sequence_log_prob_sums_every_completion_token_the_last_included():
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -4.0, -8.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 0: three tokens, its last the EOS; row 1: two, then padding
    assert sequence_logprobs(logp, mask).tolist() == [-3.5, -4.25]  # CoMLRL would count -1.5 and -0.25


def test_the_reference_is_subtracted_and_none_leaves_it_out():
    w, l = torch.tensor([-2.0]), torch.tensor([-3.0])
    rw, rl = torch.tensor([-2.5]), torch.tensor([-2.8])
    assert dpo_delta(w, l, rw, rl).item() == pytest.approx(0.7)  # (-2 + 3) - (-2.5 + 2.8)
    assert dpo_delta(w, l).item() == pytest.approx(1.0)


def test_madpo_loss_and_each_agents_gradient_by_hand():
    """beta 0.5, Delta = [1.0, -0.2] on one pair: z = 0.8, beta z = 0.4. L = -log sigmoid(0.4) = 0.513015;
    dL_i/dDelta_i = -beta sigmoid(-0.4) = -0.200656, and nothing reaches Delta_j (j != i) through L_i."""
    deltas = torch.tensor([[1.0], [-0.2]], requires_grad=True)
    losses = dpo_losses(deltas, 0.5)
    assert [x.item() for x in losses] == pytest.approx([0.513015, 0.513015], abs=1e-6)
    (grad0,) = torch.autograd.grad(losses[0], deltas, retain_graph=True)
    (grad1,) = torch.autograd.grad(losses[1], deltas)
    assert grad0.ravel().tolist() == pytest.approx([-0.200656, 0.0], abs=1e-6)
    assert grad1.ravel().tolist() == pytest.approx([0.0, -0.200656], abs=1e-6)


def test_madpo_loss_is_a_mean_over_pairs():
    """Two pairs, beta 0.5: agent 0's Deltas [1.0, 0.3], agent 1's [-0.2, -0.5]; z = [0.8, -0.2], beta z = [0.4,
    -0.1]. L = (0.513015 + 0.744397) / 2 = 0.628706; dL_0/dDelta_0 = -0.5 [sigmoid(-0.4), sigmoid(0.1)] / 2
    = [-0.100328, -0.131245]."""
    own = torch.tensor([1.0, 0.3], requires_grad=True)
    others = torch.tensor([-0.2, -0.5], requires_grad=True)
    loss = agent_dpo_loss(own, others, 0.5)
    assert loss.item() == pytest.approx(0.628706, abs=1e-6)
    loss.backward()
    assert own.grad.tolist() == pytest.approx([-0.100328, -0.131245], abs=1e-6)
    assert others.grad is None  # detached: the other agents' parameters get nothing from this loss


def test_madpo_gradient_with_the_reference_reaches_only_the_policy():
    """Delta = (w - l) - (rw - rl) = (-2 + 3) - (-2.5 + 2.8) = 0.7 for agent 0, and agent 1 brings 0.3: z = 1.0,
    beta 0.5: dL/dlogp_w = -0.5 sigmoid(-0.5) = -0.5 * 0.377541 = -0.188771, dL/dlogp_l = +0.188771; the
    reference (the base, adapter off) gets no gradient."""
    w, l = torch.tensor([-2.0], requires_grad=True), torch.tensor([-3.0], requires_grad=True)
    rw, rl = torch.tensor([-2.5], requires_grad=True), torch.tensor([-2.8], requires_grad=True)
    loss = agent_dpo_loss(dpo_delta(w, l, rw, rl), torch.tensor([0.3]), 0.5)
    loss.backward()
    assert (w.grad.item(), l.grad.item()) == pytest.approx((-0.188771, 0.188771), abs=1e-6)
    assert rw.grad is None and rl.grad is None


def test_dpo_stats_by_hand():
    stats = dpo_stats([0.8, -0.2], 0.5, reward_w=[1.0, 0.5], reward_l=[0.2, 0.0])
    assert stats["dpo/loss"] == pytest.approx(0.628706, abs=1e-6)
    assert stats["dpo/accuracy"] == 0.5
    assert stats["dpo/margin"] == pytest.approx(0.15)  # 0.5 * (0.8 - 0.2) / 2
    assert stats["dpo/reward_gap"] == pytest.approx(0.65)  # (0.8 + 0.5) / 2


def test_bradley_terry_loss_and_gradient_by_hand():
    """s_w = [1, 0], s_l = [0, 0.5]: L = (0.313262 + 0.974077) / 2 = 0.643669; dL/ds_w[0] = -sigmoid(-1) / 2 =
    -0.134471, dL/ds_l[0] = +0.134471; dL/ds_w[1] = -sigmoid(0.5) / 2 = -0.311230."""
    sw = torch.tensor([1.0, 0.0], requires_grad=True)
    sl = torch.tensor([0.0, 0.5], requires_grad=True)
    loss = bradley_terry_loss(sw, sl)
    assert loss.item() == pytest.approx(0.643669, abs=1e-6)
    loss.backward()
    assert sw.grad.tolist() == pytest.approx([-0.134471, -0.311230], abs=1e-6)
    assert sl.grad.tolist() == pytest.approx([0.134471, 0.311230], abs=1e-6)
    assert pair_accuracy([1.0, 0.0, 2.0], [0.0, 0.5, 2.0]) == pytest.approx(1 / 3)  # the tie counts as wrong
