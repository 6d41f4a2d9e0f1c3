"""MAGRPO maths: joint actions, returns, group-relative advantages and the policy loss.

Pure functions, no model and no state; each one carries the equation it implements (arXiv 2508.04652). Names
follow TRL's GRPOConfig and CoMLRL where they exist (README: "The update's options").

    joint actions   aligned: the g-th completion of every agent, G joint actions
                    cross:   the Cartesian product, G^N joint actions
    return          R_t = r_t + discount * mean over children of R_{t+1}   (one turn: R = r)
    advantage       mean (Eq. 1, CoMLRL MAGRPO): A_g = R_g - mean_h R_h
                    rloo (MARLOO):               A_g = R_g - mean_{h != g} R_h
                    max  (MAReMax):              A_g = R_g - max_h R_h
                    raw  (MAREINFORCE; "none"):  A_g = R_g
                    marginal (cross only):       A_i(k) = M_i(k) - mean_k' M_i(k'),  M_i(k) = mean of R over the
                                                 joint actions where agent i plays its sample k (its G^(N-1) partners)
                    role (SPIRAL's RAE):         A = R - b_role, b_role <- decay b_role + (1 - decay) mean R_role
                    CoMLRL's names: mareinforce = raw, marloo = rloo, maremax = max
                    scale_rewards: group divides by the group's std, batch by the std over the whole batch
                    (both population std, + eps); then optional clamping to [-c, c]
    per token       on-policy (num_iterations = 1):  l_t = -A * log pi(a_t)                   (Eq. 2)
                    num_iterations > 1 (PPO/TRL):    l_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A),
                                                     r_t = pi(a_t) / pi_old(a_t), pi_old = the policy that sampled
                    times the rollout correction w_t (below), the padding masked out
    loss_type       sum (the paper's):   mean over rows of sum_t l_t
                    grpo:                mean over rows of (sum_t l_t / |o|)
                    dr_grpo:             sum_{rows,t} l_t / (rows * max_new_tokens)
                    token_mean = dapo = bnpo: sum_{rows,t} l_t / (completion tokens of the step)
    KL (optional)   beta * k3, k3 = exp(ref - logp) - (ref - logp) - 1 per completion token, reduced like the loss
                    and not weighted by the rollout correction (as TRL adds it)

Sampler vs trainer. The engine returns the log-prob of every sampled token under the distribution it sampled from
(temperature, then top-k/top-p, renormalised; kit/sampling.py), and the update scores the same tokens with the
trainer's forward at the sampling temperature (rollout.completion_logprobs). Exact: the temperature. Corrected:
everything else that separates the two, i.e. top-k/top-p truncation (the trainer's full softmax gives a sampled
token less mass than the truncated one did) and numerics (a bf16 copy or another kernel for the 4-bit base, the
KV cache against a full forward). With rho_t = pi_old(a_t) / pi_sampler(a_t):

    rollout_correction  token_truncate (TIS): w_t = min(rho_t, cap)
                        sequence_mask (MIS):  w_t = rho_seq if rho_seq <= cap else 0,
                                              rho_seq = exp(mean_t log rho_t), the per-token geometric mean
                                              (a product would shrink with length under top-p: 0.93^256)
                        none:                 w_t = 1
    mismatch metrics    k3 = rho - log rho - 1 per token (an estimate of KL(sampler || trainer)), mean and max
                        rho, the share of tokens with rho > cap (what TIS truncates) and of completions with
                        rho_seq > cap (what MIS drops)

Credit without a critic. With `aligned` joint actions agent i's sample g is scored by R(g, g, ...), so its
advantage carries its partners' luck. `marginal` needs `cross` and scores sample k by the mean over the partners'
samples it was paired with, M_i(k): with an additive reward R = f(a_1) + g(a_2), A_1(k) = f(a_1^k) - mean f,
whatever agent 2 sampled. At a node this is what `mean` computes in cross mode (per_agent_returns below);
`marginal` names it, refuses `aligned`, and keeps the node's own baseline under `grouping` turn/agent, where `mean`
pools the baseline over several nodes. Groups (multi-turn, `grouping`):
    node   an agent's G samples at one node of the tree (one prompt, one turn): AT-GRPO's agent- and turn-wise
           groups (its candidates share the state they were sampled from); one turn: the item's G samples
    turn   an agent's samples at every node of the same item and turn (the prompts differ by the feedback)
    agent  an agent's samples at every node of the item, all turns
Team/local mix (`local_reward_weight` w, tasks whose Reward.parts hold local_0 .. local_{N-1}):
    r_i = (1 - w) r + w local_i per joint action, and returns per agent down the tree.

On-policy with num_iterations = 1: pi_old is the current policy (its log-probs detached), r_t = 1, and the loss is
Eq. 2 itself, unchanged. In `cross` mode each completion of agent i sits in G^(N-1) joint actions; its return is
the *mean* of theirs (CoMLRL sums them instead, which only rescales the advantage by G^(N-1)).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

JOINT_MODES = ("aligned", "cross")
ADVANTAGE_MODES = ("mean", "rloo", "max", "raw", "none", "marginal", "role")  # none: raw, as older configs say
ADVANTAGE_ALIASES = {"mareinforce": "raw", "marloo": "rloo", "maremax": "max"}  # CoMLRL's trainers' names
GROUPINGS = ("node", "turn", "agent")
SCALE_REWARDS = ("group", "batch", "none")
LOSS_TYPES = ("sum", "grpo", "dr_grpo", "token_mean", "dapo", "bnpo")
PER_ROW_LOSSES = ("sum", "grpo", "dr_grpo")  # a mean over rows; the others are a mean over completion tokens
ROLLOUT_CORRECTIONS = ("none", "token_truncate", "sequence_mask")


def joint_actions(num_agents: int, num_generations: int, mode: str = "aligned") -> list[tuple[int, ...]]:
    """Indices (one completion index per agent) of every joint action of one group."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode={mode!r}; allowed: {JOINT_MODES}")


