"""Several runs side by side: how ablations are read (shared vs separate adapters, one vs two turns, 4-bit vs bf16).

    python -m kit compare checkpoints/a_s0 checkpoints/a_s1 checkpoints/b_s0 --labels A A B --out comparison
    compare_runs([...], labels=[...], out_dir=...) -> Path          # COMPARE.md, the same from a notebook

Runs whose configs are equal except for the seed (and the fields that do not change training: run_dir, logging,
evaluation cadence) are one group: their curves are drawn as the mean over seeds with a band from the lowest to
the highest seed, and the table adds a row with the mean over seeds and that range, named by the runs' shared label
(or, without one, by their config: the nearest preset and what differs from it). Every run's final held-out
numbers come from its newest eval/step_*.json with a bootstrap interval over items (kit/analysis/stats.py); a run
evaluated on the same items as the first run also gets a paired bootstrap of the difference. Like the report, it
only reads files: it runs no model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kit.analysis import stats
from kit.analysis.runinfo import (figure, final_train_reward, headline, nearest_preset, normalized, read_run, smooth,
                          step_axes, window_for)

SAME_RUN_FIELDS = {"seed", "run_dir", "mirror_dir", "eval_every", "save_every", "keep_last", "keep_history",
                   "log_rollouts", "use_wandb", "wandb_project", "progress", "reward_workers", "reward_pool",
                   "device", "agent_devices", "judge_budget_usd"}


def group_key(config: dict) -> str:
    """What makes two runs the same experiment: every field but the seed and the bookkeeping ones. The config is
    read through kit.run.config first, so a run saved by an older kit (an old spelling of a value) still matches."""
    import json

    config = normalized(config)
    return json.dumps({k: v for k, v in sorted(config.items()) if k not in SAME_RUN_FIELDS}, sort_keys=True,
                      default=str)


def groups_of(runs: list[dict], labels: list[str]) -> list[dict]:
    """Runs grouped by config (seeds of one experiment together), in the order first seen."""
    groups: dict[str, dict] = {}
    for run, label in zip(runs, labels):
        key = group_key(run["config"])
        if key not in groups:
            groups[key] = {"labels": [], "runs": []}
        groups[key]["labels"].append(label)
        groups[key]["runs"].append(run)
    for group in groups.values():
        group["label"] = group_name(group["labels"], group["runs"][0]["config"])
    return list(groups.values())


def group_name(labels: list[str], config: dict) -> str:
    """A group's name: its runs' shared label; when their labels differ (folder names such as seed0, seed1), the
    config they share: the nearest preset and the training fields that differ from it (never the first run's
    name, which would pass one seed off as the group)."""
    if len(set(labels)) == 1:
        return labels[0]
    preset, diff = nearest_preset(config)
    diff = [d for d in diff if not d.startswith("seed=")]
    return preset + (f" with {', '.join(diff[:3])}" + (", ..." if len(diff) > 3 else "") if diff else "")


def train_reward_cell(run: dict) -> str:
    final = final_train_reward(run["train"])
    return "n/a" if final is None else f"{stats.fmt(final[0])} (last {final[1]})"


def curve_by_step(rows: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: float(r[key]) for r in rows if key in r}


def draw_group(ax, group: dict, rows_of, key: str, smoothed: bool):
    """One line per group: a single run as is (raw points faint when smoothed); several seeds as the mean over
    the steps they all have, with a band from the lowest to the highest seed."""
    curves = [curve_by_step(rows_of(run), key) for run in group["runs"]]
    curves = [c for c in curves if c]
    if not curves:
        return
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    if not steps:
        return
    values = np.array([[c[s] for s in steps] for c in curves])  # (seeds, steps)
    window = window_for(len(steps)) if smoothed else 1
    each = np.array([smooth(v, window) for v in values])
    label = group["label"] + (f" ({len(curves)} seeds)" if len(curves) > 1 else "")
    marker = "-" if smoothed else "o-"
    line, = ax.plot(steps, each.mean(axis=0), marker, label=label)
    if len(curves) > 1:
        ax.fill_between(steps, each.min(axis=0), each.max(axis=0), color=line.get_color(), alpha=0.2, linewidth=0)
    elif smoothed:
        ax.plot(steps, values[0], ".", color=line.get_color(), alpha=0.25, markersize=3)


def compare_runs(run_dirs: list[str | Path], labels: list[str] | None = None, out_dir: str | Path | None = None,
                 log=print) -> Path:
    """Write COMPARE.md and compare_curves.png under `out_dir` (default: ./comparison); returns the Markdown path."""
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs: give one label per run (runs that share "
                         "a config and differ in seed are grouped whatever their labels)")
    runs = [read_run(located(d)) for d in run_dirs]
    labels = list(labels) if labels else [r["path"].name for r in runs]
    out = Path(out_dir or "comparison")
    out.mkdir(parents=True, exist_ok=True)
    groups = groups_of(runs, labels)
    tasks = {run["config"].get("task") for run in runs}
    held_key = headline([r for run in runs for r in run["evals"]], tasks.pop() if len(tasks) == 1 else None)
    fig, (ax_train, ax_held) = figure(2)
    for group in groups:
        draw_group(ax_train, group, lambda run: run["train"], "reward/mean", smoothed=True)
        draw_group(ax_held, group, lambda run: run["evals"], held_key, smoothed=False)
    band = "; band: range over seeds" if any(len(g["runs"]) > 1 for g in groups) else ""  # one run a group: none
    ax_train.set_title(f"training reward (sampled{band})", fontsize="medium")
    ax_train.set_ylabel("training reward (mean per joint action)")
    ax_held.set_title(f"held-out {held_key} by checkpoint" + (f" ({band[2:]})" if band else ""), fontsize="medium")
    ax_held.set_ylabel(f"held-out {held_key}")
    step_axes(ax_train, ax_held)
    fig.savefig(out / "compare_curves.png", dpi=110)
    runs_word = "run" if len(runs) == 1 else "runs"
    text = [f"# Comparison of {len(runs)} {runs_word}\n\nMade by `python -m kit compare` from: " +
            ", ".join(f"`{r['path']}` ({lab})" for r, lab in zip(runs, labels)) + ".",
            "![training and held-out curves](compare_curves.png)", final_table(runs, labels, groups, held_key)]
    path = out / "COMPARE.md"
    path.write_text("\n\n".join(text) + "\n")
    log(f"[kit] comparison written: {path}")
    return path


def located(run_dir: str | Path) -> Path:
    """A run folder; a relative one that is not under the working folder is looked for where the notebooks keep
    runs (`checkpoints/seed1` after a kernel restart that left the working folder at /content)."""
    from kit.run.rundir import runs_root

    path = Path(run_dir)
    if path.exists() or path.is_absolute():
        return path
    there = runs_root().parent / path
    return there if there.exists() else path


def final_table(runs: list[dict], labels: list[str], groups: list[dict], key: str) -> str:
    reward = "reward/mean"
    head = ["run", "seed", "steps", "final train reward", f"held-out {key}"] + \
        ([f"held-out {reward}"] if key != reward else []) + [f"Δ {key} vs {labels[0]}"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    first = runs[0]["evals"][-1] if runs[0]["evals"] else None
    for run, label in zip(runs, labels):
        last = run["evals"][-1] if run["evals"] else None
        row = [label, str(run["config"].get("seed")), str(run["train"][-1]["step"]) if run["train"] else "0",
               train_reward_cell(run), held(last, key)]
        if key != reward:
            row.append(held(last, reward))
        row.append("–" if run is runs[0] else paired(last, first, key) if same_items(run, runs[0]) else
                   "n/a (different items)")
        lines.append("| " + " | ".join(row) + " |")
    for group in groups:
        if len(group["runs"]) < 2:
            continue
        def finals(k):
            return [r["evals"][-1][k] for r in group["runs"] if r["evals"] and k in r["evals"][-1]]

        trains = [t[0] for t in (final_train_reward(r["train"]) for r in group["runs"]) if t is not None]
        row = [f"**{group['label']} ({len(group['runs'])} seeds): mean**", "all", "", seeds_cell(trains),
               seeds_cell(finals(key))] + ([seeds_cell(finals(reward))] if key != reward else []) + [""]
        lines.append("| " + " | ".join(row) + " |")
    note = ("Per run: the newest held-out evaluation (eval/step_*.json). " + stats.method_line() +
            " Δ: paired bootstrap of the per-item difference with the first run, shown only when both were "
            "evaluated on the same items. Seed rows: the mean over seeds and, in brackets, the lowest and highest "
            "seed (a range, not a confidence interval: a few seeds cannot give one), for the training reward and each "
            "held-out column. Final train reward: the mean over a run's last k logged steps, k a tenth of its steps "
            "(1 to 25): the smoothed curve's last point, the number the run's report gives too.")
    return "\n".join(lines) + "\n\n" + note


def held(row: dict | None, key: str) -> str:
    if row is None:
        return "not evaluated"
    if key not in row:
        return "–"
    ci = stats.interval(row, key)
    return stats.fmt(*ci) if ci else stats.fmt(row[key]) + " (no per-item data)"


def same_items(run: dict, other: dict) -> bool:
    """Whether two runs' evaluations scored the same held-out items: the same task, task arguments and count."""
    a, b = run["config"], other["config"]
    rows_a, rows_b = run["evals"], other["evals"]
    return bool(rows_a and rows_b) and all(a.get(k) == b.get(k) for k in ("task", "task_args")) and \
        rows_a[-1].get("num_items") == rows_b[-1].get("num_items") and rows_a[-1].get("split") == rows_b[-1].get("split")


def paired(row: dict | None, first: dict | None, key: str) -> str:
    if row is None or first is None:
        return "n/a"
    a, b = stats.per_item(row, key), stats.per_item(first, key)
    if not a or not b or len(a) != len(b):
        return "n/a (no per-item data)"
    return stats.fmt(*stats.paired_bootstrap(a, b))


def seeds_cell(values: list[float]) -> str:
    if not values:
        return "n/a"
    return stats.fmt(float(np.mean(values)), min(values), max(values))
