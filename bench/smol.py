"""SmolLM2-135M-Instruct on a laptop CPU: the paper's Table 1 at 135M, the step's time split, held-out curves.

    python bench/smol.py train writing --seeds 0 1 2           # smol_writing per seed, then baselines + team
    python bench/smol.py train code --seeds 0 1 2              # smol_code, one turn
    python bench/smol.py train code --turns 2 --seeds 0 1 2    # smol_code with the task's feedback turn
    python bench/smol.py train humaneval --seeds 0             # smol_code on HumanEval's train and eval splits
    python bench/smol.py train hanabi --seeds 0 1 2            # smol_hanabi (random / rule / untrained / trained)
    python bench/smol.py table                                 # bench/results/smol.md + smol_<task>.png
    python bench/smol.py train coder --seeds 0 1 2 --n 2 --set eval_every=0   # coder_code (Qwen2.5-Coder-0.5B)
    python bench/smol.py train coder-g2 --turns 2 --seeds 0 --n 2 --set eval_every=0   # G=2, a feedback turn
    python bench/smol.py table --coder                         # bench/results/coder.md
    python bench/smol.py archive checkpoints/smol_bench/coder_s3 # keep a run's table data (train does it itself)

Each run is the preset with `--set seed=S` (and `--steps`, `--turns`), trained in checkpoints/smol_bench/<label>_s<S>
(git-ignored). After training, `kit baselines` runs on the same held-out items at `--n` samples per item: the four
baselines on the untrained base (single model, naive concatenation = the untrained team, sequential pipeline,
one-round discussion; a game: random, rule, base) and the trained team (`magrpo`), all sampled at the preset's
temperature. A multi-turn run evaluates the untrained and the trained team through the same feedback turns (the
last turn's reward; kit/analysis/evaluate.py) and takes the other baselines from the one-turn runs (same base, same
items); `--team-only` skips every baseline, `--methods naive` runs only the untrained team's.

`table` pools the seeds: a method's value is the mean over items of the per-item mean over seeds and samples, its
interval a 95% percentile bootstrap over the held-out items (kit/analysis/stats.py), and MAGRPO minus the untrained team a
paired bootstrap on the same items; the range over seeds is beside it. The figure is each method's held-out greedy
reward over steps (eval/reward_mean), the mean over seeds with a band from the lowest to the highest seed, and the
baselines' sampled means as dashed lines. The time split is the mean over training steps of the logged perf/
times: generate, reward (scoring, sandboxed tests), update. Each trained run's config, metrics and baselines are kept
in bench/results/runs/<run> (committed, no weights; `archive`), and `table` pools those with the runs on this machine,
so seeds run on machines that are gone still count (from 2026-11-28 on: earlier runs were not kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = ROOT / "checkpoints" / "smol_bench"
KEPT = Path(__file__).resolve().parent / "results" / "runs"  # archive(): runs kept in git, without weights
OUT = ROOT / "bench" / "results"
PRESET = {"writing": "smol_writing", "code": "smol_code", "humaneval": "smol_code", "hanabi": "smol_hanabi",
          "coder": "coder_code", "coder-humaneval": "coder_code", "coder-mbpp": "coder_code",
          "coder-humaneval-b2": "coder_code", "coder-mbpp-b2": "coder_code", "coder-g2": "coder_code",
          "coder-humaneval-lr3e-5": "coder_code", "coder-mbpp-lr3e-5": "coder_code",
          "coder-humaneval-g2": "coder_code"}
# a task of this script that is a preset with other task_args: HumanEval's train/eval splits instead of coop's
TASK_OVERRIDES = {"humaneval": ["task_args={dataset: humaneval, prefill: helper}"],
                  "coder-humaneval": ["task_args={dataset: humaneval, prefill: helper}"],
                  "coder-mbpp": ["task_args={dataset: mbpp, prefill: helper}"],
                  # second settings for HumanEval/MBPP, chosen from seeds 0-2 / 0 of the two above (where 10 updates
                  # of one item at 1e-4 lost held-out tests) and run on fresh seeds: two items a step, half the rate
                  "coder-humaneval-b2": ["task_args={dataset: humaneval, prefill: helper}", "batch_size=2",
                                         "learning_rate=5e-5"],
                  "coder-mbpp-b2": ["task_args={dataset: mbpp, prefill: helper}", "batch_size=2",
                                    "learning_rate=5e-5"],
                  # the cooperative problems with G=2: for multi-turn (`--turns 2`), where every first-turn joint
                  # action branches into its own feedback node, G=4 makes 40 rows a step (~14 min here), G=2 12
                  "coder-g2": ["num_generations=2"],
                  # third settings for HumanEval, from KeyHalves (2026-11-29): there 1e-4 locked an agent into a
                  # failing loop and 3e-5 learned, with the team's reward alone too; no HumanEval seed was looked at
                  "coder-humaneval-lr3e-5": ["task_args={dataset: humaneval, prefill: helper}", "learning_rate=3e-5"],
                  # the same rate on MBPP, chosen before any MBPP run at it
                  "coder-mbpp-lr3e-5": ["task_args={dataset: mbpp, prefill: helper}", "learning_rate=3e-5"],
                  # HumanEval multi-turn (`--turns 2`): G=2 as coder-g2, at HumanEval's single-turn rate above
                  "coder-humaneval-g2": ["task_args={dataset: humaneval, prefill: helper}", "learning_rate=3e-5",
                                         "num_generations=2"]}
MODEL = {"coder": "Qwen2.5-Coder-0.5B-Instruct"}  # by the task's prefix; SmolLM2-135M-Instruct otherwise
BASELINE_ORDER = ["single", "naive", "sequential", "discussion", "random", "rule", "base"]


def label(task: str, turns: int) -> str:
    return task if turns == 1 else f"{task}_{turns}turns"


def train(task: str, seeds: list[int], steps: int | None, turns: int, n: int, extra: list[str],
          team_only: bool = False, methods: list[str] | None = None) -> None:
    from kit.analysis.baselines import compare
    from kit.run.config import load_config
    from kit.trainers.game_trainer import trainer_class

    for seed in seeds:
        run_dir = RUNS / f"{label(task, turns)}_s{seed}"
        overrides = [*TASK_OVERRIDES.get(task, []), f"seed={seed}", f"run_dir={run_dir}", "progress=false", *extra]
        overrides += [f"num_steps={steps}"] if steps else []
        overrides += [f"num_turns={turns}"] if turns > 1 else []
        cfg = load_config(PRESET[task], overrides=overrides)
        done = (run_dir / "config.json").exists()
        trainer = trainer_class(cfg.task, cfg.algorithm)(cfg, resume=done)
        trainer.train()
        trainer.close()
        # None: every baseline of the task; a multi-turn run: the untrained team through the same feedback turns
        chosen = [] if team_only else ["naive"] if turns > 1 else methods
        compare(run_dir, chosen, n=n)
        archive(run_dir)


def archive(run_dir: Path) -> Path:
    """Keep what the table reads of a run (config, metrics, baselines: a few hundred kB, no weights) in
    bench/results/runs/<run>, committed, so a table can pool seeds run on machines that are gone."""
    into = KEPT / run_dir.name
    (into / "eval").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.jsonl", "eval/baselines.json"):
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, into / name)
    return into


def load_runs() -> dict[str, list[dict]]:
    """label -> its seeds' {seed, config, metrics, baselines}."""
    runs: dict[str, list[dict]] = {}
    here = {d.name for d in RUNS.glob("*_s*")}  # a run on this machine wins over its kept copy
    for run_dir in sorted([*RUNS.glob("*_s*"), *(d for d in KEPT.glob("*_s*") if d.name not in here)]):
        base = run_dir / "eval" / "baselines.json"
        if not (run_dir / "metrics.jsonl").exists():
            continue
        name, seed = run_dir.name.rsplit("_s", 1)
        runs.setdefault(name, []).append({
            "seed": int(seed), "config": json.loads((run_dir / "config.json").read_text()),
            "metrics": [json.loads(line) for line in open(run_dir / "metrics.jsonl")],
            "baselines": json.loads(base.read_text()) if base.exists() else []})
    return runs