def per_agent_returns(joint_returns, joints: list[tuple[int, ...]], num_agents: int,
                      num_generations: int) -> np.ndarray:
    """(N, G): the return of completion g of agent i, the mean over the joint actions that contain it.
    joint_returns: (J,) the team's, or (J, N) one per agent (agent i reads column i)."""
    joint_returns = np.asarray(joint_returns, dtype=np.float64)
    out = np.zeros((num_agents, num_generations))
    count = np.zeros((num_agents, num_generations))
    for ret, idx in zip(joint_returns, joints):
        for agent, g in enumerate(idx):
            out[agent, g] += ret[agent] if ret.ndim else ret
            count[agent, g] += 1
    if (count == 0).any():
        raise ValueError("every completion must appear in at least one joint action")
    return out / count


def node_returns(rewards, child_returns=None, discount: float = 1.0) -> np.ndarray:
    """R_j = r_j + discount * mean(children of j's returns); leaves (no children) return r_j.

    rewards: (J,) immediate rewards of a node's joint actions, or (J, N) one per agent (a team/local mix).
    child_returns: None, or a list of J arrays, each holding the returns ((J',) or (J', N)) of the joint actions
    of the child node that joint action j led to.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if child_returns is None:
        return rewards.copy()
    if len(child_returns) != len(rewards):
        raise ValueError(f"{len(rewards)} joint actions but {len(child_returns)} child groups")
    future = np.array([np.mean(c, axis=0) for c in child_returns], dtype=np.float64)
    return rewards + discount * future


def scale_mode(scale) -> str:
    """scale_rewards as a name; True/False are what configs before the named modes held (group / none)."""
    if scale is True or scale is False:
        return "group" if scale else "none"
    if scale not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards={scale!r}; allowed: {SCALE_REWARDS}")
    return scale


def advantages(returns, mode: str = "mean", scale: str | bool = "none", clip: float | None = None,
               eps: float = 1e-6, batch_std: float | None = None) -> np.ndarray:
    """Group-relative advantages over the last axis (the group of G completions).

    scale "batch" divides by `batch_std` (the std of every return of the step, over all processes) or, when it is
    not given, by the std of all of `returns`."""
    r = np.asarray(returns, dtype=np.float64)
    g = r.shape[-1]
    mode = ADVANTAGE_ALIASES.get(mode, mode)
    if mode in ("mean", "marginal"):  # marginal: the returns are already means over the partners (cross)
        a = r - r.mean(-1, keepdims=True)
    elif mode == "rloo":
        if g < 2:
            raise ValueError("rloo needs a group of at least 2")
        a = r - (r.sum(-1, keepdims=True) - r) / (g - 1)
    elif mode == "max":
        a = r - r.max(-1, keepdims=True)
    elif mode in ("raw", "none"):
        a = r.copy()
    elif mode == "role":
        raise ValueError("advantage_mode='role' subtracts a moving baseline: use role_advantages")
    else:
        raise ValueError(f"advantage_mode={mode!r}; allowed: {ADVANTAGE_MODES}")
    return scale_and_clip(a, r, scale, clip, eps, batch_std)


def scale_and_clip(a: np.ndarray, r: np.ndarray, scale: str | bool = "none", clip: float | None = None,
                   eps: float = 1e-6, batch_std: float | None = None) -> np.ndarray:
    """scale_rewards and advantage_clip applied to advantages `a` of the returns `r` (groups on the last axis)."""
    scale = scale_mode(scale)
    if scale == "group":
        a = a / (r.std(-1, keepdims=True) + eps)  # population std of the group's returns
    elif scale == "batch":
        a = a / ((r.std() if batch_std is None else batch_std) + eps)
    if clip is not None:
        a = np.clip(a, -clip, clip)
    return a


def marginal_advantages(joint_returns, joints: list[tuple[int, ...]], num_agents: int,
                        num_generations: int) -> np.ndarray:
    """(N, G): A_i(k) = M_i(k) - mean_k' M_i(k'), M_i(k) the mean joint return over the partners' samples agent
    i's sample k was paired with. Needs every combination (cross): aligned pairs a sample with one partner only."""
    if sorted(joints) != joint_actions(num_agents, num_generations, "cross"):
        raise ValueError("advantage_mode='marginal' needs the joint actions of joint_mode='cross' (every sample of "
                         "an agent paired with every combination of its partners' samples)")
    return advantages(per_agent_returns(joint_returns, joints, num_agents, num_generations), "marginal")


