"""MAGRPO on turn-based games: episode rollouts, one adapter per player, group-relative over G episodes per deal.

    trainer = GameTrainer(load_config("tiny_cpu", overrides=["task=game", "task_args={game: tiny_hanabi}"]))
    trainer.train()

A step takes `batch_size` deals and plays G = `num_generations` episodes of each (the same seed, so a group shares
its chance outcomes as far as the moves allow and the group mean is a fair baseline). All live episodes of the
step advance together: at every decision ONE batched generate call samples the move of every live episode, each
row routed to the acting player's adapter (`Sampler.sample`, per-row seeds from (seed, step, deal, episode,
decision)). The return of an episode is its final score minus `illegal_penalty` per illegal move
(kit/tasks/game.py); advantages are group-relative over the G episodes of a deal (`advantage_mode`,
`scale_rewards`, `advantage_clip` as in kit/magrpo.py) and every decision of an episode carries the episode's
advantage. Each adapter then updates on its own player's decisions only (Trainer.update, micro-batched by
`micro_batch_size`), so no gradient reaches another player's adapter.

Metrics: score mean/max/std, illegal-move rate, episode length, decisions per player; `rollouts.jsonl` holds one
row per episode (its seed, score, `reward` = the return, advantage) with its decisions in order (player, prompt,
completion, move, legal): the explorer (kit/explore.py) replays it move by move.
"""

from __future__ import annotations

import numpy as np

from kit import magrpo
from kit.games import Decisions, episode_summary, greedy_eval, play, summary_metrics
from kit.trainer import Trainer


class GameTrainer(Trainer):
    """The MAGRPO loop (kit/trainer.py) with episodes instead of one-shot joint actions."""

    def build_reward_model(self, cfg, task, reward_funcs, log):
        if reward_funcs or cfg.use_judge_reward:
            raise ValueError("a game's return is its score (kit/tasks/game.py): reward functions and the judge "
                             "reward do not apply to game tasks")
        return None

    def sample(self, items: list[dict], positions: list[int] | None = None) -> list[Decisions]:
        cfg, G = self.cfg, self.cfg.num_generations
        positions = list(range(len(items))) if positions is None else positions
        self.positions = positions  # the deals' places in the step's global batch: their seeds and log order
        keys = [("game", self.step, p) for p in positions]
        self.episodes, rounds = play(self.sampler, self.task, [it["seed"] for it in items], G, keys)
        # (deals, 1, G): each deal's G episodes are one group, so a deal's baseline is its own mean, never the batch's
        returns = np.array([self.task.score(ep) for ep in self.episodes]).reshape(len(items), 1, G)
        adv = magrpo.advantages(returns, cfg.advantage_mode, cfg.scale_rewards, cfg.advantage_clip,
                                batch_std=self.batch_std(returns)).reshape(-1)
        self.returns = returns.reshape(-1)
        for r in rounds:
            r.advantages = adv[r.episodes]
        self._advantages = adv
        return rounds

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
        G = self.cfg.num_generations
        return self.in_order([
            {"step": self.step, "item": items[e // G]["id"], "episode": e % G, "seed": ep.seed,
             "score": self.task.game_score(ep), "reward": float(self.returns[e]),
             "advantage": float(self._advantages[e]), "illegal": ep.illegal, "length": ep.length,
             "decisions": ep.decisions, "_order": (self.positions[e // G], e % G)}
            for e, ep in enumerate(self.episodes)])

    def evaluate(self, items: list[dict] | None = None) -> dict:
        """Greedy play of the held-out deals: mean score, illegal-move rate (under `eval/`)."""
        return greedy_eval(self.sampler, self.task, self.eval_items if items is None else items)


def trainer_class(task: str, algorithm: str = "magrpo") -> type[Trainer]:
    """The loop a run trains with: MADPO or MARLHF (kit/preference_trainer.py) when its algorithm says so,
    episodes for game tasks, joint actions (Trainer) for the others."""
    if algorithm == "madpo":
        from kit.preference_trainer import MADPOTrainer

        return MADPOTrainer
    if algorithm == "marlhf":
        from kit.marlhf import MARLHFTrainer

        return MARLHFTrainer
    return GameTrainer if task == "game" else Trainer
