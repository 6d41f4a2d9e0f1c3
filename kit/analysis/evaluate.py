"""Evaluation: pass@k, mean reward and parts, cooperation rate and tokens/s, for a team or a run's checkpoints.

    python -m kit eval --run-dir checkpoints/colab_a100 --steps all --n 10     # every checkpoint + the base
    python -m kit eval --run-dir checkpoints/colab_a100 --steps newest

For each held-out item every agent samples n completions in one batched call; the g-th samples form the g-th
joint action, which the task scores. pass@k uses the unbiased estimator of Chen et al. (2021),
pass@k = E_items[1 - C(n - c, k) / C(n, k)], with c the joint actions that pass (`task.is_pass(reward)`: for the
code task, every assert passes). The cooperation rate is the share of joint actions whose `cooperation` part is
positive (main's use of aux earned the bonus). Results go to `<run_dir>/eval/step_NNNNNN.json` (step 0 is the
untrained base: LoRA adapters start as the identity), so 02_evaluate can draw learning curves on held-out data.

A run with `num_turns > 1` is evaluated as it trains: each joint action of the first turn goes through the task's
`feedback` (next-turn prompts from what the team's answer did) and every agent answers again, one sample per
joint action per turn, for every turn; the metrics are the last turn's, and `turn1/reward_mean` the first's. The
untrained team (`naive` in kit/analysis/baselines.py) and the trained one get the same turns.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import numpy as np

from kit.tasks.rewards import Scorer, reward_model_for
from kit.engine.rollout import Sampler
from kit.tasks import has
from kit.tasks import headline as task_headline
from kit.analysis.progress import progress, say_estimate  # noqa: F401  (say_estimate: the cells and tests read it here)

KS = (1, 3, 5, 10)


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k) in the numerically stable product form; n samples, c correct."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarize(task, rewards: list[list], *, ks=KS, num_tokens: int = 0, seconds: float = 0.0) -> dict:
    """Metrics over items x n joint-action rewards."""
    flat = [r for per_item in rewards for r in per_item]
    n = min(len(per_item) for per_item in rewards) if rewards else 0
    out = {"num_items": len(rewards), "num_samples": n,
           "reward/mean": float(np.mean([r.total for r in flat])) if flat else 0.0}
    for key in sorted({k for r in flat for k in r.parts}):
        out[f"reward/{key}"] = float(np.mean([r.parts.get(key, 0.0) for r in flat]))
    if any("cooperation" in r.parts for r in flat):
        out["cooperation_rate"] = float(np.mean([r.parts.get("cooperation", 0.0) > 0 for r in flat]))
    if any("main_calls_aux" in (r.details or {}) for r in flat):  # the code task: main calls aux, by the AST, on
        # every sample (cooperation_rate counts only the rewarded uses: aux defined, a test passed)
        out["aux_call_rate"] = float(np.mean([bool((r.details or {}).get("main_calls_aux")) for r in flat]))
    # per item, so a report can put bootstrap intervals over items on every mean (kit/analysis/stats.py)
    out["per_item"] = {"reward": [float(np.mean([r.total for r in per_item[:n]])) if n else 0.0
                                  for per_item in rewards]}
    if "aux_call_rate" in out:
        out["per_item"]["aux_call"] = [float(np.mean([bool((r.details or {}).get("main_calls_aux")) for r in per[:n]]))
                                       if n else 0.0 for per in rewards]
    if has(task, "is_pass") and n:
        correct = [sum(bool(task.is_pass(r)) for r in per_item[:n]) for per_item in rewards]
        out["per_item"]["correct"] = correct
        for k in ks:
            if k <= n:
                out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in correct]))
    out["tokens"] = num_tokens
    out["tokens_per_s"] = num_tokens / seconds if seconds > 0 else 0.0
    out["headline"] = task_headline(task) if n else "reward/mean"  # what reports and figures judge it by
    return out


def mean_total(rewards: list[list]) -> float:
    """The mean total reward of rewards[item][g]."""
    return float(np.mean([r.total for per_item in rewards for r in per_item]))


def summarize_turns(task, per_turn: list[list[list]], num_tokens: int = 0, seconds: float = 0.0) -> dict:
    """`summarize` of the last turn's rewards; with several turns, also the first turn's mean and the turn count."""
    out = summarize(task, per_turn[-1], num_tokens=num_tokens, seconds=seconds)
    if len(per_turn) > 1:
        out["turns"] = len(per_turn)
        out["turn1/reward_mean"] = mean_total(per_turn[0])
    return out


def parallel_joints(sampler: Sampler, task, items: list[dict], n: int, params=None, tag: str = "eval"):
    """n joint actions per item from the task's own prompts (agents in parallel, one batched generate):
    (joints[item][g], generated tokens, generate seconds). `params`: the sampler's own by default. Samples are
    seeded by (tag, item id, agent): every checkpoint and method sees the same noise for the same item."""
    N = len(task.prompts(items[0])) if items else 0
    requests = [(a, p) for item in items for a, p in enumerate(task.prompts(item))]
    keys = [(tag, item["id"], a) for item in items for a in range(N)]
    worlds = {"worlds": items} if getattr(sampler, "acts", False) else {}  # what an environment acts on
    ro = sampler.sample(requests, n, params, keys=keys, **worlds)
    joints = [[tuple(ro.texts[k * N + a][g] for a in range(N)) for g in range(n)] for k in range(len(items))]
    if getattr(ro, "views", None) is not None:  # acted on worlds: each joint action carries its world (and its
        # reward, when the environment owns the reward)
        rewards = getattr(ro, "world_rewards", None)
        joints = [[Acted(j, None if rewards is None else rewards[k][g], ro.views[k * n + g])
                   for g, j in enumerate(per)] for k, per in enumerate(joints)]
    return joints, ro.num_tokens, ro.seconds


class Acted(tuple):
    """A joint action that acted on a world (kit/engine/tools.py): `score` takes its world's get_reward() when the
    environment owns the reward, else asks the scorer with the world (reward functions may read it)."""

    def __new__(cls, completions, reward: float | None, environment=None):
        self = super().__new__(cls, completions)
        self.reward, self.environment = reward, environment
        return self

    def __reduce__(self):  # to another process without its world (an EnvView stays in the trainer's process)
        return Acted, (tuple(self), self.reward)


def sample_joint(sampler: Sampler, task, items: list[dict], n: int, scorer: Scorer, params=None):
    """`parallel_joints`, scored: (joints, rewards, tokens, seconds)."""
    joints, tokens, seconds = parallel_joints(sampler, task, items, n, params)
    return joints, score(scorer, items, joints), tokens, seconds


def sample_turns(sampler: Sampler, task, items: list[dict], n: int, scorer: Scorer, turns: int = 1,
                 params=None):
    """`sample_joint`, then `turns - 1` feedback turns: each joint action's next prompts from
    `task.feedback(item, joint action, reward)`, one sample per agent per joint action per turn (all of a turn in
    one batched generate, seeded by (item id, turn, g, agent)). (last joints, rewards of every turn [turn][item][g],
    tokens, seconds). `params`: the sampler's own by default."""
    if turns > 1 and not has(task, "feedback"):
        raise ValueError(f"num_turns={turns} needs a task with feedback(item, completions, reward)")
    joints, rewards, tokens, seconds = sample_joint(sampler, task, items, n, scorer, params)
    per_turn = [rewards]
    for turn in range(1, turns if items else 1):  # no items: nothing to give feedback on
        N = len(joints[0][0])
        prompts = [task.feedback(item, joint, r) for item, per, rs in zip(items, joints, per_turn[-1])
                   for joint, r in zip(per, rs)]
        if any(len(p) != N for p in prompts):
            raise ValueError(f"task.feedback returned {[len(p) for p in prompts if len(p) != N][0]} prompts for "
                             f"{N} agents")
        requests = [(a, p) for per in prompts for a, p in enumerate(per)]
        keys = [("eval", item["id"], turn, g, a) for item in items for g in range(n) for a in range(N)]
        ro = sampler.sample(requests, 1, params, keys=keys)
        joints = [[tuple(ro.texts[(k * n + g) * N + a][0] for a in range(N)) for g in range(n)]
                  for k in range(len(items))]
        per_turn.append(score(scorer, items, joints))
        tokens, seconds = tokens + ro.num_tokens, seconds + ro.seconds
    return joints, per_turn, tokens, seconds


