"""The code table at 0.5B (issue 78): the MAGRPO team against the single model trained with the same reward, steps
and samples, and the untrained baselines, on every held-out problem, with intervals over problems and seeds.

    python bench/code_table.py run mbpp team --seeds 31 32 33      # MAGRPO, then its rows (below)
    python bench/code_table.py run mbpp single --seeds 31 32 33    # algorithm=centralized, then its rows
    python bench/code_table.py eval mbpp team --seeds 31 --methods sequential discussion   # more rows later
    python bench/code_table.py table                               # bench/results/code_table.md

A row of the table is a method sampled n=4 times on every held-out problem of the dataset (MBPP: 32, coop: 32 of 47 in
the preset), per seed. Two training runs per seed make the rows:

    team    the preset (coder_mbpp / coder_code: two agents, G=4, one problem a step) trained with MAGRPO for its
            30 steps; its rows: `naive` (the untrained team, the base with fresh adapters), `sequential`,
            `discussion` (kit/analysis/baselines.py), and `magrpo` (the trained team, its newest checkpoint)
    single  the preset's `_single` twin (coder_mbpp_single, coder_code_single: `algorithm=centralized`,
            kit/engine/centralized.py): ONE adapter writes aux and the entry point in one completion from the task's
            single prompt, scored by the same joint reward, with the same G, steps, problems and learning rate, and
            twice the preset's max_new_tokens (the team's two completions' budget together); its rows: `naive` =
            the untrained single model at that budget, `magrpo` = the trained single model

Each run lives in checkpoints/code_table/<dataset>_<row>_s<seed> (git-ignored) and resumes from its newest checkpoint
if stopped; its rows are merged one method at a time into eval/table.json, so a row already sampled is never lost or
sampled again (`--again` does). `archive` keeps config, metrics and rows in bench/results/runs/table_<run> (committed),
and `table` pools those with the runs here.

The table: per row pass@1, pass@4, the mean reward, how often main calls aux (by the AST, on every sample:
details["main_calls_aux"]), how often the cooperation reward was paid, and the primary schemes of the passing
programs (kit/analysis/schemes.py). Each mean's 95% interval resamples seeds and problems together
(kit.analysis.stats.seeds_items_bootstrap); the differences MAGRPO minus the trained single model and MAGRPO minus
the untrained team are paired: per seed and problem, the difference of the two rows of that seed on that problem.
The cost columns: minutes per training step (perf/step_s) and the seed's wall time, with the precision the run used.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = ROOT / "checkpoints" / "code_table"
KEPT = ROOT / "bench" / "results" / "runs"  # archived as table_<run>: config, metrics, eval/table.json
OUT = ROOT / "bench" / "results" / "code_table.md"
PRESETS = {"mbpp": "coder_mbpp", "coop": "coder_code"}  # the team's; the single model's: <preset>_single
ROWS = {"team": ("magrpo", "naive", "sequential", "discussion"), "single": ("magrpo", "naive")}  # sampled in this order
# the table's rows, in order: (label, run row, method)
TABLE = [("untrained single model", "single", "naive"), ("trained single model (centralized)", "single", "magrpo"),
         ("untrained team", "team", "naive"), ("sequential (untrained)", "team", "sequential"),
         ("discussion (untrained)", "team", "discussion"), ("MAGRPO team", "team", "magrpo")]
# the differences, each paired by seed and problem: (label, (run row, method) minus (run row, method))
DIFFERENCES = [("MAGRPO team minus the trained single model", ("team", "magrpo"), ("single", "magrpo")),
               ("MAGRPO team minus the untrained team", ("team", "magrpo"), ("team", "naive")),
               ("trained single model minus the untrained one", ("single", "magrpo"), ("single", "naive"))]


def run_dir(dataset: str, row: str, seed: int, tag: str = "") -> Path:
    """checkpoints/code_table/<dataset>_<row>_s<seed>; a tuning run's `tag` makes <row>-<tag>, which no table row
    reads."""
    return RUNS / f"{dataset}_{row}{'-' + tag if tag else ''}_s{seed}"


def config(dataset: str, row: str, seed: int, steps: int | None, extra: list[str], tag: str = ""):
    """The preset as it is (its 30 steps: the table's settings live in the presets), with this run's seed and
    folder; no evaluation between steps (the rows below are the evaluation)."""
    from kit.run.config import load_config

    preset = PRESETS[dataset] + ("_single" if row == "single" else "")  # coder_mbpp_single: centralized, 320 tokens
    overrides = [f"seed={seed}", f"run_dir={run_dir(dataset, row, seed, tag)}", "eval_every=0", "save_every=5",
                 "progress=false", *([f"num_steps={steps}"] if steps is not None else [])]
    return load_config(preset, overrides=overrides + extra)


def train(dataset: str, row: str, seed: int, steps: int | None, extra: list[str], tag: str = "") -> Path:
    from kit.trainers.game_trainer import trainer_class

    cfg = config(dataset, row, seed, steps, extra, tag)
    path = run_dir(dataset, row, seed, tag)
    trainer = trainer_class(cfg.task, cfg.algorithm)(cfg, resume=(path / "config.json").exists())
    try:
        trainer.train()
    finally:
        trainer.close()
    return path


def evaluate(path: Path, methods: list[str], n: int, again: bool = False) -> list[dict]:
    """Each method's row on every held-out problem, merged into eval/table.json after each (the slow part)."""
    import contextlib

    from kit.analysis.baselines import run_method
    from kit.analysis.evaluate import RunContext

    out = path / "eval" / "table.json"
    rows = json.loads(out.read_text()) if out.exists() else {}
    todo = [m for m in methods if again or m not in rows]
    if not todo:
        return list(rows.values())
    with contextlib.closing(RunContext(path, "eval", num_items=10**6, log=print)) as ctx:  # every held-out problem
        for method in todo:
            if method == "magrpo":
                step = ctx.use_team_step("newest", print)
                if step is None:
                    continue
                row = run_method("naive", ctx.sampler, ctx.task, ctx.cfg, ctx.items, n, ctx.scorer)
                row.update(method="magrpo", step=step)
            else:
                ctx.use_step(0)
                row = run_method(method, ctx.sampler, ctx.task, ctx.cfg, ctx.items, n, ctx.scorer)
            rows[method] = row
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(rows, indent=1))
            print(f"[table] {path.name} {method}: pass@1 {row.get('pass@1', float('nan')):.3f}, "
                  f"aux calls {row.get('aux_call_rate', float('nan')):.3f}, {row['wall_s']:.0f} s", flush=True)
    return list(rows.values())


