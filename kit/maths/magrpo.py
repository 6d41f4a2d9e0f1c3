"""MAGRPO maths: joint actions, returns and group-relative advantages (the policy loss: kit/maths/losses.py).

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
    leniency        (cross only) M_i(k) = (1 - kappa) mean + kappa max of R over those joint actions: agent i's
                    sample is judged by its partners' best answer to it, not their average (lenient learners)
                    role (SPIRAL's RAE):         A = R - b_role, b_role <- decay b_role + (1 - decay) mean R_role
                    CoMLRL's names: mareinforce = raw, marloo = rloo, maremax = max
                    scale_rewards: group divides by the group's std, batch by the std over the whole batch
                    (both population std, + eps); then optional clamping to [-c, c]
    normalize_then_sum (GDPO) A = sum_k w_k (R_k - mean_g R_k) / (std_g R_k + eps), then divided by its std over
                    the step (TRL; sum_then_normalize, the default, takes the advantage of sum_k w_k R_k)

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

In `cross` mode each completion of agent i sits in G^(N-1) joint actions; its return is the *mean* of theirs
(CoMLRL sums them instead, which only rescales the advantage by G^(N-1)).
"""

from __future__ import annotations

import itertools

import numpy as np

JOINT_MODES = ("aligned", "cross")
ADVANTAGE_MODES = ("mean", "rloo", "max", "raw", "none", "marginal", "role")  # none: raw, as older configs say
ADVANTAGE_ALIASES = {"mareinforce": "raw", "marloo": "rloo", "maremax": "max"}  # CoMLRL's trainers' names
GROUPINGS = ("node", "turn", "agent")
SCALE_REWARDS = ("group", "batch", "none")
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def joint_actions(num_agents: int, num_generations: int, mode: str = "aligned") -> list[tuple[int, ...]]:
    """Indices (one completion index per agent) of every joint action of one group."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode={mode!r}; allowed: {JOINT_MODES}")


def per_agent_returns(joint_returns, joints: list[tuple[int, ...]], num_agents: int,
                      num_generations: int, leniency: float = 0.0) -> np.ndarray:
    """(N, G): the return of completion g of agent i, the mean over the joint actions that contain it; with
    `leniency` kappa, (1 - kappa) * that mean + kappa * their max (`lenient`).
    joint_returns: (J,) the team's, or (J, N) one per agent (agent i reads column i)."""
    joint_returns = np.asarray(joint_returns, dtype=np.float64)
    out = np.zeros((num_agents, num_generations))
    best = np.full((num_agents, num_generations), -np.inf)
    count = np.zeros((num_agents, num_generations))
    for ret, idx in zip(joint_returns, joints):
        for agent, g in enumerate(idx):
            value = ret[agent] if ret.ndim else ret
            out[agent, g] += value
            best[agent, g] = max(best[agent, g], value)
            count[agent, g] += 1
    if (count == 0).any():
        raise ValueError("every completion must appear in at least one joint action")
    return out / count if leniency == 0 else (1 - leniency) * out / count + leniency * best


def lenient(returns, leniency: float) -> np.ndarray:
    """(..., K) returns of one sample paired with K partner answers -> (...,): (1 - kappa) mean + kappa max.

    Lenient learners (Panait, Sullivan and Luke, AAMAS 2006): early on, a partner's poor answer to a good move says
    more about the partner than about the move, so the move is judged optimistically, by the best answer it got.
    It lets a team leave a safe equilibrium that a mean over untrained partners keeps it in (Tiny Hanabi's
    card-blind 8); kappa = 0 is the mean (marginal)."""
    r = np.asarray(returns, dtype=np.float64)
    return (1 - leniency) * r.mean(-1) + leniency * r.max(-1)


def leniency_at(leniency: float, decay_steps: int, step: int) -> float:
    """kappa at a step (0 = the first): constant, or linearly down to 0 over `decay_steps` steps."""
    if decay_steps <= 0:
        return float(leniency)
    return float(leniency) * max(0.0, 1.0 - step / decay_steps)


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


def normalize_then_sum(returns, weights, mode: str = "mean", eps: float = 1e-6) -> np.ndarray:
    """GDPO's aggregation before the step's normalisation: (K, ..., G) returns, one per reward function ->
    sum_k w_k A_k / (std_g R_k + eps), A_k the group advantage of reward k (advantage_mode), std its group's
    population std. The trainer then divides by the std of the sum over the step (`advantages(.., "raw", "batch")`).
    """
    returns = np.asarray(returns, dtype=np.float64)
    if len(weights) != len(returns):
        raise ValueError(f"{len(returns)} rewards but {len(weights)} reward_weights")
    return sum(w * advantages(r, mode, "group", eps=eps) for w, r in zip(weights, returns))


def tied_groups(returns, *, axis: int = -1) -> np.ndarray:
    """True where every return of a group (the last axis) is the same: its advantages are all 0 (or all equal)."""
    r = np.asarray(returns, dtype=np.float64)
    return np.isclose(r, r.take([0], axis=axis)).all(axis)


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
