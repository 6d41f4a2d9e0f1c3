"""MAGRPO on turn-based games: episode rollouts, one adapter per player, group-relative over G episodes per deal.

    trainer = GameTrainer(load_config("tiny_cpu", overrides=["task=game", "task_args={game: tiny_hanabi}"]))
    trainer.train()

A step takes `batch_size` deals and plays G = `num_generations` episodes of each (the same seed, so a group shares
its chance outcomes as far as the moves allow and the group mean is a fair baseline). All live episodes of the
step advance together: at every decision ONE batched generate call samples the move of every live episode, each
row routed to the acting player's adapter (`Sampler.sample`, per-row seeds from (seed, step, deal, episode,
decision)). The return of an episode is its final score minus `illegal_penalty` per illegal move
(kit/tasks/game.py); advantages are group-relative over the G episodes of a deal (`advantage_mode`,
`scale_rewards`, `advantage_clip` as in kit/maths/magrpo.py) and every decision of an episode carries the episode's
advantage. `joint_mode=cross`: each deal's G first moves are each continued by G episodes (G^2 per deal); the
first decision's return is the mean over its G continuations (with `leniency` kappa: (1 - kappa) mean + kappa max,
the partner's best answer to the move), grouped over the G first moves (`marginal`), and a later decision's group
is the G continuations of its first move. `advantage_mode=role`: a decision of player p gets R - b_p, a moving
baseline per player (kit/maths/magrpo.py), saved in checkpoints. Each adapter then updates on its own player's decisions
only (Trainer.update, micro-batched by `micro_batch_size`), so no gradient reaches another player's adapter.

Metrics: score mean/max/std, illegal-move rate, episode length, decisions per player; `rollouts.jsonl` holds one
row per episode (its seed, score, `reward` = the return, advantage) with its decisions in order (player, prompt,
completion, move, legal): the explorer (kit/analysis/explore.py) replays it move by move.
"""

from __future__ import annotations

import numpy as np

from kit.maths import magrpo
from kit.tasks.coordination import enumerable, exact_eval, is_suite_game
from kit.tasks.games import Decisions, episode_summary, greedy_eval, play, summary_metrics
from kit.trainers.trainer import Trainer


