"""The tiny_cpu demo over seeds: final greedy reward and time per variant of the update's options.

    python bench/tiny_seeds.py                                   # the preset, seeds 0-7
    python bench/tiny_seeds.py --variant scale_rewards=group --variant loss_type=grpo,learning_rate=5e-3
    python bench/tiny_seeds.py --seeds 0 1 2 --workers 2 --out bench/out/tiny_seeds.jsonl
    python bench/tiny_seeds.py --reward words --variant task=writing,max_new_tokens=16   # a second reward function

Each variant is a comma-separated list of `key=value` overrides on top of tiny_cpu ("" is the preset itself). Runs go
to separate processes (`--workers` at a time, one torch thread each); one JSON line per run is appended to --out,
and a table per variant is printed: the final greedy reward (eval_end) of every seed, its min and mean, the number
of seeds at >= 0.85, the mean seconds of train() alone (building the model is not counted) and s/step, and the
mean |advantage| of the last 20 steps (near 0 when the samples of every group agree: the policy has stopped
exploring and learns nothing more). `--reward words` adds `words`, a reward function of the texts' lengths, beside
the task's own reward (issue 33's rows with two rewards under each multi_objective_aggregation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def words(item, completions) -> float:
    """A dense length reward: each agent's text scores min(words / 8, 1), averaged over the agents."""
    return sum(min(len(c.split()) / 8, 1.0) for c in completions) / len(completions)


REWARDS = {"": [], "words": [words]}


def run(variant: str, seed: int, reward: str = "") -> dict:
    import torch

    torch.set_num_threads(1)
    from kit.run.config import load_config
    from kit.run.rundir import read_jsonl
    from kit.trainers.trainer import Trainer

    overrides = [o for o in variant.split(",") if o]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny_cpu", overrides=[*overrides, f"seed={seed}", f"run_dir={tmp}/run", "progress=false",
                                                 "log_rollouts=false", "save_every=0"])
        trainer = Trainer(cfg, reward_funcs=REWARDS[reward], log=lambda *_: None)  # builds (and for a new seed warms up) the tiny model: not timed
        t0 = time.perf_counter()
        summary = trainer.train()
        seconds = time.perf_counter() - t0
        trainer.close()
        rows = read_jsonl(Path(tmp) / "run" / "metrics.jsonl")
    curve = [[r["step"], round(r["eval/reward_mean"], 3)] for r in rows if "eval/reward_mean" in r]
    # |advantage| over the last 20 steps: ~0 when every group's samples agree (the policy has collapsed)
    last = [r["advantage/abs_mean"] for r in rows if "advantage/abs_mean" in r][-20:]
    adv_end = sum(last) / max(len(last), 1)
    return {"variant": variant, "reward_funcs": reward, "seed": seed, "eval_end": summary["eval_end"], "seconds": round(seconds, 1),
            "s_per_step": round(seconds / cfg.num_steps, 3), "adv_end": round(adv_end, 4), "evals": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", help="comma-separated key=value overrides (repeatable)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/out/tiny_seeds.jsonl")
    ap.add_argument("--reward", choices=sorted(REWARDS), default="", help="reward functions beside the task's own")
    args = ap.parse_args()
    variants = args.variant or [""]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    jobs = [(v, s) for v in variants for s in args.seeds]
    results = []
    with ProcessPoolExecutor(args.workers) as pool, open(args.out, "a") as out:
        for row in pool.map(run, *zip(*jobs), [args.reward] * len(jobs)):
            results.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)
    print(f"\n| variant | {' | '.join(f'seed {s}' for s in args.seeds)} | min | mean | >= 0.85 | s (train) | s/step "
          "| adv_end |")
    print("|---|" + "---|" * (len(args.seeds) + 6))
    for v in variants:
        rows = [r for r in results if r["variant"] == v]
        ends = [r["eval_end"] for r in rows]
        print(f"| {v or 'tiny_cpu'} | " + " | ".join(f"{e:.3f}" for e in ends) +
              f" | {min(ends):.3f} | {sum(ends) / len(ends):.3f} | {sum(e >= 0.85 for e in ends)}/{len(ends)} | "
              f"{sum(r['seconds'] for r in rows) / len(rows):.0f} | "
              f"{sum(r['s_per_step'] for r in rows) / len(rows):.3f} | "
              f"{sum(r['adv_end'] for r in rows) / len(rows):.3f} |")


if __name__ == "__main__":
    main()