def pooled(rows: list[dict]) -> tuple[float, float, float, list[float], np.ndarray]:
    """(mean, low, high, per-seed means, per-item mean over seeds) of one method's rows, one row per seed."""
    from kit.analysis import stats

    items = np.mean([r["per_item"]["reward"] for r in rows], axis=0)  # (items,)
    mean, low, high = stats.bootstrap(items)
    return mean, low, high, [r["reward/mean"] for r in rows], items


def pass_items(rows: list[dict]) -> np.ndarray | None:
    """Each held-out item's pass@1, pooled over seeds and samples like the reward (None: no pass/fail task)."""
    if not all("correct" in r.get("per_item", {}) for r in rows):
        return None
    return np.mean([np.array(r["per_item"]["correct"]) / r["num_samples"] for r in rows], axis=0)


def pass_at_1(rows: list[dict], reference: list[dict] | None = None) -> str:
    """pass@1 with its bootstrap interval, per seed, and (for MAGRPO) minus the reference's, paired over items."""
    from kit.analysis import stats

    items = pass_items(rows)
    if items is None:
        return "| | "
    mean, low, high = stats.bootstrap(items)
    diff, ref_items = "", None if reference is None else pass_items(reference)
    if ref_items is not None:
        d, dl, dh = stats.paired_bootstrap(items, ref_items)
        diff = f"{d:+.3f} [{dl:+.3f}, {dh:+.3f}]"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}] | " + ", ".join(f"{r['pass@1']:.2f}" for r in rows) + f" | {diff}"


