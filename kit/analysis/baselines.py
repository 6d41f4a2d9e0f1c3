"""The paper's baselines (Table 1) on the same items, with the same sampling and the same scoring as the team.

    python -m kit baselines --run-dir checkpoints/colab_a100 --n 10     # base-model baselines vs the trained team

    single      one model (agent 0's) writes the whole solution from `task.single_prompt(item)`; the task's
                `split_single(item, text)` turns it into the agents' parts (code: both functions in one text)
    naive       the agents generate in parallel from their own prompts without seeing each other (with the
                untrained base this is naive concatenation; with trained adapters it is the MAGRPO team)
    sequential  agent 0 first, then each next agent sees what the earlier ones wrote
    discussion  all generate, then each sees the others' first answers and revises (one round); the revisions
                are scored
Every method samples n joint actions per item and reports `kit.analysis.evaluate.summarize_turns`' metrics (pass@k, reward
and parts, cooperation rate, tokens/s) plus wall time. A task can shape the prompts with `sequential_prompt` and
`discussion_prompt`; the defaults below append the teammates' text to the agent's own prompt.
"""

from __future__ import annotations

import time

from kit.analysis.evaluate import parallel_joints, sample_turns, score, summarize_turns
from kit.analysis.progress import progress, say_estimate
from kit.analysis.schemes import passing_shares
from kit.tasks import Prompt, has, starts
from kit.tasks.game import is_game

METHODS = ("single", "naive", "sequential", "discussion")


def sequential_prompt(task, item: dict, agent: int, earlier: tuple[str, ...]) -> str:
    if has(task, "sequential_prompt"):
        return task.sequential_prompt(item, agent, earlier)
    roles = getattr(task, "roles", [f"agent_{i}" for i in range(len(earlier) + 1)])
    shown = "\n\n".join(f"Your teammate ({roles[i]}) wrote:\n{text.strip()}" for i, text in enumerate(earlier))
    own = task.prompts(item)[agent]
    return Prompt(f"{own}\n{shown}\n\nNow write your part. Output only your part.", **starts(own))


def discussion_prompt(task, item: dict, agent: int, first: tuple[str, ...]) -> str:
    if has(task, "discussion_prompt"):
        return task.discussion_prompt(item, agent, first)
    roles = getattr(task, "roles", [f"agent_{i}" for i in range(len(first))])
    others = "\n\n".join(f"Your teammate's ({roles[i]}) first answer:\n{t.strip()}"
                         for i, t in enumerate(first) if i != agent)
    own = task.prompts(item)[agent]
    return Prompt(f"{own}\nYour first answer:\n{first[agent].strip()}\n\n{others}\n\n"
                  "Revise your answer so that the two fit together. Output only your part.", **starts(own))