def archive(path: Path) -> Path:
    into = KEPT / f"table_{path.name}"
    (into / "eval").mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "metrics.jsonl", "eval/table.json", "environment.json"):
        if (path / name).exists():
            shutil.copyfile(path / name, into / name)
    return into


def load() -> dict[tuple[str, str], dict[int, dict]]:
    """(dataset, row) -> seed -> {config, metrics, rows}: the runs here, else their archived copies."""
    found: dict[tuple[str, str], dict[int, dict]] = {}
    here = {p.name for p in RUNS.glob("*_s*") if (p / "eval" / "table.json").exists()}  # a run here without rows
    # yet (training again) does not hide its archived rows
    dirs = [*RUNS.glob("*_s*"), *(p for p in KEPT.glob("table_*_s*") if p.name[len("table_"):] not in here)]
    for p in sorted(dirs):
        name = p.name[len("table_"):] if p.name.startswith("table_") else p.name
        if not re.fullmatch(r"[a-z]+_[a-z]+(-[\w.-]+)?_s\d+", name):  # not a run of this script (mbpp_team_s41_old)
            continue
        dataset, row, seed = name.rsplit("_", 2)
        table = p / "eval" / "table.json"
        if not table.exists():
            continue
        metrics = [json.loads(line) for line in open(p / "metrics.jsonl")] if (p / "metrics.jsonl").exists() else []
        env = json.loads((p / "environment.json").read_text()) if (p / "environment.json").exists() else {}
        found.setdefault((dataset, row), {})[int(seed[1:])] = {
            "config": json.loads((p / "config.json").read_text()), "metrics": metrics,
            "rows": json.loads(table.read_text()), "precision": env.get("precision") or []}
    return found