def split(metrics: list[dict]) -> dict:
    steps = [m for m in metrics if "perf/step_s" in m]
    gen = np.mean([m["perf/generate_s"] for m in steps])
    sample = np.mean([m["perf/sample_s"] for m in steps])
    return {"step": np.mean([m["perf/step_s"] for m in steps]), "generate": gen, "reward": sample - gen,
            "update": np.mean([m["perf/update_s"] for m in steps]), "steps": len(steps)}


SMOL_TASKS = ("writing", "code", "humaneval", "hanabi")
CODER_TASKS = ("coder", "coder-humaneval", "coder-mbpp", "coder-humaneval-b2", "coder-mbpp-b2", "coder-g2",
               "coder-humaneval-lr3e-5", "coder-mbpp-lr3e-5", "coder-humaneval-g2")


def table(tasks=SMOL_TASKS, out: str = "smol.md") -> None:
    from kit.analysis import stats

    runs = load_runs()
    lines = [f"# {'SmolLM2-135M-Instruct' if out == 'smol.md' else 'Qwen2.5-Coder-0.5B-Instruct'} on a CPU "
             f"(made by `python bench/smol.py table{'' if out == 'smol.md' else ' --coder'}`)", ""]
    for task in tasks:
        names = [k for k in runs if k == task or (k.startswith(f"{task}_") and k.endswith("turns"))]
        if not names:
            continue
        lines += [f"## {task} ({MODEL.get(task.split('-')[0], 'SmolLM2-135M-Instruct')})", "",
                  "| method | seeds | held-out reward (95% CI over items) | per seed | "
                  "MAGRPO minus it, paired (95% CI) | pass@1 (95% CI over items) | per seed | MAGRPO minus it, "
                  "pass@1 |", "|---|---|---|---|---|---|---|---|"]
        base_runs = runs.get(task, [])
        methods = [m for m in BASELINE_ORDER if any(r["method"] == m for s in base_runs for r in s["baselines"])]
        rows_of = {m: [r for s in base_runs for r in s["baselines"] if r["method"] == m] for m in methods}
        for name in names:
            untrained = [r for s in runs[name] for r in s["baselines"] if r["method"] == "naive"] \
                if name != task else []
            if untrained:  # a multi-turn run's untrained team, through the same feedback turns as its trained one
                rows_of[f"naive ({name})"] = untrained
            team = [r for s in runs[name] for r in s["baselines"] if r["method"] == "magrpo"]
            if team:
                rows_of[f"magrpo ({name})"] = team
        untrained_team = "naive" if "naive" in rows_of else "base" if "base" in rows_of else None
        for method, rows in rows_of.items():
            mean, low, high, per_seed, items = pooled(rows)
            diff = ""
            same_turns = method.replace("magrpo", "naive")  # "magrpo (code_2turns)" -> "naive (code_2turns)"
            reference = same_turns if same_turns in rows_of and same_turns != method else untrained_team
            if method.startswith("magrpo") and reference:
                d, dl, dh = stats.paired_bootstrap(items, pooled(rows_of[reference])[4])
                diff = f"{d:+.3f} [{dl:+.3f}, {dh:+.3f}] vs {reference}"
            passes = pass_at_1(rows, rows_of[reference] if method.startswith("magrpo") and reference else None)
            lines.append(f"| {method} | {len(rows)} | {mean:.3f} [{low:.3f}, {high:.3f}] | "
                         f"{', '.join(f'{v:.2f}' for v in per_seed)} | {diff} | {passes} |")
        n = rows_of[next(iter(rows_of))][0]["num_samples"] if rows_of else 0
        lines += ["", f"Sampled at the preset's temperature, {n} joint actions per held-out item per seed.", "",
                  "| run | steps | s/step | generate | reward | update | greedy held-out, step 0 -> last (per seed) |",
                  "|---|---|---|---|---|---|---|"]
        for name in names:
            for s in runs[name]:
                t = split(s["metrics"])
                evals = [m["eval/reward_mean"] for m in s["metrics"] if "eval/reward_mean" in m]
                greedy = f"{evals[0]:.3f} -> {evals[-1]:.3f}" if evals else "- (eval_every=0)"
                lines.append(f"| {name} s{s['seed']} | {t['steps']} | {t['step']:.1f} | {t['generate']:.1f} | "
                             f"{t['reward']:.1f} | {t['update']:.1f} | {greedy} |")
        lines.append("")
        figure_of(task, {k: runs[k] for k in names}, rows_of)
        lines += [f"![held-out reward over steps]({figure_name(task)})", ""]
    (OUT / out).write_text("\n".join(lines))
    print("\n".join(lines))