def grouped_advantages(returns, groups, mode: str = "mean", scale: str | bool = "none", clip: float | None = None,
                       eps: float = 1e-6, batch_std: float | None = None) -> np.ndarray:
    """Advantages of per-agent returns (M, N, G) at M nodes whose groups are labelled `groups` (M,): agent i's
    group is its samples at every node with the same label (grouping turn/agent). marginal keeps each node's own
    mean as the baseline (the counterfactual lives at a node); the label's group gives the std only."""
    r = np.asarray(returns, dtype=np.float64)
    M, N, G = r.shape
    labels, out = np.asarray(groups), np.empty_like(r)
    for label in dict.fromkeys(labels.tolist()):
        idx = np.flatnonzero(labels == label)
        pooled = r[idx].transpose(1, 0, 2).reshape(N, -1)  # (N, nodes x G)
        if mode == "marginal":
            centred = (r[idx] - r[idx].mean(-1, keepdims=True)).transpose(1, 0, 2).reshape(N, -1)
            a = scale_and_clip(centred, pooled, scale, clip, eps, batch_std)
        else:
            a = advantages(pooled, mode, scale, clip, eps, batch_std)
        out[idx] = a.reshape(N, len(idx), G).transpose(1, 0, 2)
    return out


def role_advantages(returns, baseline, scale: str | bool = "none", clip: float | None = None, eps: float = 1e-6,
                    batch_std: float | None = None) -> np.ndarray:
    """A = R - b_role: returns (..., N, G) of N roles, baseline (N,) (SPIRAL's role-conditioned advantage)."""
    r = np.asarray(returns, dtype=np.float64)
    return scale_and_clip(r - np.asarray(baseline, dtype=np.float64)[:, None], r, scale, clip, eps, batch_std)


def role_baseline(baseline, batch_mean, decay: float) -> tuple[np.ndarray, np.ndarray]:
    """(b used by this batch, b after it) per role: b' = decay * b + (1 - decay) * batch mean. A role without
    a baseline yet (NaN) starts at its first batch's mean (a baseline of 0 would push every first sample up)."""
    b, m = np.asarray(baseline, dtype=np.float64), np.asarray(batch_mean, dtype=np.float64)
    used = np.where(np.isnan(b), m, b)
    return used, decay * used + (1 - decay) * m