def per_seed_items(runs: dict[int, dict], method: str, metric: str) -> tuple[list[int], np.ndarray] | None:
    """(seeds, (seeds, items) values) of one method's metric: pass@1, pass@4, reward, aux_call."""
    from kit.analysis.evaluate import pass_at_k

    seeds, table = [], []
    for seed, run in sorted(runs.items()):
        row = run["rows"].get(method)
        if row is None:
            continue
        items = row["per_item"]
        if metric.startswith("pass@"):
            k, n = int(metric[5:]), row["num_samples"]
            if k > n:
                return None
            values = [pass_at_k(n, c, k) for c in items["correct"]]
        elif metric == "aux_call":
            values = items.get("aux_call")
            if values is None:
                return None
        else:
            values = items["reward"]
        if table and len(values) != len(table[0]):
            raise ValueError(f"{method} {metric}: seed {seed} has {len(values)} problems, seed {seeds[0]} "
                             f"{len(table[0])}; every seed's row must cover the same held-out problems")
        seeds.append(seed)
        table.append(values)
    return (seeds, np.array(table, dtype=float)) if table else None


def cell(values: np.ndarray | None, signed: bool = False) -> str:
    from kit.analysis.stats import seeds_items_bootstrap

    if values is None:
        return "-"
    mean, low, high = seeds_items_bootstrap(values)
    f = "{:+.3f}" if signed else "{:.3f}"
    return f"{f.format(mean)} [{f.format(low)}, {f.format(high)}]"


def paired_difference(a, b, what: str) -> tuple[list[int], np.ndarray | None]:
    """(seeds, (seeds, items) differences) of two per_seed_items results over the seeds both have; ([], None)
    where either is missing or they share no seed."""
    if a is None or b is None:
        return [], None
    common = sorted(set(a[0]) & set(b[0]))
    if not common:
        return [], None
    if a[1].shape[1] != b[1].shape[1]:
        raise ValueError(f"{what}: {a[1].shape[1]} problems against {b[1].shape[1]}; both rows must cover the same "
                         "held-out problems")
    return common, a[1][[a[0].index(s) for s in common]] - b[1][[b[0].index(s) for s in common]]


def per_seed(values: np.ndarray, signed: bool = False) -> str:
    """Each seed's mean over the problems, in the seeds' order."""
    return ", ".join(("{:+.2f}" if signed else "{:.2f}").format(v) for v in values.mean(axis=1))


def schemes_cell(runs: dict[int, dict], method: str) -> str:
    counts: dict[str, float] = {}
    total = 0
    for run in runs.values():
        row = run["rows"].get(method) or {}
        k = row.get("num_passing", 0)
        for scheme, share in (row.get("schemes/passing") or {}).items():
            counts[scheme] = counts.get(scheme, 0.0) + share * k
        total += k
    if not total:
        return "no passing program"
    top = sorted(((v / total, s) for s, v in counts.items() if v), reverse=True)
    return f"{total} passing: " + ", ".join(f"{s} {v:.0%}" for v, s in top)


def cost(runs: dict[int, dict]) -> str:
    """Minutes a training step and a seed, with the precision the runs used. A step over 4x its run's median was
    paused (kill -STOP while the test suite had the cores, bench/README.md): left out, and a seed's minutes are then
    its other steps' mean times its steps."""
    kept, paused, seed_minutes = [], 0, []
    for run in runs.values():
        steps = np.array([m["perf/step_s"] for m in run["metrics"] if "perf/step_s" in m])
        if not len(steps):
            continue
        ok = steps <= 4 * np.median(steps)
        kept += list(steps[ok])
        paused += int((~ok).sum())
        seed_minutes.append(steps[ok].mean() * len(steps) / 60)
    if not kept:
        return "-"
    used = sorted({f"{p.get('dtype')} on {p.get('device')}" for run in runs.values() for p in run["precision"]})
    note = f", {paused} paused left out" if paused else ""
    return (f"{np.mean(kept) / 60:.1f} min/step, {np.mean(seed_minutes):.0f} min/seed ({len(kept)} steps{note}; "
            f"{', '.join(used) or 'precision not recorded'}, HF generate)")