def run_method(method: str, sampler, task, cfg, items: list[dict], n: int, scorer) -> dict:
    """One baseline (or `naive`, the team's own mode) over items: metrics, wall time and tokens/s."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; allowed: {', '.join(METHODS)}")
    from kit.run.checkpoint import seed_everything

    seed_everything(cfg.seed + 20_011)
    start = time.perf_counter()
    acted = getattr(sampler, "tool_calls", None), getattr(sampler, "completions", None)
    if method == "naive":  # the team's own mode: with num_turns > 1, its feedback turns too (kit/analysis/evaluate.py)
        _, per_turn, tokens, gen_s = sample_turns(sampler, task, items, n, scorer, cfg.num_turns)
    else:
        joints, tokens, gen_s = _RUNNERS[method](sampler, task, items, n)
        per_turn = [score(scorer, items, joints)]
    out = {"method": method, **summarize_turns(task, per_turn, num_tokens=tokens, seconds=gen_s)}
    out.update(passing_shares(task, items, per_turn[-1]))  # a code task: the schemes of its passing programs
    out["wall_s"] = time.perf_counter() - start
    if method == "naive" and acted[0] is not None and sampler.completions > acted[1]:  # the team acted (the
        # other schedules' scored answers never do: discussion's first round acts, its revisions do not)
        out["tools/calls_per_completion"] = (sampler.tool_calls - acted[0]) / (sampler.completions - acted[1])
    return out


def _single(sampler, task, items, n):
    if not (has(task, "single_prompt") and has(task, "split_single")):
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no single_prompt/split_single, which the "
                         "single-model baseline needs")
    ro = sampler.sample([(0, task.single_prompt(item)) for item in items], n,
                        keys=[("single", item["id"]) for item in items])
    joints = [[tuple(task.split_single(item, ro.texts[k][g])) for g in range(n)] for k, item in enumerate(items)]
    return joints, ro.num_tokens, ro.seconds


def _sequential(sampler, task, items, n):
    N = len(task.prompts(items[0]))
    first = [("eval", item["id"], 0) for item in items]  # agent 0 samples as in the parallel methods
    ro = sampler.sample([(0, task.prompts(item)[0]) for item in items], n, keys=first)
    partial = [[(ro.texts[k][g],) for g in range(n)] for k in range(len(items))]
    tokens, seconds = ro.num_tokens, ro.seconds
    for agent in range(1, N):  # one batched call per later agent, one sample per partial joint action
        requests = [(agent, sequential_prompt(task, item, agent, partial[k][g]))
                    for k, item in enumerate(items) for g in range(n)]
        keys = [("sequential", item["id"], g, agent) for item in items for g in range(n)]
        ro = sampler.sample(requests, 1, keys=keys)
        partial = [[partial[k][g] + (ro.texts[k * n + g][0],) for g in range(n)] for k in range(len(items))]
        tokens, seconds = tokens + ro.num_tokens, seconds + ro.seconds
    return partial, tokens, seconds


def _discussion(sampler, task, items, n):
    N = len(task.prompts(items[0]))
    first, tokens, seconds = parallel_joints(sampler, task, items, n)
    requests = [(a, discussion_prompt(task, item, a, first[k][g]))
                for k, item in enumerate(items) for g in range(n) for a in range(N)]
    keys = [("discussion", item["id"], g, a) for item in items for g in range(n) for a in range(N)]
    ro = sampler.sample(requests, 1, keys=keys)
    revised = [[tuple(ro.texts[(k * n + g) * N + a][0] for a in range(N)) for g in range(n)]
               for k in range(len(items))]
    return revised, tokens + ro.num_tokens, seconds + ro.seconds


_RUNNERS = {"single": _single, "sequential": _sequential, "discussion": _discussion}


def compare(run_dir, methods=None, n: int = 10, num_items: int | None = None, step: str | int = "newest",
            log=print, ctx=None) -> list[dict]:
    """The baselines on the untrained base model, then the trained team (`magrpo`, the newest checkpoint or
    `step`), on the same held-out items; written to <run_dir>/eval/baselines.json and returned. `methods`: all of
    METHODS by default; a game run (kit/tasks/games.py) has its own: random, rule, base."""
    from kit.analysis.evaluate import RunContext

    if n < 1:
        raise ValueError(f"n={n}: samples per agent per item must be 1 or more")
    if ctx is None:  # made here, closed here (its reward workers, an environment's process)
        import contextlib

        with contextlib.closing(RunContext(run_dir, "eval", num_items, log=log)) as made:
            return compare(run_dir, methods, n, num_items, step, log, made)
    if is_game(ctx.task):  # random-legal, rule-based, the untrained team, then the trained team
        from kit.tasks import games

        rows = games.compare(ctx, games.METHODS if methods is None else methods, n, step, log)
        _write(ctx.run_dir, rows)
        return rows
    methods = METHODS if methods is None else methods
    unknown = [m for m in methods if m not in METHODS]
    if unknown:  # before anything runs: a typo must not cost the baselines already sampled
        raise ValueError(f"unknown baseline method(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(METHODS)}")
    from kit.tasks.rewards import EnvironmentReward

    if ctx.scorer is not None and isinstance(ctx.scorer.model, EnvironmentReward):
        skipped = [m for m in methods if m != "naive"]
        if skipped:  # their schedules sample without the environment, whose get_reward() is the only reward
            log(f"[kit] baselines {', '.join(skipped)} skipped: the run's reward is its environment's get_reward(), "
                "and these schedules do not act on it; the untrained team (naive) and the trained one do")
        methods = [m for m in methods if m == "naive"]
    rows = []
    ctx.use_step(0)
    if (training := ctx.training()) and ctx.checkpoints():  # nothing to prune before its first checkpoint
        log(f"[kit] {ctx.run_dir} is not finished ({training}): it may still be training; the trained team's row "
            "is its newest checkpoint now (taken again if the training prunes it meanwhile)")
    passes = sum(2 if m in ("sequential", "discussion") else 1 for m in methods) + 1  # two rounds of generation
    say_estimate(ctx, passes * ctx.cfg.num_turns, n, log)
    team = step != "newest" or bool(ctx.checkpoints())  # the trained team is the bar's last job, not after it
    for method in progress([*methods, *(["magrpo"] if team else [])], "methods"):
        if method == "magrpo":
            chosen = ctx.use_team_step(step, log)
            if chosen is not None:
                row = run_method("naive", ctx.sampler, ctx.task, ctx.cfg, ctx.items, n, ctx.scorer)
                row.update(method="magrpo", step=chosen)
                rows.append(row)
                log("[kit] magrpo team: " + _brief(row))
            continue
        if method == "single" and not has(ctx.task, "single_prompt"):
            log(f"[kit] baseline single skipped: task {ctx.cfg.task!r} has no single_prompt")
            continue
        rows.append(run_method(method, ctx.sampler, ctx.task, ctx.cfg, ctx.items, n, ctx.scorer))
        log(f"[kit] baseline {method}: " + _brief(rows[-1]))
    if not team:
        ctx.team_step(step, log)  # says once that the trained team is not in this table (no checkpoint yet)
    _write(ctx.run_dir, rows)
    return rows


def _write(run_dir, rows: list[dict]) -> None:
    import json

    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "baselines.json").write_text(json.dumps(rows, indent=1))


def _brief(row: dict) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in row.items() if k.startswith(("pass@1", "reward/mean")))
