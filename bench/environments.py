"""Teams that act (issue 52): the KeyHalves information game on a real model, from the untrained team to the trained
one, against the game's exact optimum (1.0).

    python bench/environments.py train --seeds 0 1           # coder_keys (Qwen2.5-Coder-0.5B), one run per seed
    python bench/environments.py table                       # bench/results/environments.md

Each run is the preset with `--set seed=S`, trained in checkpoints/env_bench/<preset>_s<S> (git-ignored), with the
preset's greedy held-out evaluation (8 held-out rows, one joint rollout each) at step 0, every eval_every steps and the
last step. The table: held-out reward per step and seed, its mean over seeds with the range, the share of the
optimum, tool calls per completion and the s/step split (generation, tools, update).
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


def train(preset: str, seeds: list[int], extra: list[str]) -> None:
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    for seed in seeds:
        run_dir = RUNS / f"{preset}_s{seed}"
        cfg = load_config(preset, overrides=[f"seed={seed}", f"run_dir={run_dir}", "progress=false", *extra])
        trainer = Trainer(cfg, resume=(run_dir / "config.json").exists())
        trainer.train()
        trainer.close()


def table(preset: str) -> str:
    runs = sorted(RUNS.glob(f"{preset}_s*"))
    per_seed = {}
    for run in runs:
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        per_seed[int(run.name.rsplit("_s", 1)[1])] = rows
    if not per_seed:
        return f"no runs of {preset} in {RUNS}"
    steps = sorted({r["step"] for rows in per_seed.values() for r in rows if "eval/reward_mean" in r})
    lines = [f"### {preset}: held-out reward (greedy, 8 held-out rows; the optimum is 1.0)", "",
             "| step | " + " | ".join(f"seed {s}" for s in per_seed) + " | mean over seeds (range) |",
             "|---|" + "---|" * (len(per_seed) + 1)]
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
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("--preset", default="coder_keys")
    tr.add_argument("--seeds", type=int, nargs="+", default=[0])
    tr.add_argument("--set", dest="extra", nargs="*", default=[])
    tb = sub.add_parser("table")
    tb.add_argument("--preset", default="coder_keys")
    args = parser.parse_args()
    if args.command == "train":
        train(args.preset, args.seeds, args.extra)
    else:
        text = table(args.preset)
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(text + "\n")
        print(text)


if __name__ == "__main__":
    main()
