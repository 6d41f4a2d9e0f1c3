"""Command line: `python -m kit train --preset tiny_cpu [--config F] [--set k=v ...] [--run-dir D] [--resume]`.

Ends with a summary: the reward at the start and the end, and where the newest checkpoint is.
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
    args = parser.parse_args(argv)

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


def format_summary(s: dict) -> str:
    def num(x):
        return "n/a" if x is None else f"{x:.3f}"

    return (f"trained {s['steps']} steps in {s['run_dir']}\n"
            f"  train reward (sampled): {num(s['reward_start'])} at the start -> {num(s['reward_end'])} at the end\n"
            f"  eval reward (greedy):   {num(s['eval_start'])} at the start -> {num(s['eval_end'])} at the end\n"
            f"  newest checkpoint: {s['checkpoint']}")


if __name__ == "__main__":
    sys.exit(main())
