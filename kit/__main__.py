"""Command line.

    python -m kit train --preset tiny_cpu [--config F] [--set k=v ...] [--run-dir D] [--resume]
    python -m kit train --run-dir D --resume [--set num_steps=2000]    # continue with the run's own config
    python -m kit train --run-dir D --from-scratch                     # start it over (old files kept aside)
    python -m kit eval --run-dir D [--steps all|newest|100,200] [--n 10] [--items 32]
    python -m kit baselines --run-dir D [--methods single,naive,sequential,discussion] [--n 10]
    python -m kit baselines --run-dir D                                 # a game run: random, rule, base, magrpo
    python -m kit schemes --run-dir D [--turn 0]
    python -m kit report --run-dir D [--out F]                          # D/report/RESULTS.md with its figures
    python -m kit compare D1 D2 ... [--labels A B ...] [--out F]        # F/COMPARE.md: runs and seeds side by side

`train` ends with a summary (the reward at the start and the end, the newest checkpoint). The others print a
markdown table and write JSON and a PNG under <run_dir>/eval/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def whole_number(text: str, smallest: int = 1, hint: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number{hint}") from None
    if value < smallest:
        raise argparse.ArgumentTypeError(f"{value} is too small: give {smallest} or more{hint}")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def steps_arg(text: str) -> str | list[int]:
    """--steps: all, newest, or step numbers separated by commas (0: the untrained base)."""
    if text in ("all", "newest"):
        return text
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give all, newest, or step numbers separated by commas "
                                         "(e.g. 0,100,200)") from None
    if not steps or min(steps) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: step numbers are 0 (the base) or more")
    return steps


def methods_arg(text: str) -> list[str]:
    """--methods: checked before anything runs, so a typo does not cost a finished baseline."""
    from kit.analysis.baselines import METHODS
    from kit.tasks.games import METHODS as GAME_METHODS

    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS + GAME_METHODS]
    if unknown or not methods:
        raise argparse.ArgumentTypeError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                                         f"choose from {','.join(METHODS)} (games: {','.join(GAME_METHODS)})")
    return methods


def step_arg(text: str) -> str | int:
    return text if text == "newest" else whole_number(text, 0, " (or newest)")


def say_resume(run_dir, from_scratch: bool = False) -> None:
    """The resume line 01_train prints (kit/colab.py), for the CLI: the checkpoint and the logged steps redone
    (printed by the first process only under torchrun / accelerate)."""
    from kit.run.rundir import dropped, newest_step

    if from_scratch or os.environ.get("RANK", "0") != "0":
        return
    step = newest_step(run_dir)
    print(f"[kit] continuing the run in {run_dir} from its checkpoint at step {step}{dropped(run_dir, step)}"
          if step >= 0 else f"[kit] {run_dir} holds a run stopped before its first checkpoint: starting it again "
          f"from step 0{dropped(run_dir, step)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit", description="Train teams of LLM agents with MAGRPO.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a team (new run, or --resume the newest checkpoint)")
    from kit.run.presets import PRESETS

    train.add_argument("--preset", choices=sorted(PRESETS), metavar="PRESET",
                       help="one of: " + ", ".join(PRESETS) + " (kit/run/presets.py says what each is for)")
    train.add_argument("--config", help="a YAML or JSON file of TrainConfig fields")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override one field (repeatable), e.g. --set learning_rate=1e-4")
    train.add_argument("--run-dir", help="run directory (default: the preset's)")
    train.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint")
    train.add_argument("--from-scratch", action="store_true",
                       help="start the run in --run-dir over from step 0; its checkpoints and logs move to "
                            "<run-dir>/previous_<time>/ (nothing is deleted)")
    ev = sub.add_parser("eval", help="pass@k and rewards of the base and a run's checkpoints on held-out items")
    ev.add_argument("--steps", type=steps_arg, default="all",
                    help="all, newest, or step numbers separated by commas (0: base)")
    bl = sub.add_parser("baselines", help="single / naive / sequential / discussion baselines vs the trained team")
    bl.add_argument("--methods", type=methods_arg, default=None,
                    help="default: single,naive,sequential,discussion (games: random,rule,base)")
    bl.add_argument("--step", type=step_arg, default="newest", help="the team's checkpoint step (default: the newest)")
    for p in (ev, bl):
        p.add_argument("--run-dir", required=True)
        p.add_argument("--n", type=positive_int, default=10, help="samples per agent per item (pass@k for k <= n)")
        p.add_argument("--items", type=positive_int, default=None,
                       help="held-out items (default: the run's num_eval_items)")
    sc = sub.add_parser("schemes", help="cooperation-scheme shares per step from a run's rollouts.jsonl")
    sc.add_argument("--run-dir", required=True)
    sc.add_argument("--turn", type=int, default=0)
    rp = sub.add_parser("report", help="write <run_dir>/report/RESULTS.md (figures, tables with intervals) from a run's files")
    rp.add_argument("--run-dir", required=True)
    rp.add_argument("--out", default=None, help="folder for RESULTS.md and its figures (default: <run_dir>/report)")
    cp = sub.add_parser("compare", help="several runs on one axis (seeds as mean and band) and a table of final metrics")
    cp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    cp.add_argument("--labels", nargs="+", default=None, help="one label per run (default: the folder names)")
    cp.add_argument("--out", default="comparison", help="folder for COMPARE.md and its figure (default: comparison)")
    for p in (train, ev, bl, sc, rp, cp):
        p.add_argument("--dry-run", action="store_true",
                       help="check the command (train: resolve the preset, config, overrides and task) and stop")
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.command != "train":
        try:
            return _analyse(args)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2

    from pathlib import Path

    from kit.run.checkpoint import DamagedCheckpoints
    from kit.run.config import ConfigError, load_config, load_file
    from kit.env import GPUNeeded, require_gpu
    from kit.trainers.game_trainer import trainer_class
    from kit.tasks import TaskArgError

    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    saved = (args.resume or args.from_scratch) and args.run_dir and not (args.preset or args.config) and \
        (Path(args.run_dir) / "config.json").exists()
    try:
        if saved:  # --resume (or --from-scratch) --run-dir D: the run's own config, with any --set on top
            saved_cfg = load_file(Path(args.run_dir) / "config.json")
            say_resume(args.run_dir, from_scratch=args.from_scratch)
            trainer = trainer_class(saved_cfg.get("task"), saved_cfg.get("algorithm", "magrpo")).from_run(
                args.run_dir, overrides, from_scratch=args.from_scratch)
        else:
            cfg = load_config(args.preset, args.config, overrides)
            if args.preset and cfg.device == "auto":  # as the notebooks: a GPU preset on a CPU would crawl
                require_gpu(args.preset, cli=True)
            if args.resume and (Path(cfg.run_dir) / "config.json").exists():
                say_resume(cfg.run_dir)
            trainer = trainer_class(cfg.task, cfg.algorithm)(cfg, resume=args.resume, from_scratch=args.from_scratch)
    except (ConfigError, TaskArgError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    except (FileExistsError, ValueError, DamagedCheckpoints, GPUNeeded) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        if not isinstance(err.__cause__, OSError):  # only a model or tokenizer that cannot be loaded is the user's
            raise
        print("error: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    summary = trainer.train()
    trainer.close()
    if trainer.mirror is not None:
        summary["backup"] = trainer.mirror.status()
    if trainer.dist.is_main:  # several processes (accelerate launch, torchrun): one summary
        print(format_summary(summary))
        print(json.dumps(summary))
    trainer.dist.barrier()  # every process ends the run before the group goes (a peer gone first can abort gloo)
    trainer.dist.close()
    return 0


def dry_run(args) -> int:
    """--dry-run: the arguments parsed (argparse did); for train also the config resolved as a run would resolve it
    (a run's own config.json for --resume/--from-scratch of an existing run, else the preset, the file and the
    overrides, validated) and its task built from task and task_args. No model, no run folder, no GPU check."""
    if args.command != "train":
        print(f"dry run: kit {args.command}: the arguments are valid; nothing was run")
        return 0
    from pathlib import Path

    from kit.run.config import ConfigError, load_config
    from kit.tasks import TaskArgError, task_for

    overrides = list(args.overrides) + ([f"run_dir={args.run_dir}"] if args.run_dir else [])
    saved = args.run_dir and not (args.preset or args.config) and (Path(args.run_dir) / "config.json").exists()
    try:
        cfg = load_config(None, Path(args.run_dir) / "config.json", overrides, saved=True) if saved else \
            load_config(args.preset, args.config, overrides)
        task_for(cfg)
    except (ConfigError, TaskArgError, ValueError, TypeError, OSError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    print(f"dry run: kit train: model {cfg.model_name}, task {cfg.task} {cfg.task_args or ''}, algorithm "
          f"{cfg.algorithm}, {cfg.num_steps} steps, run dir {cfg.run_dir}; nothing was trained")
    return 0


def _analyse(args) -> int:
    from pathlib import Path

    if args.command in ("report", "compare"):  # they read files only: no model, no eval/ folder of their own
        from kit.analysis.compare import compare_runs
        from kit.analysis.report import write_report

        path = write_report(args.run_dir, args.out) if args.command == "report" else \
            compare_runs(args.run_dirs, args.labels, args.out)
        if args.command == "compare":
            print(path.read_text())  # short: the table is the point
        return 0
    from kit.analysis import plots
    from kit.analysis.evaluate import format_table

    out = Path(args.run_dir) / "eval"
    if args.command == "eval":
        from kit.analysis.evaluate import evaluate_run

        rows = evaluate_run(args.run_dir, args.steps, n=args.n, num_items=args.items)
        print(format_table(rows))
        plots.eval_curves(rows, path=out / "eval_curves.png")
    elif args.command == "baselines":
        from kit.analysis.baselines import compare

        rows = compare(args.run_dir, args.methods, n=args.n, num_items=args.items, step=args.step)
        print(format_table(rows, first="method"))
        plots.baseline_bars(rows, path=out / "baselines.png")
    else:
        import json

        from kit.analysis.schemes import SCHEMES, scheme_shares

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
            f"  newest checkpoint: {s['checkpoint']}" + (f"\n  {s['backup']}" if s.get("backup") else ""))


if __name__ == "__main__":
    sys.exit(main())
