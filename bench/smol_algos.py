"""The kit's other trainer families on SmolLM2-135M-Instruct, beside Table 1's MAGRPO rows (issue 39).

    python bench/smol_algos.py train writing --variants madpo marlhf iac maac maac_q --seeds 0
    python bench/smol_algos.py fit writing --variant marlhf_answers --seed 100   # a reward model's fit alone
    python bench/smol_algos.py table                   # bench/results/smol_algos.md

A variant is a list of overrides of a smol preset (VARIANTS below, fixed before any of its runs): MADPO and MARLHF
(preferences), IAC and MAAC with V critics, MAAC with a Q critic. Each run is the preset with `--set seed=S` for
the steps of the MAGRPO rows of bench/smol.py (checkpoints/smol_bench/<task>_s<S>), trained in
checkpoints/smol_algos/<task>_<variant>_s<S> (git-ignored; an interrupted run resumes), then its trained team is
sampled on the same held-out items as those rows (`kit baselines`' `magrpo` row: the run's own team, whatever its
algorithm), so every comparison is paired on items and seeds.

`marlhf` on writing takes its pairs from a rule oracle behind the judge's interface (kit/judge/pairs.py
`oracle_judge`): a Judge whose client answers `PREFER: A|B|TIE` by the TLDR reward of each joint answer (the task's
own level reward, which now scores words: SmolLM2 writes them), asked in both orders through the real budget,
ledger and cache at claude-haiku-4-5's prices. No API is called. The RL stage is MAGRPO on the reward model's
scores, evaluated with the task's reward, so its held-out row reads on the same scale as MAGRPO's.

The table: per variant, the held-out reward pooled over seeds (95% bootstrap over items, kit/analysis/stats.py), the paired
difference against MAGRPO and against the untrained team on the same seeds, the greedy held-out reward at step 0 and
at the last step, s/step with the time split, and what the variant's own models did: the reward model's pair
accuracy (train / held out) and the judge's calls and dollars against scoring every rollout; the critics' explained
variance (`across_steps`: with one item a step a V critic's values do not vary within a step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import smol  # noqa: E402  (bench/smol.py: the MAGRPO rows, pooling and time split)

RUNS = HERE.parent / "checkpoints" / "smol_algos"
JUDGE = ["preference_source=judge", "judge_model=claude-haiku-4-5", "pair_selection=all"]
VARIANTS = {
    # MADPO: as many joint answers per prompt as MAGRPO's group (G = 4), CoMLRL's defaults otherwise (2 pairs per
    # prompt by reward gap, dpo_beta 0.1, the base as reference, new candidates every step)
    "madpo": ["algorithm=madpo", "preference_num_candidates=4"],
    # MARLHF: every train item's 4 candidates (22 TLDR train items, 6 of them held out), every pair the oracle does
    # not call a tie, 3 epochs, fit once at step 0 (CoMLRL's offline MARLHF); scale_rewards=group since
    # Bradley-Terry logits have no set scale (kit/trainers/marlhf.py); 4 texts a forward (16 joint texts of ~500 tokens at
    # once took the fit above 20 GB)
    "marlhf": ["algorithm=marlhf", *JUDGE, "preference_num_candidates=4", "preference_pairs_per_sample=null",
               "reward_num_items=32", "reward_num_train_epochs=3", "scale_rewards=group", "micro_batch_size=4"],
    # added after the marlhf row (its reward model 0.67 held out): the answers alone (no post to memorise, ~5x fewer
    # tokens), every pair of 8 candidates per post (28 against 6), 2 epochs; its fit measured on seed 100 (`fit`)
    "marlhf_answers": ["algorithm=marlhf", *JUDGE, "preference_num_candidates=8", "preference_pairs_per_sample=null",
                       "reward_num_items=32", "reward_num_train_epochs=2", "scale_rewards=group", "micro_batch_size=4",
                       "reward_model_reads_prompts=false"],
    # added after marlhf_answers' fit (0.61 held out): the same pairs (same seed: the same candidates and oracle
    # labels), the head on the SUM of the answers' hidden states (`reward_model_pooling=sum`): a score per token
    # added up can count words, which a last-token score did not learn to
    "marlhf_answers_sum": ["algorithm=marlhf", *JUDGE, "preference_num_candidates=8",
                           "preference_pairs_per_sample=null", "reward_num_items=32", "reward_num_train_epochs=2",
                           "scale_rewards=group", "micro_batch_size=4", "reward_model_reads_prompts=false",
                           "reward_model_pooling=sum"],
    # added after marlhf_answers_sum's fit (0.65 held out), chosen before its run (2026-11-27, fifth session): the
    # frozen reward model of `marlhf` was climbed, not the task (the policy drifted to answers it had never seen).
    # This refits it every 5 steps on pairs of the current policy's answers, as online RLHF does, the model going
    # on from its previous fit; answers alone, the summing head, 4 candidates a post (every refit pays the oracle)
    "marlhf_refresh": ["algorithm=marlhf", *JUDGE, "preference_num_candidates=4", "preference_pairs_per_sample=null",
                       "reward_num_items=32", "reward_num_train_epochs=2", "scale_rewards=group", "micro_batch_size=4",
                       "reward_model_reads_prompts=false", "reward_model_pooling=sum", "reward_refresh_every=5"],
    "iac": ["algorithm=iac"],
    # added after the iac and maac rows matched MAGRPO's exactly (bench/README.md): with one item a step a V critic's
    # baseline is one number per step, which advantage_normalization removes; without it the baseline is the
    # critic's V(prompt) in the reward's units, against MAGRPO's group mean
    "iac_raw": ["algorithm=iac", "advantage_normalization=false"],
    "maac": ["algorithm=maac"],
    "maac_q": ["algorithm=maac", "critic_type=q"],
    # added after iac_raw on code (its critics started at V = 0 and pushed every early answer up; bench/README.md):
    # the policy waits while the fresh critics fit their first 5 steps (fixed before the run: V had caught up with
    # the rewards by step 7 of iac_raw, while the policy moved)
    "iac_raw_warm": ["algorithm=iac", "advantage_normalization=false", "critic_warmup_steps=5"],
}


def oracle(task, run_dir: Path, budget_usd: float = 5.0):
    """(JudgePreference, judge): the writing task's own reward as the judge's rule, behind the judge's interface."""
    from kit.judge.pairs import JudgePreference, oracle_judge

    judge = oracle_judge(run_dir, lambda completions: task.reward(None, completions).total, budget_usd=budget_usd,
                         log=lambda *_: None, score_max=3.0)
    return JudgePreference(judge, task.judge_rubric), judge


