"""A real model's training step and held-out evaluation on a CPU, by precision: what issue 77 asks to be measured.

    python bench/cpu_step.py --preset coder_code --dtype float32 --steps 2 --label today
    python bench/cpu_step.py --preset coder_code --dtype bfloat16 --steps 2 --eval-items 0 --label bf16

Trains the preset for `--steps` steps in a fresh run folder (no held-out check, no checkpoint) and reads each
step's split from its metrics (`perf/generate_s`; the reward, `perf/sample_s` less generation; `perf/update_s`); then evaluates
the team after those steps as `kit eval` does (every agent's `--eval-n` samples of `--eval-items` held-out problems in one
batched call, scored in the sandbox) and times it. One row per run is appended to bench/results/cpu_step.md, with
the commit, the precision the run used and the CPU's bf16 flags (kit.env.cpu_bf16), so rows of two machines are
never read as one. The first step is shown apart: it pays one-off costs (the sandbox's start, allocator growth).

Compare rows of one machine under the same load only (run them one after the other, nothing else heavy).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder_code")
    ap.add_argument("--dtype", default="auto", help="auto, float32, bfloat16")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--eval-items", type=int, default=32)
    ap.add_argument("--eval-n", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--set", nargs="*", default=[], help="more key=value overrides")
    args = ap.parse_args()

    import torch

    from kit.analysis.evaluate import evaluate_team
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    try:
        from kit.env import cpu_bf16
        flags = cpu_bf16()
        flags = ",".join(flags.flags) or "none"
    except ImportError:  # a kit from before issue 77
        flags = "?"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"dtype={args.dtype}", f"seed={args.seed}", f"num_steps={args.steps}", "eval_every=0",
                     f"save_every={10**6}", f"run_dir={tmp}/run", *args.set]
        cfg = load_config(args.preset, overrides=overrides)
        trainer = Trainer(cfg, log=lambda *a, **k: None)
        dtype = str(next(trainer.team.models[0].get_base_model().parameters()).dtype).replace("torch.", "")
        trainer.train()
        rows = [json.loads(line) for line in open(Path(tmp) / "run" / "metrics.jsonl")]
        rows = [r for r in rows if "perf/generate_s" in r]
        steps = []  # the reward's time is the sampling phase's less generation (scoring overlaps it)
        for r in rows:
            steps.append((r["perf/generate_s"], r["perf/sample_s"] - r["perf/generate_s"], r["perf/update_s"]))
        eval_s = float("nan")
        rows_eval = 0
        if args.eval_items:
            items = trainer.task.load("eval")[: args.eval_items]
            t0 = time.perf_counter()
            out = evaluate_team(trainer.sampler, trainer.task, cfg, items, n=args.eval_n)
            eval_s = time.perf_counter() - t0
            rows_eval = len(items) * args.eval_n * len(trainer.task.prompts(items[0]))
            eval_metric = f"pass@1 {out.get('pass@1', float('nan')):.3f}, reward {out['reward/mean']:.3f}"
            args.eval_items = len(items)  # the split may hold fewer (coop: 12 held-out problems)
        trainer.close()
    first = steps[0] if steps else (float("nan"),) * 3
    rest = steps[1:] or steps
    mean = [sum(s[i] for s in rest) / len(rest) for i in range(3)] if rest else [float("nan")] * 3
    line = (f"| {args.label} | {commit} | {args.preset} | {dtype} | {flags} | {torch.get_num_threads()} | "
            f"{sum(first):.1f} ({first[0]:.1f} / {first[1]:.1f} / {first[2]:.1f}) | "
            f"{sum(mean):.1f} ({mean[0]:.1f} / {mean[1]:.1f} / {mean[2]:.1f}) | "
            + (f"{args.eval_items} x {args.eval_n} ({rows_eval} rows): {eval_s:.0f} s, {eval_metric} |"
               if args.eval_items else "- |"))
    header = ("| label | commit | preset | dtype | CPU bf16 flags | threads | step 1 s (generate / reward / update) | "
              "later steps, mean s (generate / reward / update) | held-out evaluation of the team after those steps |\n"
              "|---|---|---|---|---|---|---|---|---|")
    print(header)
    print(line, flush=True)
    out_file = ROOT / "bench" / "results" / "cpu_step.md"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    new = not out_file.exists()
    with open(out_file, "a") as f:
        f.write((header + "\n" if new else "") + line + "\n")


if __name__ == "__main__":
    main()
