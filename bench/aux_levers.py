"""What makes main call aux: the untrained code team sampled on TRAINING problems under each prompt lever.

    python bench/aux_levers.py --preset coder_mbpp --items 12 --n 4 --seed 900 --label mbpp
    python bench/aux_levers.py --preset coder_code --items 12 --n 4 --seed 900 --label coop

Issue 78, item 2: at 0.5B the trained team's main never calls the helper's `aux`, so the cooperation part of the reward
(which needs a call) never varies within a group and MAGRPO has nothing to learn it from. This measures, before any
training and on training problems only (never the held-out ones the table reports), how often main calls aux (by the
AST, kit.tasks.codeparse.aux_use, on every sample) under each lever a run can set:

    free        the preset's prompts: main is told only that `aux` exists
    entry       `aux_signature: entry`: aux takes the entry point's own arguments and both agents are told so
and for each, the second turn of the task's level feedback (`num_turns=2`), which names a missing call once a test
passes. `--schedules sequential`: main writes after reading the helper's aux (the sequential baseline). The single
model's rate (one completion writing both functions, SINGLE_PROMPT) is beside them: the same model,
when it writes aux itself. Rows are appended to bench/results/aux_levers.md with the commit and seed.

A lever that raises main's call rate gives the cooperation reward something to vary on within a group; whether training
then keeps it is the table's question (bench/code_table.py), not this script's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rates(task, per_item: list[list]) -> dict:
    flat = [r for rs in per_item for r in rs]
    return {"aux_call": float(np.mean([bool(r.details.get("main_calls_aux")) for r in flat])),
            "aux_defined": float(np.mean([bool(r.details.get("aux_defined")) for r in flat])),
            "pass": float(np.mean([task.is_pass(r) for r in flat])),
            "coop_reward": float(np.mean([r.parts.get("cooperation", 0.0) > 0 for r in flat])),
            "reward": float(np.mean([r.total for r in flat])),
            "groups_with_a_call": float(np.mean([any(r.details.get("main_calls_aux") for r in rs)
                                                 for rs in per_item]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder_mbpp")
    ap.add_argument("--items", type=int, default=12, help="the first N training problems")
    ap.add_argument("--n", type=int, default=4, help="samples per problem (the preset's G)")
    ap.add_argument("--seed", type=int, default=900)
    ap.add_argument("--levers", nargs="*", default=["free", "entry"])
    ap.add_argument("--schedules", nargs="*", default=["single"], help="also: sequential (main reads the helper's "
                    "aux before writing)")
    ap.add_argument("--turns", type=int, default=2, help="1: the levers' first turn only")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    from kit.analysis.evaluate import sample_turns, score
    from kit.run.checkpoint import seed_everything
    from kit.run.config import load_config
    from kit.tasks.rewards import Scorer, reward_model_for
    from kit.trainers.trainer import Trainer

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out_file = ROOT / "bench" / "results" / "aux_levers.md"
    header = ("| label | commit | preset | seed | lever | turn | problems x n | main calls aux | groups with a call | "
              "aux defined | pass | cooperation rewarded | reward | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    if not out_file.exists():
        out_file.write_text(header + "\n")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(args.preset, overrides=[f"seed={args.seed}", f"run_dir={tmp}/run", "eval_every=0"])
        trainer = Trainer(cfg, log=lambda *a, **k: None)
        task = trainer.task
        items = task.load("train")[: args.items]
        scorer = Scorer(reward_model_for(cfg, task), cfg.reward_workers, "thread")
        try:
            for lever in args.levers:
                task.aux_signature = lever
                seed_everything(args.seed)
                t0 = time.perf_counter()
                _, per_turn, _, _ = sample_turns(trainer.sampler, task, items, args.n, scorer, turns=args.turns)
                secs = time.perf_counter() - t0
                for turn, per_item in enumerate(per_turn, 1):
                    emit(out_file, args, commit, lever, turn, rates(task, per_item), secs / args.turns)
            if "sequential" in args.schedules:  # main sees the helper's aux first (kit/analysis/baselines.py)
                from kit.analysis.baselines import _sequential

                task.aux_signature = "free"
                seed_everything(args.seed)
                t0 = time.perf_counter()
                joints, _, _ = _sequential(trainer.sampler, task, items, args.n)
                emit(out_file, args, commit, "sequential (main reads aux)", 1,
                     rates(task, score(scorer, items, joints)), time.perf_counter() - t0)
            if "single" not in args.schedules:
                return
            # the single model: one completion writes aux and the entry point (kit/analysis/baselines.py's single)
            task.aux_signature = "free"
            seed_everything(args.seed)
            t0 = time.perf_counter()
            ro = trainer.sampler.sample([(0, task.single_prompt(item)) for item in items], args.n,
                                        keys=[("single", item["id"]) for item in items])
            joints = [[tuple(task.split_single(item, ro.texts[k][g])) for g in range(args.n)]
                      for k, item in enumerate(items)]
            emit(out_file, args, commit, "single model", 1, rates(task, score(scorer, items, joints)),
                 time.perf_counter() - t0)
        finally:
            scorer.close()
            trainer.close()


def emit(out_file: Path, args, commit: str, lever: str, turn: int, r: dict, secs: float) -> None:
    line = (f"| {args.label} | {commit} | {args.preset} | {args.seed} | {lever} | {turn} | {args.items} x {args.n} | "
            f"{r['aux_call']:.3f} | {r['groups_with_a_call']:.3f} | {r['aux_defined']:.3f} | {r['pass']:.3f} | "
            f"{r['coop_reward']:.3f} | {r['reward']:.3f} | {secs:.0f} |")
    print(line, flush=True)
    with open(out_file, "a") as f:
        f.write(line + "\n")


if __name__ == "__main__":
    main()