def mix_rewards(team, local, weight: float) -> np.ndarray:
    """(J, N) r_i = (1 - w) r + w local_i: team (J,) rewards of the joint actions, local (J, N) each agent's part."""
    team, local = np.asarray(team, dtype=np.float64), np.asarray(local, dtype=np.float64)
    return (1 - weight) * team[:, None] + weight * local


def local_parts(parts: dict, num_agents: int) -> list[float]:
    """An agent's local reward per agent from a Reward's parts: local_0 .. local_{N-1}."""
    missing = [f"local_{i}" for i in range(num_agents) if f"local_{i}" not in parts]
    if missing:
        raise ValueError(f"local_reward_weight > 0 needs rewards whose parts hold local_0 .. local_{num_agents - 1} "
                         f"(each agent's own reward); missing {', '.join(missing)} in parts {sorted(parts)}")
    return [float(parts[f"local_{i}"]) for i in range(num_agents)]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] per position without materialising the full log-softmax twice.

    logits: (R, T, V), targets: (R, T) -> (R, T)
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature  # in fp32, as the sampler's TemperatureLogitsWarper divides
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (R, T)
    return picked - torch.logsumexp(logits, dim=-1)


class _HeadLogProbs(torch.autograd.Function):
    """log softmax(h W^T / tau)[target] for N positions, CHUNK positions at a time, recomputed in backward.

    d logp_n / d h_n = (W[target_n] - sum_v p_nv W[v]) / tau,  p_n = softmax(h_n W^T / tau)   (W frozen)
    Only one (CHUNK, V) block of logits is alive at a time, in the forward and in the backward; with a
    151,936-token vocabulary the full fp32 logits of a step's rows are gigabytes.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, temperature):  # (N, H), (V, H), (N,) -> (N,) float32
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for i in range(0, hidden.shape[0], chunk):
            logits = _logits(hidden[i:i + chunk], weight, temperature)  # (c, V)
            out[i:i + chunk] = logits.gather(-1, targets[i:i + chunk, None])[:, 0] - logits.logsumexp(-1)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk, ctx.temperature = chunk, temperature
        return out

    @staticmethod
    def backward(ctx, grad):  # grad: (N,)
        hidden, weight, targets = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden)
        for i in range(0, hidden.shape[0], ctx.chunk):
            logits = _logits(hidden[i:i + ctx.chunk], weight, ctx.temperature)  # (c, V)
            g = torch.softmax(logits, -1).mul_(-grad[i:i + ctx.chunk, None])  # -grad * p
            g.scatter_add_(-1, targets[i:i + ctx.chunk, None], grad[i:i + ctx.chunk, None].float())  # + grad * onehot
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad_hidden[i:i + ctx.chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
        return grad_hidden, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """(c, H) -> (c, V) float32 logits / temperature, the division in fp32 as the sampler's."""
    logits = (hidden.to(weight.dtype) @ weight.t()).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  chunk: int = 1024, temperature: float = 1.0) -> torch.Tensor:
    """token_logprobs(hidden @ weight^T, targets, temperature) without materialising the logits of all positions.

    hidden: (R, T, H) final hidden states, weight: (V, H) the frozen output layer, targets: (R, T) -> (R, T)
    """
    R, T, H = hidden.shape
    out = _HeadLogProbs.apply(hidden.reshape(R * T, H), weight, targets.reshape(R * T), chunk, float(temperature))
    return out.view(R, T)