def run(task: str, variant: str, seed: int, run_dir: Path, extra: list[str]) -> None:
    """Train one variant on one seed in run_dir (resumed if it has a config), MARLHF's judge the rule oracle."""
    from kit.run.config import load_config
    from kit.trainers.game_trainer import trainer_class
    from kit.tasks import task_for

    overrides = [*smol.TASK_OVERRIDES.get(task, []), *VARIANTS[variant], f"seed={seed}", f"run_dir={run_dir}",
                 "progress=false", *extra]
    cfg = load_config(smol.PRESET[task], overrides=overrides)
    done = (run_dir / "config.json").exists()
    kwargs = {}
    if cfg.preference_source == "judge" and cfg.algorithm == "marlhf":
        if task != "writing":  # the oracle's rule is a reward of the completions alone: TLDR's
            raise SystemExit(f"{variant}: the rule oracle scores TLDR answers; run it on writing")
        run_dir.mkdir(parents=True, exist_ok=True)
        kwargs["preference_fn"] = oracle(task_for(cfg), run_dir)[0]
    trainer = trainer_class(cfg.task, cfg.algorithm)(cfg, resume=done, **kwargs)
    trainer.train()
    trainer.close()


def train(task: str, variants: list[str], seeds: list[int], steps: int | None, n: int, extra: list[str]) -> None:
    from kit.analysis.baselines import compare

    for seed in seeds:
        for variant in variants:
            run_dir = RUNS / f"{task}_{variant}_s{seed}"
            run(task, variant, seed, run_dir, [*extra, *([f"num_steps={steps}"] if steps else [])])
            compare(run_dir, [], n=n)  # the trained team only, sampled as bench/smol.py samples every row


def fit(task: str, variant: str, seed: int) -> None:
    """A MARLHF variant's reward-model fit alone: its step 0 (the oracle's pairs, the fit) and one RL step, in
    checkpoints/smol_algos_fits/<task>_<variant>_s<S>; prints the fit's rm/ metrics and the judge's ledger."""
    if "algorithm=marlhf" not in VARIANTS[variant]:
        raise SystemExit(f"{variant}: `fit` measures a marlhf variant's reward model")
    run_dir = RUNS.parent / "smol_algos_fits" / f"{task}_{variant}_s{seed}"
    run(task, variant, seed, run_dir, ["num_steps=1"])
    metrics = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    print(json.dumps({k: v for m in metrics for k, v in m.items() if k.startswith("rm/") or k == "perf/sample_s"}))
    print((run_dir / "budget.json").read_text())
    if (run_dir / "rm_pairs.jsonl").exists():
        pairs = [json.loads(line) for line in open(run_dir / "rm_pairs.jsonl")]
        heldout = [p for p in pairs if p["heldout"]]
        print(f"held out by the task's margin (under / at least {MARGIN}):", by_margin(heldout))