def score(scorer: Scorer, items: list[dict], joints: list[list[tuple]]) -> list[list]:
    from kit.tasks.rewards import Reward

    if joints and joints[0] and isinstance(joints[0][0], Acted) and joints[0][0].reward is not None:
        return [[Reward(j.reward, {"environment": j.reward}) for j in per] for per in joints]
    futures = scorer.submit([(item, tuple(j), j.environment) if isinstance(j, Acted) else (item, j)
                             for item, per in zip(items, joints) for j in per])
    flat = [f.result() for f in futures]
    out, i = [], 0
    for per in joints:
        out.append(flat[i:i + len(per)])
        i += len(per)
    return out


def greedy_eval(sampler: Sampler, task, items: list[dict], scorer: Scorer, turns: int = 1) -> dict:
    """The trainer's held-out check: one greedy joint action per item (and per feedback turn, with `turns`),
    scored with the run's reward model; the last turn's mean reward and each part under `eval/` (and the first
    turn's mean, `eval/turn1/reward_mean`, with several turns)."""
    if not items:
        return {}
    _, per_turn, _, _ = sample_turns(sampler, task, items, 1, scorer, turns, sampler.greedy)
    rewards = [r for per in per_turn[-1] for r in per]
    out = {"eval/reward_mean": mean_total(per_turn[-1])}
    if turns > 1:
        out["eval/turn1/reward_mean"] = mean_total(per_turn[0])
    for key in sorted({k for r in rewards for k in r.parts}):
        out[f"eval/{key}"] = float(np.mean([r.parts.get(key, 0.0) for r in rewards]))
    return out


