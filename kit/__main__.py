"""Command line.

    python -m kit train --preset tiny_cpu [--config F] [--set k=v ...] [--run-dir D] [--resume]
    python -m kit eval --run-dir D [--steps all|newest|100,200] [--n 10] [--items 32]
    python -m kit baselines --run-dir D [--methods single,naive,sequential,discussion] [--n 10]
    python -m kit schemes --run-dir D [--turn 0]

`train` ends with a summary (the reward at the start and the end, the newest checkpoint). The others print a
markdown table and write JSON and a PNG under <run_dir>/eval/.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit", description="Train teams of LLM agents with MAGRPO.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a team (new run, or --resume the newest checkpoint)")
    train.add_argument("--preset", help="tiny_cpu, colab_t4 or colab_a100")
    train.add_argument("--config", help="a YAML or JSON file of TrainConfig fields")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one field (repeatable), e.g. --set learning_rate=1e-4")
    train.add_argument("--run-dir", help="run directory (default: the preset's)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    ev = sub.add_parser("eval", help="pass@k and rewards of the base and a run's checkpoints on held-out items")
    ev.add_argument("--steps", default="all", help="all, newest, or step numbers separated by commas (0: base)")
    bl = sub.add_parser("baselines", help="single / naive / sequential / discussion baselines vs the trained team")
    bl.add_argument("--methods", default="single,naive,sequential,discussion")
    bl.add_argument("--step", default="newest", help="the team's checkpoint step (default: the newest)")
    for p in (ev, bl):
        p.add_argument("--run-dir", required=True)
        p.add_argument("--n", type=int, default=10, help="samples per agent per item (pass@k for k <= n)")
        p.add_argument("--items", type=int, default=None, help="held-out items (default: the run's num_eval_items)")
    sc = sub.add_parser("schemes", help="cooperation-scheme shares per step from a run's rollouts.jsonl")
    sc.add_argument("--run-dir", required=True)
    sc.add_argument("--turn", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command != "train":
        try:
            return _analyse(args)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    from kit.config import ConfigError, load_config

    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    try:
        cfg = load_config(args.preset, args.config, overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    from kit.trainer import Trainer

    try:
        trainer = Trainer(cfg, resume=args.resume)
    except (FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = trainer.train()
    trainer.close()
    print(format_summary(summary))
    print(json.dumps(summary))
    return 0


def _analyse(args) -> int:
    from pathlib import Path

    from kit import plots
    from kit.evaluate import format_table

    out = Path(args.run_dir) / "eval"
    if args.command == "eval":
        from kit.evaluate import evaluate_run

        steps = args.steps if args.steps in ("all", "newest") else [int(s) for s in args.steps.split(",")]
        rows = evaluate_run(args.run_dir, steps, n=args.n, num_items=args.items)
        print(format_table(rows))
        plots.eval_curves(rows, path=out / "eval_curves.png")
    elif args.command == "baselines":
        from kit.baselines import compare

        step = args.step if args.step == "newest" else int(args.step)
        rows = compare(args.run_dir, [m for m in args.methods.split(",") if m], n=args.n, num_items=args.items,
                       step=step)
        print(format_table(rows, first="method"))
        plots.baseline_bars(rows, path=out / "baselines.png")
    else:
        import json

        from kit.schemes import SCHEMES, scheme_shares

        shares = scheme_shares(args.run_dir, turn=args.turn)
        out.mkdir(parents=True, exist_ok=True)
        (out / "schemes.json").write_text(json.dumps(shares, indent=1))
        print(format_table(shares, ["step", "count", *SCHEMES]))
        if shares:
            plots.scheme_area(shares, path=out / "schemes.png")
    print(f"written under {out}")
    return 0


def format_summary(s: dict) -> str:
    def num(x):
        return "n/a" if x is None else f"{x:.3f}"

    return (f"trained {s['steps']} steps in {s['run_dir']}\n"
            f"  train reward (sampled): {num(s['reward_start'])} at the start -> {num(s['reward_end'])} at the end\n"
            f"  eval reward (greedy):   {num(s['eval_start'])} at the start -> {num(s['eval_end'])} at the end\n"
            f"  newest checkpoint: {s['checkpoint']}")


if __name__ == "__main__":
    sys.exit(main())
