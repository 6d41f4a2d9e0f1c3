"""Actor-critic maths for IAC and MAAC (CoMLRL's trainers): value targets, advantages, the value loss.

Pure functions on numpy arrays (the value loss on tensors); no model and no state. The models and where their
inputs come from are kit/trainers/critic.py.

    TD(0) target        y_t = r_t + discount * V(s_{t+1})                     (V = 0 after the last turn)
    lambda-return       y_t = r_t + discount * ((1 - lam) V(s_{t+1}) + lam * y_{t+1})
                        lam = 0: TD(0) (CoMLRL's); lam = 1: the Monte Carlo return (MAGRPO's R)
    GAE                 delta_t = r_t + discount * V(s_{t+1}) - V(s_t),   A_t = sum_k (discount * lam)^k delta_{t+k}
                        = y_t - V(s_t) with y_t the lambda-return above (a sequence: a game's decisions)
    advantage (v)       A = y - V(s)                                          one turn: A = R - V(s)
    advantage (q)       baseline mean:           A_g = Q(s, a_g) - mean_h Q(s, a_h)   (over the agent's group)
                        baseline counterfactual: A_i = Q(s, a_i, a_-i) - mean_k Q(s, a_i^k, a_-i)
                                                 (COMA: agent i's own G samples, the partners' actions fixed)
    value loss          L_V = mean[max((V - y)^2, (clip(V, V_old - c, V_old + c) - y)^2)]
                        (PPO's clipped form; c = value_clip_range, None: the plain mean (V - y)^2). No 0.5 in
                        front, as CoMLRL's IAC/MAAC (PPO and cleanrl have one): value_loss_coef weighs this loss
                        exactly as CoMLRL's value_loss_coef weighs its own, so its 0.6 means the same here
    normalisation       A <- (A - mean A) / (std A + eps)   over the step (advantage_normalization)
    explained variance  1 - Var(y - V) / Var(y)           (1: V predicts y; 0: no better than the mean; nan: y constant)

Not covered: target networks, PopArt value normalisation, entropy bonuses.
Run its tests: python -m pytest tests/test_actor_critic.py
"""

from __future__ import annotations

import numpy as np
import torch

CRITIC_TYPES = ("v", "q")
BASELINES = ("mean", "counterfactual")


def lambda_returns(rewards, next_values, next_returns, discount: float, lam: float) -> np.ndarray:
    """y = r + discount * ((1 - lam) * V(s') + lam * y'), elementwise; pass 0 for V(s') and y' after the last turn.
    In a rollout tree s' is the child node a joint action leads to and y' the mean of the child's lambda-returns."""
    r, v, y = (np.asarray(x, dtype=np.float64) for x in (rewards, next_values, next_returns))
    return r + discount * ((1.0 - lam) * v + lam * y)


def td_targets(rewards, next_values, discount: float) -> np.ndarray:
    """TD(0): y = r + discount * V(s') (the lambda-return at lam = 0)."""
    return lambda_returns(rewards, next_values, np.zeros_like(np.asarray(rewards, dtype=np.float64)), discount, 0.0)


def gae(rewards, values, discount: float, lam: float) -> np.ndarray:
    """Advantages of one sequence of T steps: rewards (T,), values (T,) of the states acted in, the state after the
    last step terminal (value 0). A_t = delta_t + discount * lam * A_{t+1}."""
    r, v = np.asarray(rewards, dtype=np.float64), np.asarray(values, dtype=np.float64)
    adv = np.zeros_like(r)
    running = 0.0
    for t in reversed(range(len(r))):
        next_value = v[t + 1] if t + 1 < len(r) else 0.0
        delta = r[t] + discount * next_value - v[t]
        running = delta + discount * lam * running
        adv[t] = running
    return adv


def q_advantages(q) -> np.ndarray:
    """baseline=mean: A_g = Q_g - mean_h Q_h over the last axis (an agent's group of G actions)."""
    q = np.asarray(q, dtype=np.float64)
    return q - q.mean(-1, keepdims=True)


def counterfactual_advantages(q_swapped) -> np.ndarray:
    """COMA's counterfactual baseline. q_swapped: (..., N, G, G), entry [i, g, k] = Q(s, a_i^k, a_-i^g): joint
    action g with agent i's action replaced by its own k-th sample (k = g: the joint action itself). Returns
    (..., N, G): A[i, g] = Q(s, a_i^g, a_-i^g) - mean_k Q(s, a_i^k, a_-i^g)."""
    q = np.asarray(q_swapped, dtype=np.float64)
    own = np.diagonal(q, axis1=-2, axis2=-1)  # (..., N, G): [i, g, g]
    return own - q.mean(-1)


def normalize(adv, mean: float | None = None, std: float | None = None, eps: float = 1e-8) -> np.ndarray:
    """(A - mean) / (std + eps); mean and std of `adv` unless given (over every process's advantages)."""
    a = np.asarray(adv, dtype=np.float64)
    mean = a.mean() if mean is None else mean
    std = a.std() if std is None else std
    return (a - mean) / (std + eps)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, targets: torch.Tensor,
               clip_range: float | None = None) -> torch.Tensor:
    """Per-row value loss max((V - y)^2, (V_clipped - y)^2), V_clipped = V_old + clamp(V - V_old, -c, c);
    (R,) -> (R,), the caller takes the (weighted) mean. clip_range None: (V - y)^2. CoMLRL's squared error, without
    PPO's 0.5."""
    plain = (values - targets) ** 2
    if clip_range is None:
        return plain
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    return torch.maximum(plain, (clipped - targets) ** 2)


def explained_variance(values, targets) -> float:
    """1 - Var(y - V) / Var(y) (population variances); nan when the targets do not vary."""
    v, y = np.asarray(values, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    var = y.var()
    return float("nan") if var == 0 else float(1.0 - (y - v).var() / var)
