"""A results report from a run directory: RESULTS.md with its figures beside it.

    python -m kit report --run-dir checkpoints/colab_a100      # -> checkpoints/colab_a100/report/RESULTS.md
    write_report(run_dir) -> Path                               # the same from Python (07_report)

The report only reads what the run directory holds (config.json, metrics.jsonl, rollouts.jsonl, budget.json,
environment.json, eval/): it runs no model. Each section appears when the run has its data, and otherwise says in
one line what is missing and which command makes it (`python -m kit eval` for the held-out curves, `kit baselines`
for Table 1 or the game table). A run directory written by an older kit still reports; what it lacks (per-item
results, so no intervals; the environment record) is named where it would have been.

Sections: the run (task, model, the nearest preset and the fields that differ from it, seed, versions, GPU, steps,
time, tokens, memory, judge spend); learning (training reward and each part, smoothed, the raw points faint; the
greedy held-out check over steps); held-out evaluation over checkpoints; Table 1 (baselines vs the trained team)
or, for a game, the game baselines; cooperation schemes; the three best and three worst joint actions of the
newest logged step. Every compared number carries a bootstrap interval over items (kit/analysis/stats.py), and a line
under each table says how it was made.

The paper's Table 1 numbers (arXiv 2508.04652) are not bundled: the kit has no verified copy of them, and a
number typed from memory is worse than none. When the run's setting matches the paper's (HumanEval or
CoopHumanEval with a 3B coder), the report says so and points to the paper's table instead of inventing a row.

Past 400 lines on purpose: one report, one section per function in the order RESULTS.md prints them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from kit.analysis import stats
from kit.analysis.runinfo import (ENVIRONMENT, figure, final_train_reward, headline, is_game_config, json_or_none,
                                  nearest_preset, raw_and_smoothed, read_run, step_axes, window_for)

REPORT_DIR = "report"
PAPER = "arXiv 2508.04652 (Liu et al., LLM Collaboration with Multi-Agent Reinforcement Learning)"
PAPER_SETTINGS = {"humaneval": "HumanEval", "coop": "CoopHumanEval", "hub:OpenMLRL/CoopHumanEval": "CoopHumanEval",
                  "hub:openai/openai_humaneval": "HumanEval"}
PAPER_MODEL_SIZE = "3B"
# Rows of the paper's Table 1, keyed by (dataset, model size). Empty on purpose: see the module docstring.
PAPER_TABLE1: dict[tuple[str, str], list[dict]] = {}


# --- the report

def write_report(run_dir: str | Path, out_dir: str | Path | None = None, log=print) -> Path:
    """Write <run_dir>/report/RESULTS.md and its figures; returns the Markdown file's path."""
    run = read_run(run_dir)
    out = Path(out_dir) if out_dir else run["path"] / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):  # figures of a section that no longer has data must not linger
        old.unlink()
    cfg = run["config"]
    parts = [f"# Results: {run['path'].name}\n\n{cfg.get('task')} task, {cfg.get('num_agents')} agents trained with "
             f"{cfg.get('algorithm', 'magrpo')} on "
             f"`{cfg.get('model_name')}`. Made by `python -m kit report` from the files of `{run['path']}`; every "
             "interval is reproducible (fixed bootstrap seed)."]
    parts += [run_section(run), learning_section(run, out), eval_section(run, out)]
    if is_game_config(cfg):
        parts.append(game_section(run))
    else:
        parts.append(table1_section(run))
        if cfg.get("task") == "code":
            parts.append(schemes_section(run, out))
    parts.append(joint_actions_section(run))
    path = out / "RESULTS.md"
    path.write_text("\n\n".join(p.strip() for p in parts if p) + "\n")
    log(f"[kit] report written: {path}")
    return path


def missing(title: str, why: str) -> str:
    return f"## {title}\n\n_Not available: {why}_"