class GameTrainer(Trainer):
    """The MAGRPO loop (kit/trainers/trainer.py) with episodes instead of one-shot joint actions."""

    def build_reward_model(self, cfg, task, reward_funcs, log):
        if reward_funcs or cfg.use_judge_reward:
            raise ValueError("a game's return is its score (kit/tasks/game.py): reward functions and the judge "
                             "reward do not apply to game tasks")
        return None

    def sample(self, items: list[dict], positions: list[int] | None = None) -> list[Decisions]:
        cfg, G = self.cfg, self.cfg.num_generations
        cross = cfg.joint_mode == "cross"  # G first moves per deal, each continued G ways: G^2 episodes
        E = G * G if cross else G
        positions = list(range(len(items))) if positions is None else positions
        self.positions = positions  # the deals' places in the step's global batch: their seeds and log order
        keys = [("game", self.step, p) for p in positions]
        self.episodes, rounds = play(self.sampler, self.task, [it["seed"] for it in items], E, keys,
                                     branch=G if cross else 1)
        self.returns = np.array([self.task.score(ep) for ep in self.episodes])  # (deals x E,)
        per_decision = self.algorithm.game_advantages(self, rounds, self.episodes)  # critics (kit/trainers/critic.py)
        if per_decision is not None:  # each decision its own advantage; an episode logs the mean of its decisions'
            per_episode = [[] for _ in self.episodes]
            for r, lo in zip(rounds, np.cumsum([0] + [len(r.episodes) for r in rounds])):
                r.advantages = per_decision[lo:lo + len(r.episodes)]
                for e, a in zip(r.episodes, r.advantages):
                    per_episode[e].append(a)
            self._advantages = np.array([np.mean(a) for a in per_episode])
            return rounds
        mode, scale, clip = cfg.advantage_mode, cfg.scale_rewards, cfg.advantage_clip
        if cross:  # decision 0: the first move k's return is the mean over its G continuations (the partners'
            # samples it was paired with), grouped over k; later decisions: grouped over the G continuations of k
            grid = self.returns.reshape(len(items), G, G)
            kappa = magrpo.leniency_at(cfg.leniency, cfg.leniency_decay_steps, self.step)  # (1 - k) mean + k max
            judged = magrpo.lenient(grid, kappa)  # (deals, G): each first move by its G continuations
            first = magrpo.advantages(judged[:, None, :], mode, scale, clip,
                                      batch_std=self.batch_std(judged)).reshape(-1)  # (deals x G,)
            later = magrpo.advantages(grid, mode, scale, clip, batch_std=self.batch_std(grid)).reshape(-1)
            for r in rounds:
                r.advantages = first[np.array(r.episodes) // G] if r.index == 0 else later[r.episodes]
            self._advantages = later
            return rounds
        returns = self.returns.reshape(len(items), 1, G)
        if mode == "role":  # A = R - b_player (kit/maths/magrpo.py role_baseline)
            per_player = np.repeat(returns, cfg.num_agents, axis=1)  # (deals, N, G): a cooperative game's
            adv = self._role_advantages_of(per_player)  # (deals, N, G)
            for r in rounds:
                players = np.array([agent for agent, _ in r.rollout.requests])
                eps = np.array(r.episodes)
                r.advantages = adv[eps // G, players, eps % G]
            self._advantages = adv.mean(1).reshape(-1)
            return rounds
        # (deals, 1, G): each deal's G episodes are one group, so a deal's baseline is its own mean, never the batch's
        adv = magrpo.advantages(returns, cfg.advantage_mode, cfg.scale_rewards, cfg.advantage_clip,
                                batch_std=self.batch_std(returns)).reshape(-1)
        for r in rounds:
            r.advantages = adv[r.episodes]
        self._advantages = adv
        return rounds

    def _role_advantages_of(self, per_player: np.ndarray) -> np.ndarray:
        """A = R - b_player on (deals, N, G) returns; the baseline (one turn: a game's is per player) moves toward
        this step's mean return over every process, as Trainer._role_advantages does per (turn, agent)."""
        cfg, N = self.cfg, self.cfg.num_agents
        if self.role_baseline is None:
            self.role_baseline = np.full((1, N), np.nan)
        sums = self.dist.sum([float(x) for x in per_player.sum(axis=(0, 2))] + [float(per_player[:, 0].size)])
        used, self.role_baseline[0] = magrpo.role_baseline(self.role_baseline[0], np.array(sums[:N]) / sums[N],
                                                           cfg.role_baseline_decay)
        return magrpo.role_advantages(per_player, used, cfg.scale_rewards, cfg.advantage_clip,
                                      batch_std=self.batch_std(per_player[:, 0]))

    def metrics(self, rounds: list[Decisions], update_stats: dict, times: dict) -> dict:
        mine = [{**episode_summary(self.task, ep), "players": [d["player"] for d in ep.decisions], "adv": abs(a)}
                for ep, a in zip(self.episodes, self._advantages)]
        eps = [e for part in self.dist.gather(mine) for e in part]
        row = {"step": self.step, **summary_metrics(eps),
               "advantage/abs_mean": float(np.mean([e["adv"] for e in eps])),
               "perf/decisions_per_s": sum(e["length"] for e in eps) / max(times["sample"], 1e-9)}
        for p in range(self.cfg.num_agents):
            row[f"decisions/player_{p}"] = sum(e["players"].count(p) for e in eps)
        tokens = self.dist.sum([sum(r.rollout.num_tokens for r in rounds)])[0]
        return self.finish_row(row, update_stats, times, tokens)

    def rollout_rows(self, rounds: list[Decisions], items: list[dict]) -> list[dict]:
        """One row per episode, its decisions in order (the explorer steps through them)."""
        G = len(self.episodes) // max(len(items), 1)  # episodes per deal: G, or G^2 with joint_mode=cross
        return self.in_order([
            {"step": self.step, "item": items[e // G]["id"], "episode": e % G, "seed": ep.seed,
             "score": self.task.game_score(ep), "reward": float(self.returns[e]),
             "advantage": float(self._advantages[e]), "illegal": ep.illegal, "length": ep.length,
             "decisions": ep.decisions, "_order": (self.positions[e // G], e % G)}
            for e, ep in enumerate(self.episodes)])

    def evaluate(self, items: list[dict] | None = None) -> dict:
        """Greedy play of the held-out deals: mean score, illegal-move rate (under `eval/`); on a tiny_hanabi game
        also the exact expected return of the greedy and (for a small vocabulary, coordination.enumerable) the
        sampling policies over every deal, and the game's optimum (`eval/exact_*`, kit/tasks/coordination.py)."""
        out = greedy_eval(self.sampler, self.task, self.eval_items if items is None else items)
        if is_suite_game(self.task):
            out.update(exact_eval(self.sampler, self.task, sampled=enumerable(self.team)))
        return out


def trainer_class(task: str, algorithm: str = "magrpo") -> type[Trainer]:
    """The loop a run trains with: MADPO or MARLHF (kit/trainers/preference_trainer.py) when its algorithm says so,
    episodes for game tasks, joint actions (Trainer) for the others."""
    if algorithm == "madpo":
        from kit.trainers.preference_trainer import MADPOTrainer

        return MADPOTrainer
    if algorithm == "marlhf":
        from kit.trainers.marlhf import MARLHFTrainer

        return MARLHFTrainer
    return GameTrainer if task == "game" else Trainer