def load(root: Path) -> dict[str, list[dict]]:
    runs = {}
    for run_dir in sorted(root.glob("*_s*")):
        if not (run_dir / "eval" / "baselines.json").exists():
            continue
        name, seed = run_dir.name.rsplit("_s", 1)
        budget, pairs = run_dir / "budget.json", run_dir / "rm_pairs.jsonl"
        runs.setdefault(name, []).append({
            "rm_pairs": [json.loads(line) for line in open(pairs)] if pairs.exists() else [],
            "seed": int(seed), "config": json.loads((run_dir / "config.json").read_text()),
            "metrics": [json.loads(line) for line in open(run_dir / "metrics.jsonl")],
            "baselines": json.loads((run_dir / "eval" / "baselines.json").read_text()),
            "budget": json.loads(budget.read_text()) if budget.exists() else None})
    return runs


def own_models(seeds: list[dict]) -> str:
    """What a variant's reward model or critics did, pooled over its seeds (one line)."""
    out = []
    fits = [m for s in seeds for m in s["metrics"] if "rm/num_pairs" in m]
    if fits:
        acc = lambda k: ", ".join(f"{m[k]:.2f}" for m in fits if k in m)  # noqa: E731
        out.append(f"reward model: {sum(m['rm/num_pairs'] for m in fits)} train / "
                   f"{sum(m['rm/heldout_pairs'] for m in fits)} held-out pairs, accuracy train {acc('rm/train_accuracy')}"
                   f", held out **{acc('rm/heldout_accuracy')}**")
    margins = by_margin([p for s in seeds for p in s.get("rm_pairs", []) if p["heldout"]])
    if margins:
        out.append(f"held out by the task's margin (|r_w - r_l| under / at least {MARGIN}): {margins}")
    for s in seeds:
        if s["budget"]:
            cfg, b = s["config"], s["budget"]
            every = cfg["num_steps"] * cfg["batch_size"] * cfg["num_generations"]
            out.append(f"judge s{s['seed']}: {b['calls']} calls, ${b['spent_usd']:.3f} (scoring every rollout of the "
                       f"run: {every} calls)")
    names = sorted({k.split("/")[-1] for s in seeds for m in s["metrics"] for k in m
                    if k.startswith("critic/value_mean/")})
    for name in names:
        steps = [m for s in seeds for m in s["metrics"] if f"critic/value_mean/{name}" in m]
        half = max(m["step"] for m in steps) // 2
        within = [m[f"critic/explained_variance/{name}"] for m in steps
                  if f"critic/explained_variance/{name}" in m and m["step"] > half]
        across = [across_steps([m for m in steps if lo < m["step"] <= hi], name) for lo, hi in ((0, half), (half, 1e9))]
        out.append(f"{name} explained variance across steps {across[0]:+.2f} (steps 1-{half}) -> {across[1]:+.2f} "
                   f"(the rest)" + (f", within a step {np.mean(within):+.2f} (the rest)" if within else ""))
    return "; ".join(out)


MARGIN = 0.5  # the task's reward gap that splits the reward model's held-out pairs (TLDR: the structure level's worth)


def by_margin(pairs: list[dict]) -> str:
    """The reward model's held-out accuracy per fit (rm_pairs.jsonl), on pairs whose task rewards differ by less than
    MARGIN and by at least MARGIN: does it miss fine distinctions or whole levels? (Ties in score count as wrong.)"""
    out = []
    for step in sorted({p["step"] for p in pairs}):
        fit = [p for p in pairs if p["step"] == step]
        parts = []
        for name, keep in (("under", lambda m: m < MARGIN), ("at least", lambda m: m >= MARGIN)):
            mine = [p for p in fit if keep(abs(p["task_reward"][0] - p["task_reward"][1]))]
            right = sum(p["score"][0] > p["score"][1] for p in mine)
            parts.append(f"{right / len(mine):.2f} of {len(mine)}" if mine else f"none {name}")
        out.append(f"step {step}: {parts[0]} / {parts[1]}")
    return "; ".join(out)