def evaluate_team(sampler: Sampler, task, cfg, items: list[dict], n: int = 10, scorer: Scorer | None = None,
                  seed: int | None = None) -> dict:
    """Sample n joint actions per item, score them, summarise. Seeded, so two checkpoints see the same noise."""
    from kit.run.checkpoint import seed_everything
    from kit.tasks.game import is_game

    seed_everything(cfg.seed + 10_007 if seed is None else seed)
    if is_game(task):  # episodes, scored by the game itself (kit/tasks/games.py)
        from kit.tasks.games import evaluate_team as evaluate_games

        return evaluate_games(sampler, task, items, n)
    own = scorer is None
    scorer = scorer or Scorer(reward_model_for(cfg, task), cfg.reward_workers, "thread")
    try:
        start = time.perf_counter()
        _, per_turn, tokens, gen_s = sample_turns(sampler, task, items, n, scorer, cfg.num_turns)
        out = summarize_turns(task, per_turn, num_tokens=tokens, seconds=gen_s)
        out["wall_s"] = time.perf_counter() - start
        return out
    finally:
        if own:
            scorer.close()


class CheckpointGone(ValueError):
    """A checkpoint is not (or no longer) in the run folder: a run still training pruned it."""


class RunContext:
    """A run directory's config, task, held-out items and team, built once for many evaluations."""

    def __init__(self, run_dir: str | Path, split: str = "eval", num_items: int | None = None, log=print,
                 reward_funcs=()):
        from kit.engine.models import build_team
        from kit.run.rundir import open_run
        from kit.tasks.game import is_game

        run = open_run(run_dir)
        self.run_dir, self.cfg, self.task = run.path, run.cfg, run.task
        items = self.task.load(split)
        self.items = items[:num_items or self.cfg.num_eval_items or len(items)]
        from kit.engine.tools import sampler_for
        from kit.sandbox.envclass import notebook_class, restore_from_run

        restore_from_run(self.cfg.environment, self.run_dir, log)  # 02-07 in a runtime without the class's cell
        notebook_class(self.cfg.environment or "")  # a notebook's environment class is defined: said before loading
        self.team = build_team(self.cfg, log=log)
        self.team.roles = list(getattr(self.task, "roles", []) or []) or [f"agent_{i}" for i in
                                                                         range(self.cfg.num_agents)]
        self.sampler = sampler_for(self.team, self.cfg, log)  # with an environment, its agents act as in training
        self._fresh = {name: p.detach().clone() for m in self.team.models for name, p in m.named_parameters()
                       if "lora_" in name}
        self.scorer = None if is_game(self.task) else Scorer(run.reward_model(reward_funcs, log=log),
                                                             self.cfg.reward_workers, "thread")
        self.log = log

    def checkpoints(self) -> dict[int, Path]:
        """Every step with saved adapters: the full checkpoints and the thinned adapter history."""
        from kit.run.checkpoint import saved_steps

        return saved_steps(self.run_dir)

    def team_step(self, step: str | int = "newest", log=print) -> int | None:
        """The checkpoint step a baseline table compares the trained team at (`newest` or a number); None, said
        once, when the run has no checkpoint yet."""
        have = sorted(self.checkpoints())
        chosen = have[-1] if step == "newest" and have else (int(step) if step != "newest" else None)
        if chosen is None:
            log(f"[kit] no saved checkpoint in {self.run_dir}: the trained team (magrpo) is NOT in this table; "
                "train the run first (its checkpoints appear under ckpt/)")
        return chosen

    def use_step(self, step: int) -> None:
        """Point the team at a checkpoint's adapters; step 0 is the untrained base (fresh adapters). A checkpoint
        that a run still training pruned (before or while it was read) raises CheckpointGone."""
        from kit.run.checkpoint import load_adapters

        if step == 0:
            for m in self.team.models:
                for name, p in m.named_parameters():
                    if name in self._fresh:
                        p.data.copy_(self._fresh[name])
            return
        for _ in range(3):  # pruning moves a checkpoint to history/ in one rename: look it up again
            path = self.checkpoints().get(step)
            if path is None:
                break
            try:
                load_adapters(path, self.team)
                return
            except FileNotFoundError:
                continue
        raise CheckpointGone(f"no complete checkpoint for step {step} in {self.run_dir} (have: "
                             f"{sorted(self.checkpoints())}); a run still training prunes its older checkpoints "
                             "(keep_last), so evaluate one of those, or after the training ends")

    def use_team_step(self, step: str | int = "newest", log=print) -> int | None:
        """team_step, then use_step: the newest checkpoint taken again when a run still training pruned it
        meanwhile. Returns the step used (None: no checkpoint)."""
        for _ in range(3):
            chosen = self.team_step(step, log)
            if chosen is None:
                return None
            try:
                self.use_step(chosen)
                return chosen
            except CheckpointGone:
                if step != "newest":
                    raise
                log(f"[kit] the checkpoint of step {chosen} is gone (the run is still training and pruned it): "
                    "taking the newest again")
        raise CheckpointGone(f"the newest checkpoint of {self.run_dir} kept vanishing while being read: the run "
                             "is still training; try again when it has finished")

    def training(self) -> str | None:
        """'step S of N' when the run's logs stop before its num_steps (it may still be training), else None."""
        from kit.run.mirror import logged_through

        done, total = logged_through(self.run_dir) or 0, self.cfg.num_steps
        return f"step {done} of {total}" if done < total else None

    def close(self):
        if self.scorer is not None:
            self.scorer.close()
        if getattr(self.sampler, "host", None) is not None:  # the environment's child process
            self.sampler.host.close()


