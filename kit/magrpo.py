"""MAGRPO maths: joint actions, returns, group-relative advantages and the policy loss.

Pure functions, no model and no state; each one carries the equation it implements (arXiv 2508.04652).

    joint actions   aligned: the g-th completion of every agent, G joint actions
                    cross:   the Cartesian product, G^N joint actions
    return          R_t = r_t + discount * mean over children of R_{t+1}   (one turn: R = r)
    advantage       mean (Eq. 1): A_g = R_g - mean_h R_h
                    rloo:         A_g = R_g - mean_{h != g} R_h
                    none:         A_g = R_g
                    optional std scaling A / (std_h R_h + eps) and clamping to [-c, c]
    loss (Eq. 2)    L_i = -mean over rows of [A * sum_t log pi_i(a_t | prompt, a_<t)]
                    token_mean: L_i = -sum_rows,t [A * log pi_i] / number of completion tokens
    KL (optional)   beta * k3, k3 = exp(ref - logp) - (ref - logp) - 1 per completion token, reduced like the loss

What is left out on purpose: on-policy updates need no importance ratio and no clipping (one gradient step per
batch of fresh samples), and the KL term is off unless `beta > 0`.

In `cross` mode each completion of agent i sits in G^(N-1) joint actions; its return is the *mean* of theirs
(CoMLRL sums them instead, which only rescales the advantage by G^(N-1)).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

JOINT_MODES = ("aligned", "cross")
ADVANTAGE_MODES = ("mean", "rloo", "none")
LOSS_TYPES = ("sum", "token_mean")


def joint_actions(num_agents: int, num_generations: int, mode: str = "aligned") -> list[tuple[int, ...]]:
    """Indices (one completion index per agent) of every joint action of one group."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode={mode!r}; allowed: {JOINT_MODES}")


def per_agent_returns(joint_returns, joints: list[tuple[int, ...]], num_agents: int,
                      num_generations: int) -> np.ndarray:
    """(N, G): the return of completion g of agent i, the mean over the joint actions that contain it."""
    joint_returns = np.asarray(joint_returns, dtype=np.float64)
    out = np.zeros((num_agents, num_generations))
    count = np.zeros((num_agents, num_generations))
    for ret, idx in zip(joint_returns, joints):
        for agent, g in enumerate(idx):
            out[agent, g] += ret
            count[agent, g] += 1
    if (count == 0).any():
        raise ValueError("every completion must appear in at least one joint action")
    return out / count


def node_returns(rewards, child_returns=None, discount: float = 1.0) -> np.ndarray:
    """R_j = r_j + discount * mean(children of j's returns); leaves (no children) return r_j.

    rewards: (J,) immediate rewards of a node's joint actions. child_returns: None, or a list of J arrays, each
    holding the returns of the joint actions of the child node that joint action j led to.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if child_returns is None:
        return rewards.copy()
    if len(child_returns) != len(rewards):
        raise ValueError(f"{len(rewards)} joint actions but {len(child_returns)} child groups")
    future = np.array([np.mean(c) for c in child_returns], dtype=np.float64)
    return rewards + discount * future


def advantages(returns, mode: str = "mean", scale: bool = False, clip: float | None = None,
               eps: float = 1e-6) -> np.ndarray:
    """Group-relative advantages over the last axis (the group of G completions)."""
    r = np.asarray(returns, dtype=np.float64)
    g = r.shape[-1]
    if mode == "mean":
        a = r - r.mean(-1, keepdims=True)
    elif mode == "rloo":
        if g < 2:
            raise ValueError("rloo needs a group of at least 2")
        a = r - (r.sum(-1, keepdims=True) - r) / (g - 1)
    elif mode == "none":
        a = r.copy()
    else:
        raise ValueError(f"advantage_mode={mode!r}; allowed: {ADVANTAGE_MODES}")
    if scale:
        a = a / (r.std(-1, keepdims=True) + eps)  # population std of the group's returns
    if clip is not None:
        a = np.clip(a, -clip, clip)
    return a


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] per position without materialising the full log-softmax twice.

    logits: (R, T, V), targets: (R, T) -> (R, T)
    """
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (R, T)
    return picked - torch.logsumexp(logits, dim=-1)


class _HeadLogProbs(torch.autograd.Function):
    """log softmax(h W^T)[target] for N positions, CHUNK positions at a time, recomputed in backward.

    d logp_n / d h_n = W[target_n] - sum_v p_nv W[v],  p_n = softmax(h_n W^T)   (W frozen: no grad for it)
    Only one (CHUNK, V) block of logits is alive at a time, in the forward and in the backward; with a
    151,936-token vocabulary the full fp32 logits of a step's rows are gigabytes.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk):  # (N, H), (V, H), (N,) -> (N,) float32
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for i in range(0, hidden.shape[0], chunk):
            logits = (hidden[i:i + chunk].to(weight.dtype) @ weight.t()).float()  # (c, V)
            out[i:i + chunk] = logits.gather(-1, targets[i:i + chunk, None])[:, 0] - logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, grad):  # grad: (N,)
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        for i in range(0, hidden.shape[0], ctx.chunk):
            logits = (hidden[i:i + ctx.chunk].to(weight.dtype) @ weight.t()).float()  # (c, V)
            g = torch.softmax(logits, -1).mul_(-grad[i:i + ctx.chunk, None])  # -grad * p
            g.scatter_add_(-1, targets[i:i + ctx.chunk, None], grad[i:i + ctx.chunk, None].float())  # + grad * onehot
            grad_hidden[i:i + ctx.chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
        return grad_hidden, None, None, None


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk: int = 1024) -> torch.Tensor:
    """token_logprobs(hidden @ weight^T, targets) without materialising the logits of all positions.

    hidden: (R, T, H) final hidden states, weight: (V, H) the frozen output layer, targets: (R, T) -> (R, T)
    """
    R, T, H = hidden.shape
    out = _HeadLogProbs.apply(hidden.reshape(R * T, H), weight, targets.reshape(R * T), chunk)
    return out.view(R, T)


def policy_loss(logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, loss_type: str = "sum",
                ref_logp: torch.Tensor | None = None, beta: float = 0.0) -> tuple[torch.Tensor, dict]:
    """MAGRPO loss for one agent's rows.

    logp, mask: (R, T) completion-token log-probs and a 0/1 mask (prompt and padding are 0); adv: (R,).
    Returns (loss, stats) with stats holding floats for logging.
    """
    mask = mask.to(logp.dtype)
    adv = adv.to(logp.dtype)
    if loss_type == "sum":
        seq_logp = (logp * mask).sum(-1)  # (R,)
        loss = -(adv * seq_logp).mean()
    elif loss_type == "token_mean":
        loss = -(adv[:, None] * logp * mask).sum() / mask.sum().clamp(min=1)
    else:
        raise ValueError(f"loss_type={loss_type!r}; allowed: {LOSS_TYPES}")
    stats = {"pg_loss": float(loss.detach())}
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs under the base model)")
        diff = ref_logp - logp
        k3 = (torch.exp(diff) - diff - 1) * mask  # (R, T), >= 0
        kl = k3.sum(-1).mean() if loss_type == "sum" else k3.sum() / mask.sum().clamp(min=1)
        loss = loss + beta * kl
        stats["kl"] = float(kl.detach())
    return loss, stats