def across_steps(steps: list[dict], name: str) -> float:
    """1 - Var(r - V) / Var(r) over steps, r a step's mean team reward and V the critic's mean value before it.
    With one item a step every sample shares one prompt, so a V critic gives every row of a step the same value and
    its per-step explained variance is 0 by construction; across steps it says whether V follows the prompts' and the
    policy's changing returns."""
    from kit.maths.actor_critic import explained_variance

    return explained_variance([m[f"critic/value_mean/{name}"] for m in steps], [m["reward/mean"] for m in steps])


def table() -> None:
    from kit.analysis import stats

    magrpo_runs, runs = smol.load_runs(), load(RUNS)
    lines = ["# The kit's trainer families on SmolLM2-135M-Instruct (made by `python bench/smol_algos.py table`)", ""]
    for task in ("writing", "code", "hanabi"):
        names = [k for k in runs if k.startswith(f"{task}_")]
        if not names:
            continue
        lines += [f"## {task}", "", "| method | seeds | held-out reward (95% CI over items) | per seed | "
                  "minus MAGRPO, paired (same seeds) | minus the untrained team, paired | greedy step 0 -> last | "
                  "s/step (generate, reward, update) |", "|---|---|---|---|---|---|---|---|"]
        seeds_of = {s["seed"] for k in names for s in runs[k]}
        ref = [s for s in magrpo_runs.get(task, []) if s["seed"] in seeds_of]
        rows = {"magrpo": (ref, [r for s in ref for r in s["baselines"] if r["method"] == "magrpo"])}
        rows.update({k.removeprefix(f"{task}_"): (runs[k], [r for s in runs[k] for r in s["baselines"]
                                                           if r["method"] == "magrpo"]) for k in names})
        untrained = [r for s in ref for r in s["baselines"] if r["method"] in ("naive", "base")]
        for method, (seeds, team) in rows.items():
            if not team:
                continue
            mean, low, high, per_seed, items = smol.pooled(team)
            mine = sorted(s["seed"] for s in seeds)
            same = lambda rs: [r for s, r in zip(ref, rs) if s["seed"] in mine]  # noqa: E731
            vs = []
            for which, other in (("magrpo", rows["magrpo"][1]), ("untrained", untrained)):
                other = same(other) if len(other) == len(ref) else []
                if method == which:
                    vs.append("")
                elif len(other) == len(team):
                    d, dl, dh = stats.paired_bootstrap(items, smol.pooled(other)[4])
                    vs.append(f"{d:+.3f} [{dl:+.3f}, {dh:+.3f}]")
                else:
                    vs.append("")
            greedy = [[m["eval/reward_mean"] for m in s["metrics"] if "eval/reward_mean" in m] for s in seeds]
            t = [smol.split(s["metrics"]) for s in seeds]
            lines.append(f"| {method} | {', '.join(map(str, mine))} | {mean:.3f} [{low:.3f}, {high:.3f}] | "
                         f"{', '.join(f'{v:.2f}' for v in per_seed)} | {vs[0]} | {vs[1]} | "
                         f"{np.mean([g[0] for g in greedy]):.3f} -> {np.mean([g[-1] for g in greedy]):.3f} | "
                         f"{np.mean([x['step'] for x in t]):.1f} ({np.mean([x['generate'] for x in t]):.1f}, "
                         f"{np.mean([x['reward'] for x in t]):.1f}, {np.mean([x['update'] for x in t]):.1f}) |")
        lines.append("")
        lines += [f"- {k.removeprefix(task + '_')}: {own_models(runs[k])}" for k in names if own_models(runs[k])]
        lines.append("")
    (smol.OUT / "smol_algos.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("task", choices=sorted(smol.PRESET))
    tr.add_argument("--variants", nargs="+", required=True, choices=sorted(VARIANTS))
    tr.add_argument("--seeds", type=int, nargs="+", default=[0])
    tr.add_argument("--steps", type=int, default=20, help="the MAGRPO rows' steps (bench/smol.py)")
    tr.add_argument("--n", type=int, default=4, help="samples per held-out item (bench/smol.py's)")
    tr.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    fi = sub.add_parser("fit", help="a marlhf variant's reward-model fit alone (step 0 and one RL step)")
    fi.add_argument("task", choices=["writing"])
    fi.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    fi.add_argument("--seed", type=int, default=100)
    sub.add_parser("table")
    args = parser.parse_args()
    if args.cmd == "train":
        train(args.task, args.variants, args.seeds, args.steps, args.n, args.extra)
    elif args.cmd == "fit":
        fit(args.task, args.variant, args.seed)
    else:
        table()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