def evaluate_run(run_dir: str | Path, steps: str | list[int] = "all", n: int = 10, split: str = "eval",
                 num_items: int | None = None, log=print, ctx: RunContext | None = None) -> list[dict]:
    """Evaluate the base (step 0) and checkpoints: steps = 'all', 'newest', or a list of step numbers.
    Each result is written to <run_dir>/eval/step_NNNNNN.json and returned, ordered by step."""
    if n < 1:
        raise ValueError(f"n={n}: samples per agent per item must be 1 or more")
    if ctx is None:  # made here, closed here (its reward workers, an environment's process)
        with contextlib.closing(RunContext(run_dir, split, num_items, log=log)) as made:
            return evaluate_run(run_dir, steps, n, split, num_items, log, made)
    have = sorted(ctx.checkpoints())
    if steps == "all":
        chosen = [0] + have
    elif steps == "newest":  # the newest (taken again if a run still training prunes it before it is read)
        chosen = [ctx.use_team_step("newest", log=lambda *_: None) or 0]
    else:
        chosen = [int(s) for s in steps]
        missing = [s for s in chosen if s and s not in have]
        if missing:
            raise ValueError(f"no saved adapters for step(s) {missing} in {ctx.run_dir}; have: 0 (base), {have}")
    if not have:
        log(f"[kit] no saved checkpoint in {ctx.run_dir}: only the untrained base (step 0) is evaluated; train "
            "the run first")
    if (training := ctx.training()) and have:
        log(f"[kit] {ctx.run_dir} is not finished ({training}): it may still be training. Evaluated: the "
            f"checkpoints it has now ({', '.join(map(str, have))}); one that it prunes meanwhile is skipped")
    out_dir = ctx.run_dir / "eval"
    out_dir.mkdir(exist_ok=True)
    say_estimate(ctx, len(chosen) * ctx.cfg.num_turns, n, log)
    rows = []
    for step in progress(chosen, "checkpoints"):
        try:
            ctx.use_step(step)
        except CheckpointGone:
            log(f"[kit] step {step} skipped: its checkpoint is gone (the training pruned it)")
            continue
        row = {"step": step, "split": split,
               **evaluate_team(ctx.sampler, ctx.task, ctx.cfg, ctx.items, n, ctx.scorer)}
        if step and step not in ctx.checkpoints():  # pruned while it was evaluated: no result for what is gone
            log(f"[kit] step {step} dropped: its checkpoint was pruned while it was evaluated")
            continue
        (out_dir / f"step_{step:06d}.json").write_text(json.dumps(row, indent=1))
        log(f"[kit] eval step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()
                                                     if k.startswith(("pass@", "reward/mean", "score/mean"))))
        rows.append(row)
    return rows


def load_eval_rows(run_dir: str | Path) -> list[dict]:
    """The eval results saved in a run directory, ordered by step."""
    return sorted((json.loads(p.read_text()) for p in (Path(run_dir) / "eval").glob("step_*.json")),
                  key=lambda r: r["step"])


def format_table(rows: list[dict], columns: list[str] | None = None, first: str = "step") -> str:
    """A markdown table; by default the first key, pass@k, mean reward, cooperation rate, tokens/s."""
    if not rows:
        return "(no results)"
    if columns is None:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        columns = [first] + [k for k in keys if k.startswith("pass@")] + \
            [k for k in ("reward/mean", "score/mean", "greedy/score_mean", "illegal/rate", "cooperation_rate",
                         "tokens_per_s", "wall_s") if k in keys]

    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)
