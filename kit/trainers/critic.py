"""The algorithm seam of the loop, and the critics of IAC and MAAC (CoMLRL's actor-critic trainers).

    algorithm = algorithm_for(cfg, team)      # built once by the Trainer
    algorithm.advantages(trainer, levels)     # after the group-relative advantages: replace them (critics)
    algorithm.actors_wait(step)               # critic_warmup_steps: the actors skip their update
    algorithm.backward_into_actor(trainer, adapter, iteration)  # in the update, before each actor's step
    stats = algorithm.fit(trainer)            # after the actors' update: fit its own models; metrics
    algorithm.models / optimizers / schedulers   # what the checkpoint saves and resume loads (kit/run/checkpoint.py)

`MAGRPO` is the trivial algorithm: it keeps the advantages the loop computed (kit/maths/magrpo.py), has no model and
fits nothing. `ActorCritic` (algorithm=iac or maac) owns critics, each a kit/engine/heads.py ScalarModel (one more LoRA
adapter on the team's shared base plus a fp32 head) with its own AdamW (critic_learning_rate) and schedule:

    iac   one critic per agent, reading that agent's prompt (v) or prompt + completion (q)
    maac  one centralized critic reading every agent's prompt as "[Agent i] prompt_i" blocks (v), and for q each
          block followed by the agent's completion: the joint action

What a critic reads is text: the prompt as the sampler formatted it (chat template or not), then the completion.
Values and targets (kit/maths/actor_critic.py): per turn, the lambda-return of every joint action
    y = r + discount * ((1 - gae_lambda) * S(child node) + gae_lambda * mean y(child node's joint actions)),
S = V(prompt) for v, the group mean of Q for q; one turn: y = r (the reward, as MAGRPO's return).
    v: A_i,g = y (agent i's completion g, the mean over the joint actions holding it) - V_i(s)
    q: A_i,g = Q_i(s, a_g) - mean_h Q_i(s, a_h)  (maac: the joint Q, averaged as MAGRPO averages returns)
       baseline=counterfactual (maac, aligned): Q(s, a_i^g, a_-i^g) - mean_k Q(s, a_i^k, a_-i^g), the N G^2 joint
       actions with one agent's action swapped scored in one batched pass (duplicates once)
then advantage_normalization (each agent over the step and every process). Fit: num_iterations AdamW steps on
value_loss_coef * the clipped value loss of every text against its target, the gradient summed over processes.

use_separate_critic=false (iac only): critic_i is a kit/engine/heads.py ValueHead, an fp32 head reading agent i's OWN
adapter (no new adapter), as CoMLRL's value head on the actor. The value loss trains the head and the actor's
adapter; the adapter takes ONE step per iteration, by the actor's own AdamW (learning_rate, its schedule and
max_grad_norm), on the sum of the two gradients:

    adapter a:  grad [ L_policy(a) + value_loss_coef * sum_{i on a} sum_rows L_V / rows(i on a) ]
    head i:     its own AdamW (critic_learning_rate, its schedule), the same backward, stepped beside the adapter

The update calls backward_into_actor after the policy loss's backward and before the actor's step, every
iteration (V_old: the values that gave the advantages, so value_clip_range acts from the second). Stepping the
adapter with a second optimizer instead would give it two AdamW states and two weight decays, and AdamW's
per-parameter scaling would cancel value_loss_coef; one optimizer on the summed gradient keeps the coefficient the
weight of the value loss against the policy loss. share_adapter=true: one head per agent on the one adapter, the
value loss the mean over every head's rows (as the policy loss is over every agent's). critic_warmup_steps: the
actors' adapters wait, so the heads alone fit (num_iterations steps, the decoder without gradient). The heads
start at zero (V = 0), so the value gradient reaches an adapter from its head's second step on (dV/dh = w). A
checkpoint holds each head (models/critic_i/head.safetensors) and its optimizer; the adapter is the agent's.

Games (GameTrainer): every decision is a row; rewards are 0 until the episode's return at its last decision. IAC:
each player's critic over that player's own decisions (its observation; q: and its move); MAAC: one critic over
all decisions, reading every player's observation at that moment (the episode is replayed from its seed), q: and
the acting player's move (IAC: the return at each player's own last decision). Fit targets: each decision's
lambda-return, GAE + V over its sequence (the discount per decision). Advantages: GAE over the sequence (v); q: Q
minus the mean Q of the step's decisions that saw the same critic input without the move, over every process
(turn-based: only the actor moves, so COMA's baseline is that mean).

MARLHF (algorithm=marlhf, marlhf_rl_algorithm=iac or maac, kit/trainers/marlhf.py): the same critics, with r the reward
model's score of each joint action in place of the task's reward (separate critics only).

Not covered: target networks; MAAC with use_separate_critic=false (refused: its critic reads every agent).
Run its tests: python -m pytest tests/test_critic.py

Past 400 lines on purpose: the seam and the two critic families behind it are one concept (what replaces
MAGRPO's advantages), kept beside each other so the three can be read against each other; the maths is
kit/maths/actor_critic.py.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from kit.maths import actor_critic as ac
from kit.maths import magrpo
from kit.run.config import rl_algorithm


class MAGRPO:
    """The loop's own algorithm: group-relative advantages (already computed), no extra model."""

    name = "magrpo"

    def __init__(self, cfg=None, team=None, log=print, schedule=None):
        self.cfg = cfg
        self.models, self.optimizers, self.schedulers = {}, {}, {}

    def advantages(self, trainer, levels) -> None:
        """Joint-action tasks: replace `level.advantages` (nodes, N, G) in place; MAGRPO keeps them."""

    def game_advantages(self, trainer, rounds, episodes) -> np.ndarray | None:
        """Games: per-decision advantages (one per request of every round, rounds in order), or None to keep the
        episode's group-relative advantage on each of its decisions."""
        return None

    def actors_wait(self, step: int) -> bool:
        return False

    def backward_into_actor(self, trainer, adapter: str, iteration: int) -> None:
        """Before the actor's optimizer steps `adapter`: add this algorithm's own gradient to it (none here)."""

    def fit(self, trainer) -> dict:
        return {}