def run_section(run: dict) -> str:
    cfg, train, env = run["config"], run["train"], run["environment"] or {}
    preset, diff = nearest_preset(cfg)
    task = cfg.get("task", "?") + (f" {json.dumps(cfg['task_args'])}" if cfg.get("task_args") else "")
    step_s = [r["perf/step_s"] for r in train if "perf/step_s" in r]
    tokens = sum(r.get("completion/tokens", 0) for r in train)
    facts = [("task", task), ("model", f"`{cfg.get('model_name')}`"),
             ("nearest preset", f"{preset}; differs in: {', '.join(diff) or 'nothing'}"),
             ("seed", cfg.get("seed")),
             ("steps", f"{train[-1]['step']} of {cfg.get('num_steps')}" if train else "none logged yet"),
             ("training time", f"{sum(step_s) / 60:.1f} min, {np.median(step_s):.2f} s/step (median)"
              if step_s else "not logged"),
             ("completion tokens", f"{tokens:,}" if train else "not logged")]
    if env:
        facts += [("kit", f"{env.get('kit_version')} (commit {env.get('kit_commit') or 'unknown'})"),
                  ("packages", ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())),
                  ("GPU", env.get("gpu") or "none (CPU)"),
                  ("peak GPU memory", f"{env['peak_memory_gib']:.1f} GiB" if env.get("peak_memory_gib") else
                   "n/a (CPU)"),
                  ("peak resident memory", f"{env['peak_host_memory_gib']:.1f} GiB (the training process since it "
                   "started)" if env.get("peak_host_memory_gib") else "not recorded"),
                  ("precision", "; ".join(f"{p['dtype']} ({p['why']})" for p in env["precision"])
                   if env.get("precision") else "not recorded")]
    else:
        facts.append(("kit, packages, GPU, memory", f"not recorded yet: {ENVIRONMENT} is written when training "
                      "returns (a run still training, or stopped, has none yet; so has a run of a kit older than that "
                      "record)" if train else f"not recorded: this run has no {ENVIRONMENT} (not trained yet)"))
    budget = run["budget"]
    if budget:
        cap = f" of a ${budget['cap_usd']:.2f} cap" if "cap_usd" in budget else ""
        facts.append(("judge", f"{budget.get('calls', 0)} calls, ${budget.get('spent_usd', 0.0):.2f} spent{cap}"))
    elif cfg.get("judge_model"):
        facts.append(("judge", "configured, but no budget.json: no calls were made"))
    rows = "\n".join(f"| {k} | {v} |" for k, v in facts)
    return f"## The run\n\n| | |\n|---|---|\n{rows}"


def learning_section(run: dict, out: Path) -> str:
    train = run["train"]
    if not train:
        return missing("Learning", "metrics.jsonl has no training steps yet")
    steps = [r["step"] for r in train]
    window = window_for(len(train))
    game = is_game_config(run["config"])
    skip = {"reward/mean", "reward/std"}
    parts = ["score/mean"] if game else sorted(
        {k for r in train for k in r if k.startswith("reward/") and k not in skip and not k.startswith("reward/turn_")})
    fig, (ax_total, ax_parts) = figure(2)
    raw_and_smoothed(ax_total, steps, [r["reward/mean"] for r in train], "train (sampled)", window)
    held = [r for r in run["metrics"] if "eval/reward_mean" in r]
    if held:
        ax_total.plot([r["step"] for r in held], [r["eval/reward_mean"] for r in held], "o--", color="black",
                      label="held-out (greedy)")
    for key in parts:
        raw_and_smoothed(ax_parts, steps, [r.get(key, np.nan) for r in train], key.split("/")[0]
                         if game else key.removeprefix("reward/"), window)
    if game:  # a rate in [0, 1] beside a score: its own axis
        twin = ax_parts.twinx()
        raw_and_smoothed(twin, steps, [r.get("illegal/rate", np.nan) for r in train], "illegal-move rate", window,
                         color="tab:red")
        twin.set_ylim(0, 1)
        twin.set_ylabel("illegal-move rate", color="tab:red")
    ax_total.set_title(f"reward (line: mean of the last {window} steps; dots: each step)")
    ax_total.set_ylabel("reward (mean per joint action)")
    ax_parts.set_title("game score and illegal-move rate" if game else "reward parts")
    ax_parts.set_ylabel("game score" if game else "reward part (mean per joint action)")
    step_axes(ax_total)
    step_axes(ax_parts, right=1.18 if game else 1.02)  # past the twin's ticks and label
    fig.savefig(out / "learning.png", dpi=110)
    last, k = final_train_reward(train)
    first = np.mean([r["reward/mean"] for r in train[:k]])
    text = (f"## Learning\n\n![training reward and its parts](learning.png)\n\nTraining reward (sampled): "
            f"{first:.3f} over the first {k} step(s), {last:.3f} over the last {k} (the final train reward, as "
            "`kit compare` gives it: the smoothed curve's last point).")
    if held:
        text += (f" Held-out greedy reward ({len(held)} checks from metrics.jsonl): {held[0]['eval/reward_mean']:.3f} "
                 f"at step {held[0]['step']}, {held[-1]['eval/reward_mean']:.3f} at step {held[-1]['step']}.")
    return text


