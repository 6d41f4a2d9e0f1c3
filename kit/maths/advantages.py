"""The step's returns and group-relative advantages: the MAGRPO box of the loop. kit/trainers/trainer.py calls
`returns_and_advantages` once per step, after scoring; an algorithm with a critic then replaces the advantages
(kit/trainers/critic.py).

    returns      up the rollout tree, the team's reward (kit/maths/magrpo.py node_returns); with `local_reward_weight`
                 also per agent, r_i = (1 - w) r + w local_i
    advantages   per `grouping` (node: an agent's G samples at one node; turn; agent), against the moving role
                 baseline (`advantage_mode=role`; its state, `trainer.role_baseline`, is in the checkpoint), or each
                 reward normalised in its group before the weighted sum (`normalize_then_sum`)
    ties         per node and agent: whether the group's returns all tie (no advantage to learn from)

Functions of the trainer rather than methods: they read its config, reward model and process group (the std over
every process) and write their results onto the step's levels. The maths itself is kit/maths/magrpo.py's.
Run its tests: python -m pytest tests/test_config_reaches_maths.py tests/test_credit.py
"""

from __future__ import annotations

import numpy as np

from kit.maths import magrpo


def returns_and_advantages(trainer, levels: list) -> None:
    """Returns up the tree (the team's; per agent with a team/local mix), then advantages per `grouping` or
    against the moving role baseline (kit/maths/magrpo.py)."""
    cfg, N, G = trainer.cfg, trainer.cfg.num_agents, trainer.cfg.num_generations
    w = cfg.local_reward_weight
    child_returns, child_mixed = None, None
    per_reward = cfg.multi_objective_aggregation == "normalize_then_sum"
    child_parts = None  # normalize_then_sum: each reward's returns, (J, K) per node
    for level in reversed(levels):
        joints = level.joints
        returns, mixed = [], []
        for n, node_rewards in enumerate(level.rewards):
            r = [trainer.reward_model.process(x.total) for x in node_rewards]
            kids = None if child_returns is None else [child_returns[n * len(joints) + j]
                                                      for j in range(len(joints))]
            returns.append(magrpo.node_returns(r, kids, cfg.discount))
            if w > 0:  # r_i = (1 - w) r + w local_i, each processed as the team's reward is
                local = [[trainer.reward_model.process(v) for v in magrpo.local_parts(x.parts, N)]
                         for x in node_rewards]
                mine = None if child_mixed is None else [child_mixed[n * len(joints) + j]
                                                         for j in range(len(joints))]
                mixed.append(magrpo.node_returns(magrpo.mix_rewards(r, local, w), mine, cfg.discount))
        level.returns = np.array(returns)  # (nodes, J) the team's
        agent_returns = np.array(mixed) if w > 0 else level.returns  # (nodes, J, N) or (nodes, J)
        kappa = magrpo.leniency_at(cfg.leniency, cfg.leniency_decay_steps, trainer.step)  # 0 unless cross
        level.per_agent = per_agent = np.stack([magrpo.per_agent_returns(R, joints, N, G, kappa)
                                                for R in agent_returns])
        level.ties = magrpo.tied_groups(per_agent)  # (nodes, N): groups with nothing to learn from
        if per_reward:  # per node (validate refuses it with role, grouping or local rewards)
            level.advantages, child_parts, level.ties = normalize_then_sum(trainer, level, child_parts)
        child_returns, child_mixed = list(level.returns), list(agent_returns) if w > 0 else None
    how = dict(mode=cfg.advantage_mode, scale=cfg.scale_rewards, clip=cfg.advantage_clip)
    if per_reward:
        pass  # done above, level by level
    elif cfg.advantage_mode == "role":
        role_advantages(trainer, levels)
    elif cfg.grouping == "agent":  # one group per agent and item over every turn
        every = np.concatenate([lv.per_agent for lv in levels])  # (all nodes, N, G)
        adv = magrpo.grouped_advantages(every, [node["item"] for lv in levels for node in lv.nodes], **how,
                                        batch_std=trainer.batch_std(every))
        for lv, part in zip(levels, np.split(adv, np.cumsum([len(lv.nodes) for lv in levels])[:-1])):
            lv.advantages = part
    else:
        for level in levels:
            per_agent = level.per_agent
            if cfg.grouping == "turn":  # one group per agent, item and turn
                level.advantages = magrpo.grouped_advantages(per_agent, [node["item"] for node in level.nodes],
                                                             **how, batch_std=trainer.batch_std(per_agent))
                continue
            level.advantages = magrpo.advantages(per_agent, cfg.advantage_mode, cfg.scale_rewards,
                                                 cfg.advantage_clip, batch_std=trainer.batch_std(per_agent))

def role_advantages(trainer, levels: list) -> None:
    """advantage_mode=role: A = R - b[turn, agent], then the baseline moves toward this step's mean return of
    each (turn, agent) over every process (kit/maths/magrpo.py role_baseline)."""
    cfg, N = trainer.cfg, trainer.cfg.num_agents
    if trainer.role_baseline is None:
        trainer.role_baseline = np.full((cfg.num_turns, N), np.nan)
    sums = trainer.dist.sum([float(x) for lv in levels for x in lv.per_agent.sum(axis=(0, 2))] +
                         [float(lv.per_agent[:, 0].size) for lv in levels])  # (turns x N) sums, then counts
    means = np.array(sums[:len(levels) * N]).reshape(len(levels), N) / np.array(sums[len(levels) * N:])[:, None]
    for lv, mean in zip(levels, means):
        used, trainer.role_baseline[lv.turn] = magrpo.role_baseline(trainer.role_baseline[lv.turn], mean,
                                                                 cfg.role_baseline_decay)
        lv.advantages = magrpo.role_advantages(lv.per_agent, used, scale=cfg.scale_rewards,
                                               clip=cfg.advantage_clip, batch_std=trainer.batch_std(lv.per_agent))

def normalize_then_sum(trainer, level, child_parts):
    """multi_objective_aggregation=normalize_then_sum: each reward's own returns through the tree (processed,
    discounted like the total), its group advantage over its group's std, the weighted sum, divided by the
    sum's std over the step and clipped (kit/maths/magrpo.py). Returns (advantages, each node's per-reward returns
    (J, K), ties: the groups where every reward ties)."""
    cfg, N, G, model = trainer.cfg, trainer.cfg.num_agents, trainer.cfg.num_generations, trainer.reward_model
    J, K = len(level.joints), len(model.source_names())
    parts = []
    for n, node_rewards in enumerate(level.rewards):
        values = np.array([[model.process(v) for v in model.source_values(x)] for x in node_rewards])  # (J, K)
        kids = None if child_parts is None else [child_parts[n * J + j] for j in range(J)]
        parts.append(np.stack([magrpo.node_returns(values[:, k], None if kids is None else
                                                   [kid[:, k] for kid in kids], cfg.discount)
                               for k in range(K)], -1))  # (J, K)
    kappa = magrpo.leniency_at(cfg.leniency, cfg.leniency_decay_steps, trainer.step)
    per_agent = np.stack([np.stack([magrpo.per_agent_returns(p[:, k], level.joints, N, G, kappa) for p in parts])
                          for k in range(K)])  # (K, nodes, N, G)
    summed = magrpo.normalize_then_sum(per_agent, model.weights or [1.0] * K, cfg.advantage_mode)
    adv = magrpo.advantages(summed, "raw", "batch", cfg.advantage_clip, batch_std=trainer.step_std(summed))
    return adv, parts, magrpo.tied_groups(per_agent).all(0)
