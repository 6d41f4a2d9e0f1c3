"""Learning on a CPU: tiny_hanabi self-play with the built-in tiny model (the `tiny_hanabi` preset), per seed.

    python bench/game_learning.py                       # seeds 0-5, 300 steps each
    python bench/game_learning.py --seeds 0 1 2 --steps 300

OpenSpiel's tiny_hanabi: each player holds one of two cards; player 0 moves (3 moves), then player 1, who sees
that move; both get the same payoff. Its optimum is 10 (player 0 signals its card with its move), found by
enumerating all 9 x 729 deterministic joint policies (tests/test_games.py); the best convention that ignores the
cards (both play the middle move) gets 8; uniformly random legal play gets 3.72 on average.

Every `--every` steps the greedy team is scored exactly: one greedy episode of each of the 4 deals, which are
equally likely, so their mean is the expected score. Per seed: the curve, the first step at >= 80% of the
optimum, the final value, whether the optimum was reached, and the wall time of training alone (the exact
evaluations are not counted). Rows are appended to bench/out/game_learning.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"
OPTIMUM = 10.0


def every_deal(task, tries: int = 1000) -> list[dict]:
    """One held-out item per distinct deal of tiny_hanabi (the seeds that deal each card pair first)."""
    seen: dict[tuple, int] = {}
    for seed in range(1_000_000, 1_000_000 + tries):
        seen.setdefault(tuple(task.reset(seed).state.history()), seed)
    if len(seen) != 4:
        raise RuntimeError(f"expected the 4 deals of tiny_hanabi, saw {sorted(seen)}")
    return [{"id": f"deal_{h}", "seed": s} for h, s in sorted(seen.items())]


def learn(seed: int, steps: int = 300, every: int = 25, stop_at: float | None = None, run_dir=None,
          overrides=()) -> dict:
    """Train the tiny_hanabi preset with `seed`; the exact greedy value every `every` steps. `stop_at`: stop once
    the value reaches it (the test's early exit)."""
    import tempfile

    import torch

    from kit.run.config import load_config
    from kit.trainers.game_trainer import GameTrainer
    from kit.tasks.games import greedy_eval

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny_hanabi", overrides=[f"run_dir={run_dir or Path(tmp) / 'run'}", f"seed={seed}",
                                                    f"num_steps={steps}", "eval_every=0", "save_every=0",
                                                    "progress=false", "log_rollouts=false", *overrides])
        trainer = GameTrainer(cfg, log=lambda *_: None)
        deals = every_deal(trainer.task)
        curve, seconds, first = [], 0.0, None
        while trainer.step < steps:
            start = time.perf_counter()
            trainer.train(max_steps=every)
            seconds += time.perf_counter() - start
            curve.append(greedy_eval(trainer.sampler, trainer.task, deals)["eval/score_mean"])
            if first is None and curve[-1] >= 0.8 * OPTIMUM:
                first = trainer.step
            if stop_at is not None and curve[-1] >= stop_at:
                break
        trainer.close()
    return {"seed": seed, "steps": trainer.step, "curve": curve, "first_step_at_80pct": first,
            "final": curve[-1], "best": max(curve), "optimum_found": max(curve) >= OPTIMUM, "train_s": seconds}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(6)))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides of the tiny_hanabi preset")
    args = parser.parse_args(argv)
    rows = [learn(s, args.steps, args.every, overrides=args.set) for s in args.seeds]
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "game_learning.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps({**r, "set": args.set}) + "\n")
    print("| seed | first step >= 8 (80%) | final | best | optimum (10) found | train s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['first_step_at_80pct']} | {r['final']:g} | {r['best']:g} | {r['optimum_found']} "
              f"| {r['train_s']:.0f} |")
    reached = sum(r["first_step_at_80pct"] is not None for r in rows)
    print(f"{reached}/{len(rows)} seeds reached 80% of the optimum; {sum(r['optimum_found'] for r in rows)}/"
          f"{len(rows)} found the optimum")
    return rows


if __name__ == "__main__":
    main()