def figure_name(task: str) -> str:
    return f"{task}.png" if task.startswith("coder") else f"smol_{task}.png"


def figure_of(task: str, groups: dict[str, list[dict]], baselines: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, seeds in groups.items():
        curves = [{m["step"]: m["eval/reward_mean"] for m in s["metrics"] if "eval/reward_mean" in m} for s in seeds]
        if not all(curves):  # trained with eval_every=0: only the sampled rows below
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        values = np.array([[c[k] for k in steps] for c in curves])  # (seeds, points)
        line, = ax.plot(steps, values.mean(0), marker="o", label=f"MAGRPO {name} (greedy, {len(seeds)} seeds)")
        ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.2)
    last = max(m["step"] for seeds in groups.values() for s in seeds for m in s["metrics"])
    styles = iter(["--", ":", "-.", (0, (5, 1)), (0, (1, 3)), (0, (3, 1, 1, 1))])
    for method, rows in baselines.items():
        mean, low, high, _, _ = pooled(rows)
        if method.startswith("magrpo"):  # the trained team sampled like the baselines, at its last step
            ax.errorbar([last], [mean], yerr=[[mean - low], [high - mean]], fmt="s", color="black", capsize=3,
                        label=f"{method}, sampled (95% CI)")
        else:
            ax.axhline(mean, ls=next(styles), lw=1, color="grey", label=f"{method}, untrained, sampled")
    ax.set_xlabel("training step")
    ax.set_ylabel("held-out reward")
    ax.set_title(f"{MODEL.get(task.split('-')[0], 'SmolLM2-135M')}, {task}: held-out reward\n(line: greedy, mean over seeds, band: lowest to highest "
                 "seed)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / figure_name(task), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("task", choices=sorted(PRESET))
    tr.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    tr.add_argument("--steps", type=int, default=None, help="default: the preset's num_steps")
    tr.add_argument("--turns", type=int, default=1)
    tr.add_argument("--n", type=int, default=4, help="samples per held-out item for the table")
    tr.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    tr.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                    help="only these baselines (e.g. naive: the untrained team), then the trained team")
    tr.add_argument("--team-only", action="store_true",
                    help="after training, sample only the trained team (the baselines of other seeds stand)")
    ar = sub.add_parser("archive", help="keep runs' config, metrics and baselines in bench/results/runs")
    ar.add_argument("runs", nargs="+", type=Path)
    tb = sub.add_parser("table")
    tb.add_argument("--coder", action="store_true", help="the Qwen2.5-Coder-0.5B tasks, into bench/results/coder.md")
    args = parser.parse_args()
    if args.cmd == "train":
        train(args.task, args.seeds, args.steps, args.turns, args.n, args.extra, args.team_only, args.methods)
    elif args.cmd == "archive":
        for run_dir in args.runs:
            print(archive(run_dir))
    else:
        table(CODER_TASKS, "coder.md") if args.coder else table()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
