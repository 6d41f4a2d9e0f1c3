"""Turn-based games: episodes played by the team, by a random-legal and a rule-based player, their metrics,
evaluation over checkpoints and the baselines, all on the same held-out deals.

    episodes, decisions = play(sampler, task, seeds, G, keys)     # the team: one generate per decision
    episodes = play_policy(task, seeds, n, POLICIES["rule"])      # a hand-written player in every seat
    python -m kit eval --run-dir D --steps all --n 8              # game runs too: score, illegal rate, length
    python -m kit baselines --run-dir D                           # random, rule, base (untrained) and magrpo

`play` advances all live episodes together: at every decision ONE `sampler.sample` call for the current move of
every live episode, each row routed to the acting player's adapter, with per-row seeds from (key, episode,
decision), so a checkpoint is scored on the same noise as the next one. The trainer's loop is in
kit/trainers/game_trainer.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kit.engine.rollout import Rollout


@dataclass
class Decisions:
    """One batched decision over the live episodes: the update reads `rollout` and `advantages` (per request)."""

    index: int
    episodes: list[int]  # the episode (index into the step's episodes) of each request
    rollout: Rollout
    advantages: np.ndarray | None = None  # (requests,)


def play(sampler, task, seeds: list[int], G: int, keys: list[tuple], params=None, branch: int = 1,
         ) -> tuple[list, list[Decisions]]:
    """Play G episodes of every deal, all live ones together: one sample() call per decision. `keys[d]` seeds
    deal d's samples (with the episode and the decision index). `branch` > 1: the first decision is seeded by
    episode // branch, so each run of `branch` episodes shares its first move and continues it `branch` ways
    (joint_mode=cross in games). Returns (episodes, decisions)."""
    episodes = [task.reset(seed) for seed in seeds for _ in range(G)]
    rounds: list[Decisions] = []
    t = 0
    while True:
        live = [e for e, ep in enumerate(episodes) if not task.terminal(ep)]
        if not live:
            break
        players = [task.player(episodes[e]) for e in live]
        requests = [(p, task.prompt(episodes[e], p)) for p, e in zip(players, live)]
        ro = sampler.sample(requests, 1, params, keys=[(*keys[e // G], e % G // (branch if t == 0 else 1), t)
                                                       for e in live])
        for k, e in enumerate(live):
            record = task.step(episodes[e], ro.texts[k][0])
            record["prompt"] = requests[k][1]
        rounds.append(Decisions(t, live, ro))
        t += 1
    return episodes, rounds


def replay(task, row: dict) -> list[dict]:
    """Step through a logged episode (a rollouts.jsonl row) again: one frame per decision with the whole table
    before the move (`state`: every hand shown), the acting player, its prompt and completion, the move played
    and whether it was legal, then a last frame with the final table. The game is rebuilt from the deal's seed
    and the logged completions, so it is the game that was played (checked move by move)."""
    ep, frames = task.reset(row["seed"]), []
    for i, logged in enumerate(row["decisions"]):
        frame = {"decision": i, "state": str(ep.state), "score": task.game_score(ep), **logged}
        record = task.step(ep, logged["completion"])
        if record["move"] != logged["move"]:
            raise ValueError(f"decision {i} of deal seed {row['seed']} replays as {record['move']!r}, but the log "
                             f"says {logged['move']!r}: the game's settings changed since the run was logged")
        frames.append(frame)
    frames.append({"decision": len(frames), "state": str(ep.state), "score": task.game_score(ep), "player": None,
                   "prompt": "", "completion": "", "move": "(game over)" if task.terminal(ep) else "(stopped)",
                   "legal": True})
    return frames


# ---- players that are not the team: a policy maps (task, episode, rng) to the text of a move
Policy = Callable[[object, object, np.random.Generator], str]


def random_legal(task, episode, rng: np.random.Generator) -> str:
    """A legal move uniformly at random."""
    moves = task.moves(episode)
    return moves[int(rng.integers(len(moves)))]


def rule_based(task, episode, rng: np.random.Generator) -> str:
    """The game's hand-written player (`task.rule_move`, e.g. play what is known playable, hint what a partner can
    play, else discard the oldest card)."""
    move = task.rule_move(episode)
    if move is None:
        raise ValueError(f"game {task.name!r} has no rule-based player (OpenSpielGame.rule_move)")
    return move


POLICIES: dict[str, Policy] = {"random": random_legal, "rule": rule_based}


def play_policy(task, seeds: list[int], n: int, policy: Policy) -> list:
    """n episodes of every deal with `policy` in every seat; its randomness comes from (deal seed, episode)."""
    episodes = []
    for seed in seeds:
        for g in range(n):
            ep, rng = task.reset(seed), np.random.default_rng([seed, g, 0xBA5E])
            while not task.terminal(ep):
                task.step(ep, policy(task, ep, rng))
            episodes.append(ep)
    return episodes


def episode_summary(task, episode) -> dict:
    """What the metrics need of one episode, as plain values (processes gather these, not game states)."""
    return {"score": task.game_score(episode), "return": task.score(episode), "illegal": episode.illegal,
            "length": episode.length}


def summary_metrics(summaries: list[dict]) -> dict:
    """Score mean/std/max, the return (score minus the illegal-move penalty), illegal-move rate and length."""
    scores = np.array([e["score"] for e in summaries])
    decisions = sum(e["length"] for e in summaries)
    return {"reward/mean": float(np.mean([e["return"] for e in summaries])),
            "score/mean": float(scores.mean()), "score/std": float(scores.std()), "score/max": float(scores.max()),
            "illegal/rate": sum(e["illegal"] for e in summaries) / max(decisions, 1),
            "episode/length": decisions / len(summaries)}


def episode_metrics(task, episodes: list, n: int) -> dict:
    """`summary_metrics` of n episodes per deal, with the counts."""
    summaries = [episode_summary(task, ep) for ep in episodes]
    deals = [summaries[i:i + n] for i in range(0, len(summaries), max(n, 1))]  # episodes are deal-major
    per_item = {key: [float(np.mean([e[name] for e in deal])) for deal in deals]  # for kit/analysis/stats.py intervals
                for key, name in (("reward", "return"), ("score", "score"))}
    return {"num_items": len(episodes) // max(n, 1), "num_samples": n, **summary_metrics(summaries),
            "per_item": per_item}


def greedy_eval(sampler, task, items: list[dict]) -> dict:
    """The trainer's held-out check: one greedy episode per deal (under `eval/`)."""
    episodes, _ = play(sampler, task, [it["seed"] for it in items], 1, [("eval", it["id"]) for it in items],
                       sampler.greedy)
    m = episode_metrics(task, episodes, 1)
    return {"eval/reward_mean": m["reward/mean"], "eval/score_mean": m["score/mean"],
            "eval/illegal_rate": m["illegal/rate"]}