def table() -> str:
    from kit.analysis.stats import CONFIDENCE, NUM_RESAMPLES, SEED

    found = load()
    lines = ["# The code table at 0.5B (made by `python bench/code_table.py table`)", "",
             "Qwen2.5-Coder-0.5B-Instruct, every held-out problem, n samples a problem per seed; intervals: "
             f"{CONFIDENCE:.0%} percentile bootstrap over seeds and problems together ({NUM_RESAMPLES} resamples, "
             f"seed {SEED}); differences paired by seed and problem. With three seeds a resample of seeds has only 10 "
             "distinct draws, so the seed part of an interval is about the range of the seed means: read it beside "
             "the per-seed means.", ""]
    for dataset in PRESETS:
        if not any(d == dataset for d, _ in found):
            continue
        lines += [f"## {dataset}", "", "| row | seeds | pass@1 | pass@1 per seed | pass@4 | reward | main calls aux | "
                  "cooperation paid | schemes of the passing programs | sampling, s a seed | training cost |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for label, row, method in TABLE:
            runs = found.get((dataset, row), {})
            got = per_seed_items(runs, method, "pass@1")
            if got is None:
                lines.append(f"| {label} | - | not run | | | | | | | | |")
                continue
            seeds = got[0]
            coop = [run["rows"][method].get("cooperation_rate", 0.0) for run in runs.values() if method in run["rows"]]
            pass4 = per_seed_items(runs, method, "pass@4")
            aux = per_seed_items(runs, method, "aux_call")
            train_cost = cost(runs) if method == "magrpo" else ""
            wall = np.mean([run["rows"][method]["wall_s"] for run in runs.values() if method in run["rows"]])
            lines.append(f"| {label} | {', '.join(map(str, seeds))} | {cell(got[1])} | {per_seed(got[1])} | "
                         f"{cell(pass4[1] if pass4 else None)} | {cell(per_seed_items(runs, method, 'reward')[1])} | "
                         f"{cell(aux[1] if aux else None)} | {np.mean(coop):.3f} | {schemes_cell(runs, method)} | "
                         f"{wall:.0f} | {train_cost} |")
        lines += ["", "| difference | seeds paired | pass@1 | pass@1 per seed | pass@4 | reward | main calls aux |",
                  "|---|---|---|---|---|---|---|"]
        for label, (row_a, method_a), (row_b, method_b) in DIFFERENCES:
            this, other = found.get((dataset, row_a), {}), found.get((dataset, row_b), {})
            cells, paired = [], []
            for metric in ("pass@1", "pass@4", "reward", "aux_call"):
                common, diff = paired_difference(per_seed_items(this, method_a, metric),
                                                 per_seed_items(other, method_b, metric), f"{label}, {metric}")
                paired = common or paired
                cells.append(cell(diff, signed=True))
                if metric == "pass@1":
                    cells.append("-" if diff is None else per_seed(diff, signed=True))
            lines.append(f"| {label} | {', '.join(map(str, paired)) or '-'} | " + " | ".join(cells) + " |")
        lines.append("")
    text = "\n".join(lines)
    OUT.write_text(text)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "eval"):
        p = sub.add_parser(name)
        p.add_argument("dataset", choices=sorted(PRESETS))
        p.add_argument("row", choices=sorted(ROWS))
        p.add_argument("--seeds", type=int, nargs="+", required=True)
        p.add_argument("--steps", type=int, default=None, help="default: the preset's (30)")
        p.add_argument("--n", type=int, default=4, help="samples per held-out problem")
        p.add_argument("--methods", nargs="*", default=None, help="default: every row of this run (ROWS); none: "
                       "train only")
        p.add_argument("--tag", default="", help="a tuning run: <row>-<tag>, kept apart from the table's rows")
        p.add_argument("--again", action="store_true", help="sample rows already in eval/table.json again")
        p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    ar = sub.add_parser("archive")
    ar.add_argument("runs", nargs="+", type=Path)
    sub.add_parser("table")
    args = ap.parse_args()
    if args.cmd in ("run", "eval"):
        for seed in args.seeds:
            path = train(args.dataset, args.row, seed, args.steps, args.extra, args.tag) if args.cmd == "run" else \
                run_dir(args.dataset, args.row, seed, args.tag)
            evaluate(path, list(ROWS[args.row]) if args.methods is None else args.methods, args.n, args.again)
            print(archive(path))
    elif args.cmd == "archive":
        for path in args.runs:
            print(archive(path))
    else:
        print(table())


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