def rollout_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                    correction: str = "token_truncate", cap: float = 2.0) -> tuple[torch.Tensor, dict]:
    """Importance weights w (R, T) for tokens sampled by the sampler and scored by the trainer, and the
    mismatch's sums, for metrics over many micro-batches: divide k3, rho and past_cap by "tokens", and
    rows_past_cap (completions whose geometric-mean ratio exceeds the cap) by "rows".

    old_logp: the trainer's log-probs of the sampled tokens (before any step on this batch), sampler_logp: the
    sampler's, mask: 1 on completion tokens. rho = exp(old - sampler); see the module docstring for each mode.
    """
    m = mask.bool()
    if not torch.isfinite(sampler_logp[m]).all():
        raise ValueError("the sampler's log-probs of some sampled tokens are not finite (an engine that sampled "
                         "without per-row seeds, or one that returns no log-probs): they cannot weigh the update")
    log_rho = torch.where(m, old_logp.detach().double() - sampler_logp.double(), 0.0)  # (R, T); 0 off the mask
    rho = log_rho.exp()
    rows = m.any(-1)  # rows with a completion token (an empty completion has no ratio)
    seq = (log_rho.sum(-1) / m.sum(-1).clamp(min=1)).exp()  # (R,), the geometric mean of the row's ratios
    if correction == "none":
        w = torch.ones_like(rho)
    elif correction == "token_truncate":
        w = rho.clamp(max=cap)
    elif correction == "sequence_mask":
        w = torch.where(seq <= cap, seq, 0.0)[:, None].expand_as(rho)
    else:
        raise ValueError(f"rollout_correction={correction!r}; allowed: {ROLLOUT_CORRECTIONS}")
    k3 = rho - log_rho - 1  # 0 off the mask (rho = 1 there)
    sums = {"tokens": float(m.sum()), "k3": float(k3.sum()), "rho": float(rho[m].sum()),
            "rho_max": float(rho[m].max()) if m.any() else 1.0, "past_cap": float((rho[m] > cap).sum()),
            "rows": float(rows.sum()), "rows_past_cap": float((rows & (seq > cap)).sum())}
    return torch.where(m, w, 0.0).to(old_logp.dtype), sums


def policy_loss(logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, loss_type: str = "sum",
                ref_logp: torch.Tensor | None = None, beta: float = 0.0, *, weights: torch.Tensor | None = None,
                old_logp: torch.Tensor | None = None, epsilon: float = 0.2, epsilon_high: float | None = None,
                max_tokens: int | None = None) -> tuple[torch.Tensor, dict]:
    """MAGRPO loss for one agent's rows.

    logp, mask: (R, T) completion-token log-probs and a 0/1 mask (prompt and padding are 0); adv: (R,).
    weights: (R, T) rollout-correction weights (`rollout_weights`, no gradient), or None for 1.
    old_logp: None for the on-policy loss (Eq. 2); given, the clipped-ratio loss against these log-probs.
    max_tokens: the completion cap, which dr_grpo divides by.
    Returns (loss, stats) with stats holding floats for logging.
    """
    mask = mask.to(logp.dtype)
    adv = adv.to(logp.dtype)[:, None]  # (R, 1)
    if old_logp is None:
        per_token = -adv * logp
        clipped = None
    else:
        ratio = torch.exp(logp - old_logp.detach())
        high = epsilon if epsilon_high is None else epsilon_high
        bounded = ratio.clamp(1 - epsilon, 1 + high)
        per_token = -torch.min(ratio * adv, bounded * adv)
        clipped = ((bounded * adv < ratio * adv) & (mask > 0)).to(logp.dtype)  # the clipped branch is taken
    if weights is not None:
        per_token = per_token * weights.detach()
    loss = reduce(per_token, mask, loss_type, max_tokens)
    stats = {"pg_loss": float(loss.detach())}
    if clipped is not None:  # counts, so that micro-batches add up (the fraction is clipped / tokens)
        stats["clipped"], stats["tokens"] = float(clipped.sum()), float(mask.sum())
        stats["clip_fraction"] = stats["clipped"] / max(stats["tokens"], 1.0)
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs under the base model)")
        diff = ref_logp - logp
        k3 = (torch.exp(diff) - diff - 1) * mask  # (R, T), >= 0
        kl = reduce(k3, mask, loss_type, max_tokens)
        loss = loss + beta * kl
        stats["kl"] = float(kl.detach())
    return loss, stats


def reduce(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_tokens: int | None = None) -> torch.Tensor:
    """(R, T) per-token terms -> the loss_type's scalar over these rows (see the module docstring)."""
    masked = torch.where(mask.bool(), per_token, 0.0)  # not a product: inf * 0 off the mask would be NaN
    if loss_type == "sum":
        return masked.sum(-1).mean()
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.shape[0] * (max_tokens or per_token.shape[1]))
    if loss_type in ("token_mean", "dapo", "bnpo"):
        return masked.sum() / mask.sum().clamp(min=1)
    raise ValueError(f"loss_type={loss_type!r}; allowed: {LOSS_TYPES}")