def evaluate_team(sampler, task, items: list[dict], n: int) -> dict:
    """The team on held-out deals: n sampled episodes per deal (the training temperature; seeded by deal, episode
    and decision, so every checkpoint sees the same noise), and one greedy episode per deal (`greedy/`)."""
    start = time.perf_counter()
    episodes, rounds = play(sampler, task, [it["seed"] for it in items], n, [("eval", it["id"]) for it in items])
    out = episode_metrics(task, episodes, n)
    tokens, seconds = sum(r.rollout.num_tokens for r in rounds), sum(r.rollout.seconds for r in rounds)
    greedy = greedy_eval(sampler, task, items)
    out.update({"greedy/score_mean": greedy["eval/score_mean"], "greedy/illegal_rate": greedy["eval/illegal_rate"],
                "tokens": tokens, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
                "decisions_per_s": sum(len(r.episodes) for r in rounds) / seconds if seconds > 0 else 0.0,
                "wall_s": time.perf_counter() - start})
    return out


METHODS = ("random", "rule", "base")


def compare(ctx, methods=METHODS, n: int = 10, step: str | int = "newest", log=print) -> list[dict]:
    """The game baselines on the run's held-out deals: a random-legal and a rule-based player in every seat, the
    untrained team (`base`), then the trained team (`magrpo`, the newest checkpoint or `step`)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown game baseline(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(METHODS)}")
    seeds, rows = [it["seed"] for it in ctx.items], []
    for method in methods:
        start = time.perf_counter()
        if method == "base":
            ctx.use_step(0)
            row = evaluate_team(ctx.sampler, ctx.task, ctx.items, n)
        elif method == "rule" and ctx.task.rule_move(ctx.task.reset(seeds[0])) is None:
            log(f"[kit] baseline rule skipped: game {ctx.task.name!r} has no rule-based player")
            continue
        else:
            row = episode_metrics(ctx.task, play_policy(ctx.task, seeds, n, POLICIES[method]), n)
        rows.append({"method": method, **row, "wall_s": time.perf_counter() - start})
        log(f"[kit] baseline {method}: " + _brief(rows[-1]))
    chosen = ctx.use_team_step(step, log)
    if chosen is not None:
        rows.append({"method": "magrpo", "step": chosen, **evaluate_team(ctx.sampler, ctx.task, ctx.items, n)})
        log("[kit] magrpo team: " + _brief(rows[-1]))
    return rows


def _brief(row: dict) -> str:
    return ", ".join(f"{k}={row[k]:.3f}" for k in ("score/mean", "greedy/score_mean", "illegal/rate") if k in row)
