"""Teams that act (issue 52): the KeyHalves information game on a real model, from the untrained team to the trained
one, against the game's exact optimum (1.0).

    python bench/environments.py train --seeds 0 1           # coder_keys (Qwen2.5-Coder-0.5B), one run per seed
    python bench/environments.py train --seeds 2 --n 4       # + the untrained and trained team sampled, 4 per row
    python bench/environments.py table                       # bench/results/environments.md (--name N: N.md)
    python bench/environments.py train --seeds 3 --name keys_local --set local_reward_weight=0.5   # its own folders
    python bench/environments.py tool --seeds 1 2 --n 2      # the code team with run_tests and without (untrained)
    python bench/environments.py tool-table                  # bench/results/code_tool.md
    python bench/environments.py tool --env kit.tasks.environments:Board --name board --seeds 100 --n 1 \
        --set "task_args={dataset: coop, prefill: none}"    # the same for the Board (sequential/discussion)
    python bench/environments.py tool --name codecall --seeds 1 --n 1 \
        --tool-set "task_args={dataset: humaneval, prefill: tool}"   # each tool-arm answer started as a run_tests call
    python bench/environments.py train --preset coder_code --name codetests --seeds 12 --set "task_args={dataset: \
        humaneval, prefill: tool}" environment=kit.tasks.environments:CodeTests max_new_tokens=480 max_tool_calls=2 \
        micro_batch_size=1 learning_rate=3e-5 num_steps=6 eval_every=0 save_every=3   # the code team trained with it
    python bench/environments.py train --preset coder_code --name boardseq --seeds 17 --n 1 --set "task_args={dataset: \
        coop, prefill: board}" environment=kit.tasks.environments:Board "environment_args={next_step: 'Now give your \
        final code in a ```python block, without a call.'}" max_new_tokens=480 max_tool_calls=1 micro_batch_size=1 \
        num_steps=10 eval_every=0 save_every=5        # the sequential schedule as calls (post, read), trained
    python bench/environments.py train --preset coder_code --name codefinal --seeds 19 --n 1 --set "task_args={dataset: \
        humaneval, prefill: tool, code_after_tools: true}" environment=kit.tasks.environments:CodeTests \
        max_new_tokens=480 max_tool_calls=1 micro_batch_size=1 learning_rate=3e-5 num_steps=10 eval_every=0 \
        save_every=5    # the test tool, then the final answer started as code
    python bench/environments.py train --preset coder_code --name coopdisc --seeds 23 --n 1 --set "task_args={dataset: \
        coop, prefill: discussion, code_after_tools: true}" environment=kit.tasks.environments:Board \
        max_new_tokens=480 max_tool_calls=2 micro_batch_size=1 num_steps=10 eval_every=0 save_every=5   # discussion
    python bench/environments.py cache --items 1             # tool rounds from the carried KV cache vs not

Each run is the preset with `--set seed=S`, trained in checkpoints/env_bench/<preset>_s<S> (git-ignored), with the
preset's greedy held-out evaluation (8 held-out rows, one joint rollout each) at step 0, every eval_every steps and the
last step; with `--n`, then `kit baselines --methods naive` on the same rows: the untrained and the trained team
sampled at the preset's temperature (greedy, the untrained team is near the optimum already). The table: held-out
reward per step and seed, its mean over seeds with the range, the share of the optimum, tool calls per completion
and the s/step split (generation, tools, update).

`tool`: the untrained coder team (coder_code's settings) on HumanEval's first 8 eval problems in two arms that differ
only in the environment: `CodeTests` (each agent may call `run_tests(code)` on the problem's visible docstring examples
before answering; the reward stays the level reward on the hidden asserts) and none. Same base, items, seed, sampling
and token budget (`--tokens`, shared by the calls, their results' turns excluded, and the answer), `kit baselines
--methods naive` at `--n` joint actions per item, one run folder per arm and seed (checkpoints/env_bench/code_<arm>_s<S>,
no training). `tool-table`: pass@1 and reward per arm, pooled over seeds per item, with 95% bootstrap intervals over
items, and tool minus plain paired on the same items. `--tool-set` overrides the tool arm alone (after `--set`), e.g.
`prefill: tool`, where each answer starts as a run_tests call, against the plain arm's `def aux(` start.

`cache`: one training step's rollout of the untrained coder_keys team (`--items` rows x 2 agents x G=4, sampled at
the preset's temperature, the same seeds) twice: each tool round going on from the rows' KV cache of the round before
(kit/engine/tools.py, the HF engine's default) and each round forwarding every row's whole context again, both on the
HF engine (`rollout_engine=hf`, also on CUDA). Prints the generate seconds of each, the rounds' tokens, and whether the
two sampled the same transcripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUNS = ROOT / "checkpoints" / "env_bench"
OUT = Path(__file__).resolve().parent / "results" / "environments.md"


def train(preset: str, seeds: list[int], extra: list[str], n: int = 0, name: str = "") -> None:
    from kit.analysis.baselines import compare
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    for seed in seeds:
        run_dir = RUNS / f"{name or preset}_s{seed}"
        cfg = load_config(preset, overrides=[f"seed={seed}", f"run_dir={run_dir}", "progress=false", *extra])
        trainer = Trainer(cfg, resume=(run_dir / "config.json").exists())
        trainer.train()
        trainer.close()
        if n:  # the untrained and the trained team sampled on the held-out rows (eval/baselines.json)
            compare(run_dir, ["naive"], n=n)


def table(preset: str, name: str = "") -> str:
    runs = sorted(RUNS.glob(f"{name or preset}_s*"))
    per_seed = {}
    for run in runs:
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        per_seed[int(run.name.rsplit("_s", 1)[1])] = rows
    if not per_seed:
        return f"no runs named {name or preset} in {RUNS}"
    steps = sorted({r["step"] for rows in per_seed.values() for r in rows if "eval/reward_mean" in r})
    lines = [f"### {name or preset}: held-out reward (greedy, 8 held-out rows; the optimum is 1.0)", "",
             "| step | " + " | ".join(f"seed {s}" for s in per_seed) + " | mean over seeds (range) |",
             "|---|" + "---|" * (len(per_seed) + 1)] if steps else [f"### {name or preset}"]  # eval_every=0: none
    for step in steps:
        vals = [next((r["eval/reward_mean"] for r in rows if r["step"] == step and "eval/reward_mean" in r), None)
                for rows in per_seed.values()]
        got = [v for v in vals if v is not None]
        cells = [f"{v:.3f}" if v is not None else "–" for v in vals]
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {np.mean(got):.3f} ({min(got):.3f}-{max(got):.3f}) |")
    lines += ["", "| seed | sampled reward, first 5 steps -> last 5 | tool calls per completion, first 5 -> last 5 "
              "| s/step | generate | tools | update |", "|---|---|---|---|---|---|---|"]
    for seed, rows in per_seed.items():
        train_rows = [r for r in rows if "reward/mean" in r and r["step"] > 0]

        def m(key, part):
            return np.mean([r.get(key, np.nan) for r in part])

        first, last = train_rows[:5], train_rows[-5:]
        lines.append(f"| {seed} | {m('reward/mean', first):.3f} -> {m('reward/mean', last):.3f} | "
                     f"{m('tools/calls_per_completion', first):.2f} -> {m('tools/calls_per_completion', last):.2f} | "
                     f"{m('perf/step_s', train_rows):.0f} | {m('perf/generate_s', train_rows):.0f} | "
                     f"{m('perf/tool_s', train_rows):.2f} | {m('perf/update_s', train_rows):.0f} |")
    return "\n".join(lines + sampled(runs))


def sampled(runs: list[Path]) -> list[str]:
    """`train --n`'s rows: the untrained and the trained team sampled on the held-out rows, per seed, with 95%
    bootstrap intervals over rows and trained minus untrained paired on the same rows; for a task with tests (the code
    task), pass@1 likewise; with several seeds, a row pooled over them (each row's mean over seeds)."""
    from kit.analysis import stats

    per_seed = {}  # seed -> {metric: (untrained per row, trained per row)}, calls, samples
    for run in runs:
        path = run / "eval" / "baselines.json"
        if not path.exists():
            continue
        by = {r["method"]: r for r in json.loads(path.read_text())}
        if not {"naive", "magrpo"} <= set(by):
            continue
        got = {"reward": tuple(np.asarray(by[m]["per_item"]["reward"], dtype=float) for m in ("naive", "magrpo"))}
        if all("correct" in by[m]["per_item"] for m in ("naive", "magrpo")):
            got["pass@1"] = tuple(np.asarray(by[m]["per_item"]["correct"], dtype=float) / by[m]["num_samples"]
                                  for m in ("naive", "magrpo"))
        calls = [by[m].get("tools/calls_per_completion", 0.0) for m in ("naive", "magrpo")]
        per_seed[run.name.rsplit("_s", 1)[1]] = (got, calls, by["magrpo"]["num_samples"])
    if not per_seed:
        return []
    metrics = [m for m in ("reward", "pass@1") if all(m in got for got, _, _ in per_seed.values())]
    lines = ["", "Sampled at the preset's temperature on the held-out rows (`train --n`; 95% bootstrap intervals over "
             "rows, trained minus untrained paired on the same rows):", "",
             "| seed | " + " | ".join(f"{m}: untrained | {m}: trained | {m}: trained minus untrained"
                                      for m in metrics) + " | tool calls per completion | joint rollouts per row |",
             "|---|" + "---|---|---|" * len(metrics) + "---|---|"]

    def row(name, got, calls, samples):
        cells = []
        for m in metrics:
            before, after = got[m]
            cells += [stats.fmt(*stats.bootstrap(before)), stats.fmt(*stats.bootstrap(after)),
                      stats.fmt(*stats.paired_bootstrap(after, before))]
        return f"| {name} | " + " | ".join(cells) + f" | {calls[0]:.2f} -> {calls[1]:.2f} | {samples} |"

    for seed, (got, calls, samples) in per_seed.items():
        lines.append(row(seed, got, calls, samples))
    if len(per_seed) > 1 and len({len(got["reward"][0]) for got, _, _ in per_seed.values()}) == 1:
        pooled = {m: tuple(np.mean([got[m][i] for got, _, _ in per_seed.values()], axis=0) for i in range(2))
                  for m in metrics}
        calls = np.mean([c for _, c, _ in per_seed.values()], axis=0)
        lines.append(row("pooled (each row's mean over seeds)", pooled, calls,
                         sum(n for _, _, n in per_seed.values())))
    return lines


TOOL_ENV = "kit.tasks.environments:CodeTests"
ARMS = ("tool", "plain")


def tool(seeds: list[int], n: int, tokens: int, extra: list[str], preset: str = "coder_code",
         runs: Path = RUNS, env: str = TOOL_ENV, name: str = "code", tool_extra: list[str] = (),
         plain_methods: list[str] = (), arms: tuple = ARMS) -> None:
    """The untrained team with an environment's tools (CodeTests' run_tests) and without them, every other setting
    equal (module docstring); run folders <name>_<arm>_s<seed>. `plain_methods`: baselines sampled in the plain arm
    besides its team (e.g. discussion, the schedule a Board arm plays as calls). `arms`: the arms to sample (the
    plain arm alone beside a training run whose --n rows are the tool arm's)."""
    from kit.analysis.baselines import compare
    from kit.run import fields
    from kit.run.config import load_config

    for seed in seeds:
        for arm in arms:
            run_dir = runs / f"{name}_{arm}_s{seed}"
            if (run_dir / "eval" / "baselines.json").exists():
                continue  # done: rerun by deleting the folder
            overrides = ["task_args={dataset: humaneval, prefill: helper}", f"max_new_tokens={tokens}",
                         f"seed={seed}", f"run_dir={run_dir}", "progress=false", *extra]
            cfg = load_config(preset, overrides=overrides + ([f"environment={env}", *tool_extra] if arm == "tool" else []))
            run_dir.mkdir(parents=True, exist_ok=True)
            fields.save(cfg, run_dir / "config.json")
            compare(run_dir, ["naive", *(plain_methods if arm == "plain" else [])], n=n)


def tool_table(runs: Path = RUNS, name: str = "code") -> str:
    from kit.analysis import stats

    rows = {arm: {} for arm in ARMS}  # arm -> seed -> the untrained team's baselines row
    others = {}  # "plain <method>" -> seed -> a baseline sampled in the plain arm besides its team (--plain-methods)
    for run in sorted(runs.glob(f"{name}_*_s*")):
        arm, seed = run.name[len(name) + 1:].rsplit("_s", 1)
        if arm in rows and (run / "eval" / "baselines.json").exists():
            for row in json.loads((run / "eval" / "baselines.json").read_text()):
                if row["method"] == "naive":
                    rows[arm][int(seed)] = row
                elif arm == "plain" and row["method"] != "magrpo":
                    others.setdefault(f"plain {row['method']}", {})[int(seed)] = row
    rows.update({k: v for k, v in others.items() if set(v) >= set(rows["tool"]) & set(rows["plain"])})
    seeds = sorted(set(rows["tool"]) & set(rows["plain"]))
    if not seeds:
        return f"no seed with both arms in {runs}"

    def items(arm, key):
        per = [np.asarray(rows[arm][s]["per_item"][key], dtype=float) for s in seeds]
        return np.mean([p / (rows[arm][s]["num_samples"] if key == "correct" else 1) for p, s in zip(per, seeds)],
                       axis=0)

    first = rows["tool"][seeds[0]]
    config = json.loads((runs / f"{name}_tool_s{seeds[0]}" / "config.json").read_text())
    lines = [f"### The untrained coder team with `{config['environment']}` and without, {config['task_args']} (seeds "
             f"{', '.join(map(str, seeds))}, {len(first['per_item']['reward'])} items, {first['num_samples']} joint "
             "actions per item per seed)", "",
             "| arm | pass@1 (95% CI over items) | per seed | reward (95% CI) | per seed | tool calls per completion "
             "| tokens/s |", "|---|---|---|---|---|---|---|"]
    for arm in rows:
        p, r = stats.bootstrap(items(arm, "correct")), stats.bootstrap(items(arm, "reward"))
        per_pass = ", ".join(f"{rows[arm][s]['pass@1']:.2f}" for s in seeds)
        per_reward = ", ".join(f"{rows[arm][s]['reward/mean']:.2f}" for s in seeds)
        speed = np.mean([rows[arm][s].get("tokens_per_s", np.nan) for s in seeds])
        calls = np.mean([rows[arm][s].get("tools/calls_per_completion", 0.0) for s in seeds])
        lines.append(f"| {arm} | {stats.fmt(*p)} | {per_pass} | {stats.fmt(*r)} | {per_reward} | {calls:.2f} | "
                     f"{speed:.1f} |")
    dp = stats.paired_bootstrap(items("tool", "correct"), items("plain", "correct"))
    dr = stats.paired_bootstrap(items("tool", "reward"), items("plain", "reward"))
    lines += ["", f"tool minus plain, paired over items: pass@1 {stats.fmt(*dp)}, reward {stats.fmt(*dr)}"]
    for other in [k for k in others if k in rows]:  # in the order the plain arm sampled them
        dp = stats.paired_bootstrap(items("tool", "correct"), items(other, "correct"))
        dr = stats.paired_bootstrap(items("tool", "reward"), items(other, "reward"))
        lines.append(f"tool minus {other}: pass@1 {stats.fmt(*dp)}, reward {stats.fmt(*dr)}")
    return "\n".join(lines)


def cache(items: int, extra: list[str], preset: str = "coder_keys") -> None:
    import tempfile
    import time

    from kit.analysis.evaluate import parallel_joints
    from kit.engine.rollout import engine_for
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    with tempfile.TemporaryDirectory() as tmp:
        # the HF engine on every machine: it is the one that carries a cache (the compiled one, CUDA's default for
        # the team, forwards the whole context each round anyway)
        cfg = load_config(preset, overrides=[f"run_dir={tmp}/run", "progress=false", "rollout_engine=hf", *extra])
        trainer = Trainer(cfg)
        engine = engine_for(trainer.team, 0)
        rows, out = trainer.train_items[:items], {}
        for carry in (True, False):
            engine.carries_cache = carry
            sampler = trainer.sampler
            calls = sampler.tool_calls
            t0 = time.perf_counter()
            joints, tokens, seconds = parallel_joints(sampler, trainer.task, rows, cfg.num_generations,
                                                      tag="cache")
            out[carry] = (joints, tokens, seconds, sampler.tool_calls - calls, time.perf_counter() - t0)
            print(f"carried cache {carry}: generate {seconds:.1f} s ({time.perf_counter() - t0:.1f} s with tools), "
                  f"{tokens} generated tokens, {out[carry][3]} tool calls", flush=True)
        trainer.close()
    same = [tuple(j) for per in out[True][0] for j in per] == [tuple(j) for per in out[False][0] for j in per]
    print(f"| rows | generated tokens | tool calls | generate, cache carried (s) | generate, whole context each "
          f"round (s) | speed-up | same answers |\n|---|---|---|---|---|---|---|\n"
          f"| {items * cfg.num_agents * cfg.num_generations} | {out[True][1]} / {out[False][1]} | {out[True][3]} / "
          f"{out[False][3]} | {out[True][2]:.1f} | {out[False][2]:.1f} | {out[False][2] / out[True][2]:.2f}x | {same} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("--preset", default="coder_keys")
    tr.add_argument("--seeds", type=int, nargs="+", default=[0])
    tr.add_argument("--set", dest="extra", nargs="*", default=[])
    tr.add_argument("--n", type=int, default=0, help="after training: the untrained and the trained team sampled at "
                    "the preset's temperature, n joint rollouts per held-out row (0: none)")
    tr.add_argument("--name", default="", help="the runs' folder name before _s<seed> (default: the preset's), so "
                    "that runs of one preset with other --set settings keep their own folders")
    tb = sub.add_parser("table")
    tb.add_argument("--preset", default="coder_keys")
    tb.add_argument("--name", default="")
    to = sub.add_parser("tool", help="the untrained code team with run_tests and without")
    to.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    to.add_argument("--n", type=int, default=2, help="joint actions per held-out item")
    to.add_argument("--tokens", type=int, default=480, help="max_new_tokens of both arms")
    to.add_argument("--set", dest="extra", nargs="*", default=[])
    to.add_argument("--env", default=TOOL_ENV, help="the tool arm's environment (default: CodeTests)")
    to.add_argument("--name", default="code", help="the run folders' prefix: <name>_<arm>_s<seed>")
    to.add_argument("--tool-set", dest="tool_extra", nargs="*", default=[], help="overrides of the tool arm alone")
    to.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to sample (default both)")
    to.add_argument("--plain-methods", nargs="*", default=[], help="baselines sampled in the plain arm besides its "
                    "team, e.g. discussion (tool-table adds their rows)")
    tt = sub.add_parser("tool-table")
    tt.add_argument("--name", default="code")
    ca = sub.add_parser("cache", help="tool rounds from the carried KV cache against the whole context each round")
    ca.add_argument("--items", type=int, default=1)
    ca.add_argument("--set", dest="extra", nargs="*", default=[])
    args = parser.parse_args()
    if args.command == "train":
        train(args.preset, args.seeds, args.extra, args.n, args.name)
    elif args.command == "tool":
        tool(args.seeds, args.n, args.tokens, args.extra, env=args.env, name=args.name, tool_extra=args.tool_extra,
             plain_methods=args.plain_methods, arms=tuple(args.arms))
    elif args.command == "cache":
        cache(args.items, args.extra)
    elif args.command == "tool-table":
        text = tool_table(name=args.name)
        (OUT.parent / f"{args.name}_tool.md").write_text(text + "\n")
        print(text)
    else:
        text = table(args.preset, args.name)
        out = OUT if not args.name else OUT.parent / f"{args.name}.md"  # a named table beside the preset's
        out.parent.mkdir(exist_ok=True)
        out.write_text(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