def metric_keys(rows: list[dict]) -> list[str]:
    """The compared metrics of evaluation rows: pass@1 and the largest pass@k, or the game score; the reward."""
    ks = sorted({int(k[5:]) for r in rows for k in r if k.startswith("pass@")})
    keys = [f"pass@{k}" for k in ks[:1] + (ks[-1:] if len(ks) > 1 else [])]
    if any("score/mean" in r for r in rows):
        keys.append("score/mean")
    return keys + ["reward/mean"]


def cell(row: dict, key: str) -> str:
    if key not in row:
        return "–"
    ci = stats.interval(row, key)
    return stats.fmt(*ci) if ci else stats.fmt(row[key])


def has_items(rows: list[dict]) -> bool:
    return all(r.get("per_item") for r in rows)


def intervals_note(rows: list[dict], paired: bool = False, unit: str = "held-out items") -> str:
    with_items = [r for r in rows if r.get("per_item")]
    if not with_items:
        return ("No intervals: these results have no per-item data (written by an older kit); run the command "
                "again to get them.")
    line = stats.method_line(with_items[0].get("num_items"), paired, unit)
    if len(with_items) < len(rows):
        line += " Rows without an interval were saved by an older kit (no per-item data)."
    return line


def eval_section(run: dict, out: Path) -> str:
    rows = run["evals"]
    if not rows:
        return missing("Held-out evaluation over checkpoints", "no eval/step_*.json; run `python -m kit eval "
                       f"--run-dir {run['path']}`")
    keys = metric_keys(rows)
    fig, axes = figure(len(keys), width=4.2)
    steps = [r["step"] for r in rows]
    for ax, key in zip(axes, keys):
        cis = [stats.interval(r, key) if key in r else None for r in rows]
        y = np.array([r.get(key, np.nan) for r in rows], dtype=float)
        low = np.array([y[i] - c[1] if c else 0.0 for i, c in enumerate(cis)])
        high = np.array([c[2] - y[i] if c else 0.0 for i, c in enumerate(cis)])
        ax.errorbar(steps, y, yerr=[low, high], fmt="o-", capsize=3)
        ax.set_title(f"{key} (bars: 95% bootstrap over items)" if has_items(rows) else key, fontsize="medium")
        ax.set_xlabel("checkpoint step (0: base)")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    fig.savefig(out / "eval.png", dpi=110)
    table = ["| step | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    table += [f"| {r['step']} | " + " | ".join(cell(r, k) for k in keys) + " |" for r in rows]
    text = ("## Held-out evaluation over checkpoints\n\n![held-out metrics by checkpoint](eval.png)\n\n"
            + "\n".join(table) + f"\n\n{rows[-1].get('num_samples')} samples per item. " + intervals_note(rows))
    first, last = rows[0], rows[-1]
    key = headline(rows, run["config"].get("task"))
    a, b = stats.per_item(last, key), stats.per_item(first, key)
    if len(rows) > 1 and a and b and len(a) == len(b):
        d = stats.paired_bootstrap(a, b)
        text += (f"\n\nStep {last['step']} vs step {first['step']} on {key}: Δ = {stats.fmt(*d)} (paired bootstrap "
                 "over the same items).")
    return text


def table1_section(run: dict) -> str:
    rows = run["baselines"]
    title = "Table 1: baselines vs the trained team"
    paper = paper_note(run["config"])
    if not rows:
        return missing(title, f"no eval/baselines.json; run `python -m kit baselines --run-dir {run['path']}`") + \
            (f"\n\n{paper}" if paper else "")
    keys, key = metric_keys(rows), headline(rows, run["config"].get("task"))
    team = next((r for r in rows if r["method"] == "magrpo"), None)
    head = ["method"] + keys + ([f"Δ {key} (magrpo − method)"] if team else [])
    table = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for r in rows:
        name = f"magrpo (step {r.get('step')})" if r is team else r["method"]
        line = [name] + [cell(r, k) for k in keys]
        if team:
            line.append("–" if r is team else diff_cell(team, r, key))
        table.append("| " + " | ".join(line) + " |")
    text = (f"## {title}\n\nThe same held-out items, sampling and scoring for every method; the baselines run on "
            "the untrained base model.\n\n" + "\n".join(table) + f"\n\n{rows[0].get('num_samples')} samples per item. "
            + intervals_note(rows, paired=bool(team)))
    if not team:
        text += "\n\nThe trained team is not in this table: the run had no checkpoint when the baselines ran."
    else:
        text += "\n\n" + same_checkpoint_note(team, run["evals"], key)
    return text + (f"\n\n{paper}" if paper else "")


def same_checkpoint_note(team: dict, evals: list[dict], key: str) -> str:
    """How Table 1's trained team relates to the held-out section: the same checkpoint scored the same way gives
    the same number (sampling is seeded by item, agent and sample); otherwise the line says what differs."""
    step, n = team.get("step"), team.get("num_samples")
    row = next((r for r in evals if r["step"] == step), None)
    if row is None:
        newest = f"; its newest is step {evals[-1]['step']}" if evals else ""
        return (f"The magrpo row scores step {step}, which the held-out section did not evaluate{newest} (`kit eval "
                f"--steps {step} --n {n}` adds it).")
    if team.get(key) is not None and row.get(key) is not None and abs(team[key] - row[key]) < 1e-9:
        return f"The magrpo row is the held-out section's step {step}: the same samples, the same {key}."
    why = (f"{n} samples per item here, {row.get('num_samples')} there" if row.get("num_samples") != n else
           f"{team.get('num_items')} items here, {row.get('num_items')} there" if
           row.get("num_items") != team.get("num_items") else "scored at different times")
    return (f"The magrpo row and the held-out section's step {step} are different samplings ({why}), so their "
            f"{key} differ: {stats.fmt(team.get(key))} here, {stats.fmt(row.get(key))} there. `kit baselines --n "
            f"{row.get('num_samples')}` puts this table on the held-out section's footing.")


def diff_cell(team: dict, row: dict, key: str) -> str:
    a, b = stats.per_item(team, key), stats.per_item(row, key)
    if not a or not b or len(a) != len(b):
        return "n/a"
    return stats.fmt(*stats.paired_bootstrap(a, b))


def paper_note(config: dict) -> str:
    """The paper's row when the setting matches and the kit has it; otherwise why it is absent."""
    dataset = PAPER_SETTINGS.get((config.get("task_args") or {}).get("dataset", "humaneval")) \
        if config.get("task") == "code" else None
    size = re.search(r"(\d+(?:\.\d+)?)B", config.get("model_name", ""))
    if dataset is None or not size:
        return ""
    if f"{size.group(1)}B" != PAPER_MODEL_SIZE:
        return (f"The paper's Table 1 uses {PAPER_MODEL_SIZE} models; this run uses {size.group(1)}B, so the "
                "paper's numbers are not comparable and are not shown.")
    rows = PAPER_TABLE1.get((dataset, PAPER_MODEL_SIZE))
    if not rows:
        return (f"This setting ({dataset}, {PAPER_MODEL_SIZE}) matches the paper's Table 1 ({PAPER}); the kit does "
                "not bundle a verified copy of its numbers, so compare with the paper's table directly.")
    keys = list(rows[0])
    lines = ["| paper's row | " + " | ".join(keys[1:]) + " |", "|---|" + "---|" * (len(keys) - 1)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    return f"The paper's numbers ({PAPER}, as published; no intervals):\n\n" + "\n".join(lines)


def game_section(run: dict) -> str:
    rows = run["baselines"]
    title = "Games: the trained team vs random, rule-based and the untrained team"
    if not rows:
        return missing(title, f"no eval/baselines.json; run `python -m kit baselines --run-dir {run['path']}`")
    team = next((r for r in rows if r["method"] == "magrpo"), None)
    head = ["method", "score", "illegal-move rate", "episode length", "greedy score"] + \
        (["Δ score (magrpo − method)"] if team else [])
    table = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    for r in rows:
        line = [f"magrpo (step {r.get('step')})" if r is team else r["method"], cell(r, "score/mean"),
                stats.fmt(r.get("illegal/rate", 0.0)), f"{r.get('episode/length', 0.0):.1f}",
                stats.fmt(r["greedy/score_mean"]) if "greedy/score_mean" in r else "–"]
        if team:
            line.append("–" if r is team else diff_cell(team, r, "score/mean"))
        table.append("| " + " | ".join(line) + " |")
    return (f"## {title}\n\nThe same held-out deals for every method; {rows[0].get('num_samples')} episodes per deal."
            "\n\n" + "\n".join(table) + "\n\n" + intervals_note(rows, paired=bool(team), unit="held-out deals"))


def schemes_section(run: dict, out: Path) -> str:
    from kit.analysis import schemes

    title = "Cooperation schemes"
    try:
        shares = schemes.scheme_shares(run["path"])
    except (FileNotFoundError, ValueError) as err:
        return missing(title, str(err))
    if not shares:
        return missing(title, "rollouts.jsonl has no code-task joint actions")
    present = [k for k in schemes.SCHEMES if any(s[k] > 0 for s in shares)]
    fig, (ax,) = figure(1, width=7.0)
    ax.stackplot([s["step"] for s in shares], *[[s[k] for s in shares] for k in present], labels=present, alpha=0.85)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of joint actions")
    step_axes(ax)
    fig.savefig(out / "schemes.png", dpi=110)
    last = shares[-1]
    text = [f"## {title}\n\nHow main uses the helper's functions, from the AST of every logged joint action "
            "(kit/analysis/schemes.py).\n\n![scheme shares over training](schemes.png)\n\n"
            f"Step {last['step']} ({last['count']} joint actions): " +
            ", ".join(f"{k} {last[k]:.0%}" for k in schemes.SCHEMES if last[k] > 0) + "."]
    fresh = json_or_none(run["path"] / "eval" / "schemes_fresh.json")
    text.append("On fresh samples: " + ", ".join(f"{k} {v:.0%}" for k, v in fresh.items() if v > 0) + "."
                if fresh else "On fresh samples: not computed (`kit.analysis.report.save_fresh_shares`, run by 07_report).")
    for scheme, found in schemes.examples(run["path"], per_scheme=2).items():
        for ex in found:
            code = "\n\n".join(clip(ex[part]) for part in ("helper", "main") if ex[part].strip())
            text.append(f"**{scheme}** (step {ex['step']}, {ex['item']}, reward {ex['reward']:.2f})\n\n" +
                        (f"```python\n{code}\n```" if code else "(no code in either completion)"))
    return "\n\n".join(text)


def save_fresh_shares(run_dir: str | Path, n: int = 8, log=print) -> dict[str, float]:
    """Scheme shares on fresh samples from the newest checkpoint (kit.analysis.schemes.fresh_shares), saved to
    eval/schemes_fresh.json where the report's cooperation section reads them."""
    from kit.analysis.schemes import fresh_shares

    shares = fresh_shares(run_dir, n=n, log=log)
    (Path(run_dir) / "eval").mkdir(exist_ok=True)
    (Path(run_dir) / "eval" / "schemes_fresh.json").write_text(json.dumps(shares, indent=1))
    return shares


def clip(text: str, lines: int = 25, chars: int = 1500) -> str:
    text = text.strip()[:chars]
    kept = text.splitlines()
    return "\n".join(kept[:lines] + ([f"... ({len(kept) - lines} more lines)"] if len(kept) > lines else []))


def joint_actions_section(run: dict) -> str:
    from kit.run.rundir import ROLLOUTS, read_jsonl

    title = "Best and worst joint actions"
    path = run["path"] / ROLLOUTS
    rows = read_jsonl(path) if path.exists() else []
    if not rows:
        return missing(title, "no rollouts.jsonl (log_rollouts=false, or no step yet)")
    step = max(r["step"] for r in rows)
    newest = sorted((r for r in rows if r["step"] == step), key=lambda r: r["reward"], reverse=True)
    roles = _roles(run["path"])
    out = [f"## {title}\n\nFrom the newest logged training step ({step}, {len(newest)} sampled joint actions; "
           "held-out evaluations do not log their samples)."]
    worst = newest[3:][-3:][::-1]  # never the same joint action in both lists
    for name, picked in (("Best", newest[:3]), ("Worst", worst)):
        out.append(f"### {name} {len(picked)}")
        out += [render_joint(r, roles) for r in picked] or ["(no more joint actions at this step)"]
    return "\n\n".join(out)


def _roles(run_dir: Path) -> list[str]:
    """The task's role names (helper/main, digit_0...); none when the task cannot be built here."""
    from kit.run.rundir import open_run

    try:
        return list(getattr(open_run(run_dir).task, "roles", None) or [])
    except Exception as err:  # a task needing what this machine lacks: agent_i names instead
        print(f"[kit] report: role names unavailable ({type(err).__name__}: {err}); using agent_i")
        return []


def render_joint(row: dict, roles: list[str]) -> str:
    """One joint action (or game episode) as Markdown: item, reward and parts, each agent's text."""
    head = f"**{row['item']}**, reward {row['reward']:.3f}"
    if "decisions" in row:  # a game episode
        moves = "; ".join(f"p{d['player']}: {d.get('move') or '(illegal)'}" for d in row["decisions"][:40])
        return (f"{head}, score {row.get('score')}, {row.get('illegal', 0)} illegal of {row.get('length')} "
                f"decisions\n\n> {moves}")
    parts = ", ".join(f"{k} {v:.2f}" for k, v in (row.get("parts") or {}).items())
    text = [head + (f" ({parts})" if parts else "") + (f", turn {row['turn']}" if row.get("turn") else "")]
    for a, completion in enumerate(row.get("completions", [])):
        name = roles[a] if a < len(roles) else f"agent_{a}"
        short = completion.strip()
        if "\n" not in short and "`" not in short and len(short) <= 80:
            text.append(f"{name}: `{short}`" if short else f"{name}: (empty)")
        else:
            text.append(f"{name}:\n\n```\n{clip(completion, lines=15, chars=800)}\n```")
    return "\n\n".join(text)


def show(markdown_path: str | Path) -> None:
    """Display a RESULTS.md or COMPARE.md in a notebook with its figures inline. Jupyter and Colab do not load
    images by a path relative to a Markdown file, so the text goes out as Markdown and each figure as an image."""
    from IPython.display import Image, Markdown, display

    path = Path(markdown_path)
    chunks = re.split(r"!\[[^\]]*\]\(([^)]+)\)", path.read_text())  # text, image, text, image, ...
    for i, chunk in enumerate(chunks):
        if i % 2:
            display(Image(filename=str(path.parent / chunk)))
        elif chunk.strip():
            display(Markdown(chunk))