def joint_prompt(prompts, completions=None) -> str:
    """MAAC's critic input: "[Agent i] prompt_i" blocks, each followed by the agent's completion for q."""
    blocks = []
    for i, p in enumerate(prompts):
        blocks.append(f"[Agent {i}] {p}" + ("" if completions is None else f"\n{completions[i]}"))
    return "\n".join(blocks)


class ActorCritic(MAGRPO):
    """IAC (one critic per agent) or MAAC (one centralized critic); see the module docstring."""

    def __init__(self, cfg, team, log=print, schedule=None):
        super().__init__(cfg, team, log)
        from kit.engine.heads import ScalarModel, ValueHead
        from kit.engine.models import lora_config

        self.name, self.team = rl_algorithm(cfg), team  # marlhf's RL stage: marlhf_rl_algorithm
        self.shared = self.name == "iac" and not cfg.use_separate_critic  # value heads on the actors' adapters
        names = [f"critic_{i}" for i in range(cfg.num_agents)] if self.name == "iac" else ["critic"]
        lcfg = lora_config(cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules)
        lr = cfg.critic_learning_rate or cfg.learning_rate
        for k, name in enumerate(names):
            if self.shared:
                model = ValueHead(team, name, team.adapter_of[k])
            else:
                model = ScalarModel(team, name, lcfg, seed=cfg.seed + 1 + k)
            self.models[name] = model
            self.optimizers[name] = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.weight_decay)
            self.schedulers[name] = schedule(self.optimizers[name], cfg)  # the agents' schedule (Trainer's)
        self.batch: dict[str, tuple[list[str], list[float], list[float]]] = {}  # texts, targets, old values
        self._fitted: dict[str, tuple[float, float]] = {}  # shared heads: the update's first (loss, grad norm)
        where = ("value heads on the agents' own adapters (use_separate_critic=false)" if self.shared
                 else "critic(s) on the shared base")
        log(f"[kit] algorithm={self.name} critic_type={cfg.critic_type}: {len(names)} {where} "
            f"({', '.join(names)})")

    def critic_of(self, agent: int) -> str:
        return f"critic_{agent}" if self.name == "iac" else "critic"

    def fmt(self, prompt: str) -> str:
        from kit.engine.rollout import format_prompt

        return format_prompt(self.team.tokenizers[0], prompt, self.cfg.use_chat_template)

    @torch.no_grad()
    def values(self, name: str, texts: list[str]) -> np.ndarray:
        """The critic's scores of `texts` (no gradient, eval mode), each distinct text once, in micro-batches."""
        unique = list(dict.fromkeys(texts))
        model, step = self.models[name], self.cfg.micro_batch_size or len(unique) or 1
        model.model.eval()
        out = {}
        for lo in range(0, len(unique), step):
            chunk = unique[lo:lo + step]
            out.update(zip(chunk, model.score_texts(chunk, train_trunk=False).double().cpu().numpy()))
        return np.array([out[t] for t in texts], dtype=np.float64)

    def actors_wait(self, step: int) -> bool:
        return step < self.cfg.critic_warmup_steps

    # ---- joint-action tasks (kit/trainers/trainer.py)

    def advantages(self, trainer, levels) -> None:
        cfg, N, G = self.cfg, self.cfg.num_agents, self.cfg.num_generations
        C, q = len(self.models), cfg.critic_type == "q"
        names = list(self.models)
        texts = {name: [] for name in names}  # every text a critic scores this step (for fit), per level below
        found = []  # per level: (S (nodes, C), estimates for the advantages)
        for lv in levels:
            comps = [[trainer.joint(lv.rollout, n, (g,) * N) for g in range(G)] for n in range(len(lv.nodes))]
            # comps[n][g][i]: agent i's completion g at node n (aligned view: every completion of every agent)
            if self.name == "iac":
                rows = {i: [self.fmt(node["prompts"][i]) + (comps[n][g][i] if q else "")
                            for n, node in enumerate(lv.nodes) for g in range(G if q else 1)] for i in range(N)}
                vals = {i: self.values(self.critic_of(i), rows[i]).reshape(len(lv.nodes), -1) for i in range(N)}
                est = np.stack([vals[i] for i in range(N)], 1)  # (nodes, N, G) for q, (nodes, N, 1) for v
                S = est.mean(-1)  # (nodes, C = N)
                lv_texts = {self.critic_of(i): rows[i] for i in range(N)}
            else:
                if q:
                    rows = [joint_prompt(node["prompts"], [comps[n][g][i] for i, g in enumerate(idx)])
                            for n, node in enumerate(lv.nodes) for idx in lv.joints]
                else:
                    rows = [joint_prompt(node["prompts"]) for node in lv.nodes]
                est = self.values("critic", rows).reshape(len(lv.nodes), -1)  # (nodes, J) or (nodes, 1)
                S = est.mean(-1)[:, None]  # (nodes, 1)
                lv_texts = {"critic": rows}
            found.append((S, est, lv_texts))
        # lambda-returns from the last turn back: (nodes, C, J) per level
        ys, child = [None] * len(levels), None
        for t in reversed(range(len(levels))):
            lv, (S, est, _) = levels[t], found[t]
            r = np.array([[trainer.reward_model.process(x.total) for x in node] for node in lv.rewards])  # (nodes, J)
            J = r.shape[1]
            if child is None:
                next_v, next_y = np.zeros((len(lv.nodes), C, J)), np.zeros((len(lv.nodes), C, J))
            else:
                S_next, y_next = child
                kids = np.arange(len(lv.nodes))[:, None] * J + np.arange(J)[None]  # (nodes, J) child node ids
                next_v = S_next[kids].transpose(0, 2, 1)  # (nodes, C, J)
                next_y = y_next[kids].mean(-1).transpose(0, 2, 1)
            ys[t] = ac.lambda_returns(r[:, None, :], next_v, next_y, cfg.discount, cfg.gae_lambda)
            child = (S, ys[t])
        adv_all = []
        for t, lv in enumerate(levels):
            S, est, lv_texts = found[t]
            y = ys[t]
            per_agent_y = np.stack([np.stack([magrpo.per_agent_returns(y[n, self._c(i)], lv.joints, N, G)[i]
                                              for i in range(N)]) for n in range(len(lv.nodes))])  # (nodes, N, G)
            if not q:
                adv = per_agent_y - np.stack([S[:, self._c(i)] for i in range(N)], 1)[:, :, None]
            elif self.name == "iac":
                adv = ac.q_advantages(est)
            elif cfg.baseline == "counterfactual":
                adv = self._counterfactual(trainer, lv, est)
            else:
                per_agent_q = np.stack([magrpo.per_agent_returns(est[n], lv.joints, N, G) for n in range(len(est))])
                adv = per_agent_q - est.mean(-1)[:, None, None]
            lv.advantages = adv
            adv_all.append(adv)
            # what each critic fits: its texts against their lambda-returns (v: the mean over the joint actions)
            for name, rows in lv_texts.items():
                c = names.index(name)
                if not q:
                    targets = y[:, c].mean(-1)  # (nodes,)
                elif self.name == "iac":
                    targets = per_agent_y[:, c].reshape(-1)  # (nodes * G,)
                else:
                    targets = y[:, 0].reshape(-1)  # (nodes * J,)
                texts[name].append((rows, targets, est.reshape(-1) if self.name != "iac"
                                    else est[:, c].reshape(-1)))
        self.batch = {name: ([t for rows, _, _ in parts for t in rows],
                             [float(v) for _, tg, _ in parts for v in tg],
                             [float(v) for _, _, old in parts for v in old]) for name, parts in texts.items()}
        if cfg.advantage_normalization:
            self._normalize(trainer, [lv.advantages for lv in levels])

    def _c(self, agent: int) -> int:
        return agent if self.name == "iac" else 0

    def _counterfactual(self, trainer, lv, q_joint: np.ndarray) -> np.ndarray:
        """(nodes, N, G) COMA advantages: joint g with agent i's action swapped for its own k-th sample."""
        N, G = self.cfg.num_agents, self.cfg.num_generations
        rows = []
        for n, node in enumerate(lv.nodes):
            for i in range(N):
                for g in range(G):
                    for k in range(G):
                        idx = tuple(k if a == i else g for a in range(N))
                        rows.append(joint_prompt(node["prompts"], trainer.joint(lv.rollout, n, idx)))
        swapped = self.values("critic", rows).reshape(len(lv.nodes), N, G, G)
        return ac.counterfactual_advantages(swapped)

    def _normalize(self, trainer, per_level: list[np.ndarray]) -> None:
        """Each agent's advantages over the step (every level and process) to mean 0, std 1, in place."""
        N = self.cfg.num_agents
        mine = [[float(v) for a in per_level for v in np.ravel(a[:, i])] for i in range(N)]
        every = [[v for part in trainer.dist.gather(mine) for v in part[i]] for i in range(N)]
        for i in range(N):
            mean, std = float(np.mean(every[i])), float(np.std(every[i]))
            for a in per_level:
                a[:, i] = ac.normalize(a[:, i], mean, std)

    # ---- games (kit/trainers/game_trainer.py)

    def game_advantages(self, trainer, rounds, episodes) -> np.ndarray:
        cfg, task, q = self.cfg, trainer.task, self.cfg.critic_type == "q"
        # each decision: (episode, position in the episode, player, critic input without / with the move)
        where = {}  # (episode, position) -> flat request index over the rounds
        flat = 0
        for r in rounds:
            for k, e in enumerate(r.episodes):
                where[(e, r.index)] = flat
                flat += 1
        state_text, full_text, player = [""] * flat, [""] * flat, [0] * flat
        for r in rounds:
            for k, e in enumerate(r.episodes):
                p, prompt = r.rollout.requests[k]
                idx = where[(e, r.index)]
                player[idx] = p
                if self.name == "iac":
                    state_text[idx] = self.fmt(prompt)
                    full_text[idx] = state_text[idx] + r.rollout.texts[k][0]
        if self.name == "maac":  # every player's observation at each decision: replay the episode from its seed
            for e, ep in enumerate(episodes):
                game = task.reset(ep.seed)
                for t, rec in enumerate(ep.decisions):
                    obs = [task.prompt(game, i) for i in range(cfg.num_agents)]
                    state_text[where[(e, t)]] = joint_prompt(obs)
                    full_text[where[(e, t)]] = joint_prompt(obs) + f"\n[Agent {rec['player']} move] {rec['completion']}"
                    task.step(game, rec["completion"])
        texts = full_text if q else state_text
        values = np.zeros(flat)
        for name in self.models:
            mine = [i for i in range(flat) if self.critic_of(player[i]) == name]
            if mine:
                values[mine] = self.values(name, [texts[i] for i in mine])
        # sequences: MAAC all decisions of an episode, IAC each player's own; the return at the last decision
        targets, adv = np.zeros(flat), np.zeros(flat)
        for e, ep in enumerate(episodes):
            order = [where[(e, t)] for t in range(ep.length)]
            seqs = [order] if self.name == "maac" else [[i for i in order if player[i] == p]
                                                        for p in range(cfg.num_agents)]
            for seq in filter(None, seqs):
                rewards = np.zeros(len(seq))
                rewards[-1] = task.score(ep)
                a = ac.gae(rewards, values[seq], cfg.discount, cfg.gae_lambda)
                targets[seq] = a + values[seq]  # the lambda-returns
                adv[seq] = a
        if q:  # Q minus the mean Q of the decisions that saw the same state (the acting player's alternatives):
            # the step's decisions on every process, since other deals (another process's) reach the same state
            keys = [(self.critic_of(player[i]), state_text[i]) for i in range(flat)]
            mine = defaultdict(lambda: [0.0, 0])  # (critic, state) -> [sum of Q, count]
            for key, v in zip(keys, values):
                mine[key][0] += float(v)
                mine[key][1] += 1
            every = defaultdict(lambda: [0.0, 0])
            for part in trainer.dist.gather(dict(mine)):
                for key, (total, count) in part.items():
                    every[key][0] += total
                    every[key][1] += count
            adv = values - np.array([every[key][0] / every[key][1] for key in keys])
        self.batch = {name: ([texts[i] for i in range(flat) if self.critic_of(player[i]) == name],
                             [float(targets[i]) for i in range(flat) if self.critic_of(player[i]) == name],
                             [float(values[i]) for i in range(flat) if self.critic_of(player[i]) == name])
                      for name in self.models}
        if cfg.advantage_normalization:
            mine = [[float(adv[i]) for i in range(flat) if player[i] == p] for p in range(cfg.num_agents)]
            every = [[v for part in trainer.dist.gather(mine) for v in part[p]] for p in range(cfg.num_agents)]
            for p in range(cfg.num_agents):
                idx = [i for i in range(flat) if player[i] == p]
                if idx:
                    adv[idx] = ac.normalize(adv[idx], float(np.mean(every[p])), float(np.std(every[p])))
        return adv

    # ---- fit (after the actors' update; shared heads: inside it)

    def heads_on(self, adapter: str) -> list[str]:
        """The value heads that read `adapter` (use_separate_critic=false: agent i's, or every agent's when
        share_adapter=true)."""
        return [f"critic_{i}" for i in self.team.agents_of_adapter(adapter)]

    def backward_into_actor(self, trainer, adapter: str, iteration: int) -> None:
        """Called by the update before the actor's optimizer steps `adapter`, every iteration. Shared heads: add
        value_loss_coef * the value loss's gradient to the adapter's (so its optimizer takes ONE step on
        policy loss + value_loss_coef * value loss) and step the heads with their own optimizers. Else nothing."""
        if not self.shared:
            return
        got = self._step_heads(trainer, adapter, train_trunk=True)
        if iteration == 0:
            self._fitted.update(got)

    def _value_backward(self, trainer, names: list[str], train_trunk: bool) -> tuple[dict, dict]:
        """Backward value_loss_coef * sum of the value losses of `names`' rows / their row count over every
        process (one mean over all of them); per name, the logged loss value_loss_coef * mean of its own rows
        (this process's part) and its row count over every process."""
        cfg = self.cfg
        counts = trainer.dist.sum([len(self.batch.get(name, ([], [], []))[0]) for name in names])
        denom = max(sum(counts), 1)
        losses = {}
        for name, count in zip(names, counts):
            texts, targets, olds = self.batch.get(name, ([], [], []))
            model = self.models[name]
            step = cfg.micro_batch_size or len(texts) or 1
            device = model.head.weight.device
            y_all = torch.tensor(targets, dtype=torch.float32, device=device)
            old_all = torch.tensor(olds, dtype=torch.float32, device=device)
            losses[name] = 0.0
            for lo in range(0, len(texts), step):
                v = model.score_texts(texts[lo:lo + step], train_trunk=train_trunk)
                rows = ac.value_loss(v, old_all[lo:lo + step], y_all[lo:lo + step], cfg.value_clip_range)
                weighted = cfg.value_loss_coef * rows.sum()
                (weighted / denom).backward()
                losses[name] += float(weighted.detach() / max(count, 1))
        return losses, dict(zip(names, counts))

    def _step_heads(self, trainer, adapter: str, train_trunk: bool) -> dict[str, tuple[float, float]]:
        """One AdamW step of the heads on `adapter` (their gradient over every process); (loss, grad norm) each."""
        names = self.heads_on(adapter)
        for name in names:
            self.optimizers[name].zero_grad(set_to_none=True)
        losses, counts = self._value_backward(trainer, names, train_trunk)
        return {name: (losses[name], trainer.step_parameters(self.models[name].parameters(), self.optimizers[name],
                                                             counts[name])) for name in names}

    def fit(self, trainer) -> dict:
        """Separate critics: num_iterations AdamW steps of each on value_loss_coef * its clipped value loss. Shared
        heads: already stepped inside the update (backward_into_actor), or, while the actors wait
        (critic_warmup_steps), num_iterations steps of the heads alone on the adapters as they are. Metrics."""
        cfg = self.cfg
        fitted, self._fitted = self._fitted, {}
        if self.shared and self.actors_wait(trainer.step):
            for adapter in self.team.adapters:
                for iteration in range(cfg.num_iterations):
                    got = self._step_heads(trainer, adapter, train_trunk=False)
                    if iteration == 0:
                        fitted.update(got)
        for name, model in self.models.items():
            if not self.shared:
                model.model.train()
                for iteration in range(cfg.num_iterations):
                    self.optimizers[name].zero_grad(set_to_none=True)
                    losses, counts = self._value_backward(trainer, [name], train_trunk=True)
                    norm = trainer.step_parameters(model.parameters(), self.optimizers[name], counts[name])
                    fitted.setdefault(name, (losses[name], norm))
                model.model.eval()
            self.schedulers[name].step()
        return {key: v for name in self.models for key, v in self._stats(trainer, name, *fitted[name]).items()}

    def _stats(self, trainer, name: str, loss: float, norm: float) -> dict:
        """The metrics of critic `name`: the first iteration's loss and gradient norm, and how well the values
        it gave before the step explain its targets (over every process)."""
        dist = trainer.dist
        texts, targets, olds = self.batch.get(name, ([], [], []))
        loss = dist.sum([loss])[0] if dist.world > 1 else loss
        every = [(v, y) for part in dist.gather(list(zip(olds, targets))) for v, y in part]
        stats = {f"critic/value_loss/{name}": loss, f"critic/grad_norm/{name}": norm}
        ev = ac.explained_variance([v for v, _ in every], [y for _, y in every]) if every else float("nan")
        if np.isfinite(ev):  # undefined when every target is the same (nothing to explain)
            stats[f"critic/explained_variance/{name}"] = ev
        stats[f"critic/value_mean/{name}"] = float(np.mean([v for v, _ in every])) if every else 0.0
        return stats


def algorithm_for(cfg, team, log=print, schedule=None) -> MAGRPO:
    """The algorithm object of a run (centralized trains as MAGRPO on its wrapped one-agent task; marlhf as its
    marlhf_rl_algorithm, on the learnt reward). `schedule(opt, cfg)`: the LR schedule its models' optimizers follow
    (the Trainer passes its own, lr_schedule)."""
    if rl_algorithm(cfg) in ("iac", "maac"):
        return ActorCritic(cfg, team, log, schedule)
    return MAGRPO(cfg, team, log, schedule)
