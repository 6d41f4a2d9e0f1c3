"""Actor-critic maths (kit/maths/actor_critic.py), every number worked out by hand in the comments.

Run: python -m pytest tests/test_actor_critic.py      (instant)
"""

import math

import numpy as np
import pytest
import torch

from kit.maths import actor_critic as ac


def test_lambda_returns_by_hand():
    # discount 0.5, lam 0.25: 1 + 0.5 * (0.75 * 2 + 0.25 * 3) = 2.125;  0 + 0.5 * (0.75 * 4 + 0.25 * 1) = 1.625
    y = ac.lambda_returns([1.0, 0.0], [2.0, 4.0], [3.0, 1.0], discount=0.5, lam=0.25)
    np.testing.assert_allclose(y, [2.125, 1.625])


def test_td_targets_by_hand():
    # 1 + 0.9 * 3 = 3.7; a last turn (V' = 0): 2
    np.testing.assert_allclose(ac.td_targets([1.0, 2.0], [3.0, 0.0], discount=0.9), [3.7, 2.0])


def test_gae_by_hand():
    r, v = [0.0, 0.0, 1.0], [0.5, 0.2, 0.6]
    # deltas: 0 + 0.9 * 0.2 - 0.5 = -0.32; 0 + 0.9 * 0.6 - 0.2 = 0.34; 1 + 0 - 0.6 = 0.4
    np.testing.assert_allclose(ac.gae(r, v, 0.9, 0.0), [-0.32, 0.34, 0.4])  # TD(0): the deltas
    # lam 0.5 (discount * lam = 0.45): A2 = 0.4; A1 = 0.34 + 0.45 * 0.4 = 0.52; A0 = -0.32 + 0.45 * 0.52 = -0.086
    np.testing.assert_allclose(ac.gae(r, v, 0.9, 0.5), [-0.086, 0.52, 0.4])
    # lam 1: the discounted return minus V: 0.81 - 0.5, 0.9 - 0.2, 1 - 0.6
    np.testing.assert_allclose(ac.gae(r, v, 0.9, 1.0), [0.31, 0.7, 0.4])


def test_gae_is_the_lambda_return_minus_the_value():
    r, v, gamma, lam = [0.0, 0.0, 1.0], [0.5, 0.2, 0.6], 0.9, 0.5
    y2 = ac.lambda_returns(1.0, 0.0, 0.0, gamma, lam)  # 1
    y1 = ac.lambda_returns(0.0, 0.6, y2, gamma, lam)  # 0.9 * (0.5 * 0.6 + 0.5 * 1) = 0.72
    y0 = ac.lambda_returns(0.0, 0.2, y1, gamma, lam)  # 0.9 * (0.5 * 0.2 + 0.5 * 0.72) = 0.414
    np.testing.assert_allclose([y0, y1, y2], [0.414, 0.72, 1.0])
    np.testing.assert_allclose(ac.gae(r, v, gamma, lam), np.array([y0, y1, y2]) - v)


def test_q_advantages_subtract_the_group_mean():
    np.testing.assert_allclose(ac.q_advantages([[1.0, 3.0], [2.0, 2.0]]), [[-1.0, 1.0], [0.0, 0.0]])


def test_counterfactual_advantages_by_hand():
    q = np.array([[[3.0, 1.0], [5.0, 9.0]],  # agent 0: [g, k] = Q with its action swapped for its k-th sample
                  [[2.0, 4.0], [0.0, 0.0]]])  # agent 1
    # agent 0: 3 - (3 + 1) / 2 = 1; 9 - (5 + 9) / 2 = 2.  agent 1: 2 - (2 + 4) / 2 = -1; 0 - 0 = 0
    np.testing.assert_allclose(ac.counterfactual_advantages(q), [[1.0, 2.0], [-1.0, 0.0]])


def test_counterfactual_advantage_ignores_the_partner_when_q_is_additive():
    """Q(a0, a1) = f(a0) + g(a1): agent 0's advantage is f(a0) - mean f over its own samples, whatever agent 1 did."""
    f, g = np.array([0.0, 1.0, 5.0]), np.array([10.0, -3.0, 7.0])
    q = np.zeros((2, 3, 3))
    for j in range(3):  # joint action j = (a0^j, a1^j); k = the swapped-in sample
        q[0, j] = f + g[j]
        q[1, j] = f[j] + g
    adv = ac.counterfactual_advantages(q)
    np.testing.assert_allclose(adv[0], f - 2.0)  # mean f = 2
    np.testing.assert_allclose(adv[1], g - 14.0 / 3)  # mean g = 14/3


def test_normalize_by_hand():
    # mean 2, population std sqrt(2/3) = 0.81650
    np.testing.assert_allclose(ac.normalize([1.0, 2.0, 3.0]), [-1.2247449, 0.0, 1.2247449], rtol=1e-6)
    np.testing.assert_allclose(ac.normalize([1.0, 2.0], mean=1.0, std=2.0, eps=0.0), [0.0, 0.5])


def test_value_loss_by_hand():
    v, old, y = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]), torch.tensor([2.0, 2.0])
    # CoMLRL's squared error, no PPO 0.5 (issue 41: with the 0.5, value_loss_coef=0.6 weighed half of CoMLRL's)
    # clip 0.2. row 0: plain (1 - 2)^2 = 1; clipped 0.5 + 0.2 = 0.7, (0.7 - 2)^2 = 1.69; max = 1.69
    #           row 1: plain 0; clipped 2.5 - 0.2 = 2.3, (2.3 - 2)^2 = 0.09; max = 0.09
    torch.testing.assert_close(ac.value_loss(v, old, y, 0.2), torch.tensor([1.69, 0.09]))
    torch.testing.assert_close(ac.value_loss(v, old, y, None), torch.tensor([1.0, 0.0]))


def test_explained_variance_by_hand():
    # y - V = [0, 0, 1]: variance 2/9; Var(y) = 2/3; 1 - (2/9) / (2/3) = 2/3
    assert ac.explained_variance([1.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(2 / 3)
    assert ac.explained_variance([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert math.isnan(ac.explained_variance([0.0, 1.0], [2.0, 2.0]))
