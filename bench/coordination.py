"""The coordination suite: every credit-assignment method on every Tiny Hanabi Suite game, over seeds, scored exactly.

    python bench/coordination.py                                   # game E, seeds 0-15, every method, 300 steps
    python bench/coordination.py --games A B C D E F --seeds 0 1 2 3 --methods magrpo role
    python bench/coordination.py --table                           # the table of the rows saved so far
    python bench/coordination.py --base smol --seeds 0 1 --methods magrpo iac maac_v   # SmolLM2, 30 steps

`--base smol` runs each method on the `smol_hanabi` preset instead (SmolLM2-135M-Instruct, the full prompt that names
cards and moves, one deal x G = 8 episodes a step, 30 steps; issue 39), with the cross-play methods at G = 3 (9
episodes a deal) and leniency decaying over the first half of the run; rows go to bench/out/coordination_smol.jsonl.
A 49k vocabulary cannot be enumerated in seconds (kit/tasks/coordination.py `enumerable`), so there only the greedy team's
return is exact; the sampled column is left empty.

A method is a list of overrides of the `tiny_hanabi` preset (the built-in tiny model, compact prompts, one adapter
per player; METHODS below, settings fixed before any result was seen). A method whose config fields do not exist
in this tree (the critics of issue 31's other half, until they land) is skipped with one line. Runs go seed by
seed (every method on seed 0, then seed 1, ...), so a run cut short leaves every method with the same seeds.

Per run: the exact expected return of the greedy team every `--every` steps (kit/tasks/coordination.py: every deal, no
sampling noise), and at the end the greedy and the sampling policies' exact returns and the training seconds
(the evaluations are not timed). Rows are appended to bench/out/coordination.jsonl and a run already there is not
run again. The table, per (method, game): the share of seeds whose final greedy return equals the game's
optimum, the mean final greedy and sampled returns, and s/step (training only; on a shared CPU an upper bound).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out" / "coordination.jsonl"
BASES = {"tiny": ("tiny_hanabi", "compact", 300, OUT),
         "smol": ("smol_hanabi", "full", 30, ROOT / "bench" / "out" / "coordination_smol.jsonl")}

# name -> overrides of the tiny_hanabi preset. marginal: G=4 and 4 deals, so that its G^2 = 16 episodes per deal
# make the same 64 episodes per step as the preset's 8 deals x G=8.
METHODS = {
    "magrpo": [],
    "magrpo_group": ["scale_rewards=group"],
    "marginal": ["joint_mode=cross", "advantage_mode=marginal", "num_generations=4", "batch_size=4"],
    "role": ["advantage_mode=role"],
    "iac": ["algorithm=iac"],
    "iac_shared": ["algorithm=iac", "use_separate_critic=false"],  # value heads on the players' own adapters
    "maac_v": ["algorithm=maac", "critic_type=v"],
    "maac_q_cf": ["algorithm=maac", "critic_type=q", "baseline=counterfactual"],
    # lenient credit (kit/maths/magrpo.py `lenient`): each first move judged by its partner's best answer, kappa 1 falling
    # to 0 over the first half of the run (lenient learners decay their leniency); cross as `marginal`
    "lenient": ["joint_mode=cross", "advantage_mode=marginal", "num_generations=4", "batch_size=4", "leniency=1",
                "leniency_decay_steps=150"],
    # the two levers issue 31 names for the collapsing Q critic (game E only; chosen before any run): the actors wait
    # while the critic fits its first 50 of 300 steps, or the advantages keep the critic's scale (no normalisation)
    "maac_q_cf_warm": ["algorithm=maac", "critic_type=q", "baseline=counterfactual", "critic_warmup_steps=50"],
    "maac_q_cf_raw": ["algorithm=maac", "critic_type=q", "baseline=counterfactual", "advantage_normalization=false"],
    # issue 39, chosen before any run (game E on SmolLM2 first): 4 deals a step instead of smol's one, so that each
    # step's update sees player 0 with both its cards (7 steps in 8) and the first mover's V is not one number per
    # step (kit/run/config.py first_mover_warning). On tiny, `magrpo_4deals` has fewer deals than the preset's 8 and
    # `lenient_4deals` is `lenient`.
    "magrpo_4deals": ["batch_size=4"],
    "lenient_4deals": ["joint_mode=cross", "advantage_mode=marginal", "num_generations=4", "batch_size=4",
                       "leniency=1", "leniency_decay_steps=150"],
}
KEEP_DEALS = {"magrpo_4deals", "lenient_4deals"}  # their batch_size stays 4 on smol


def overrides(method: str, base: str, steps: int) -> list[str]:
    """METHODS[method] for a base: on smol (one deal x G = 8 a step) the cross-play methods take G = 3 on one deal
    (9 episodes; `lenient_4deals`: G = 3 on 4 deals); leniency decays over the first half of the run and a critic's
    warm-up is its first sixth, as on tiny's 300 steps."""
    out = list(METHODS[method])
    if base == "smol":
        deals = "batch_size=4" if method in KEEP_DEALS else "batch_size=1"
        out = ["num_generations=3" if o == "num_generations=4" else deals if o == "batch_size=4" else o for o in out]
    scaled = {"leniency_decay_steps": steps // 2, "critic_warmup_steps": steps // 6}  # 150 and 50 of 300 steps
    return [f"{o.split('=')[0]}={scaled[o.split('=')[0]]}" if o.split("=")[0] in scaled else o for o in out]


def runnable(method: str) -> str | None:
    """None if this tree can run `method`, else why not (one line)."""
    from kit.run.config import ConfigError, TrainConfig, load_config

    fields = TrainConfig.__dataclass_fields__
    missing = [o.split("=")[0] for o in METHODS[method] if o.split("=")[0] not in fields]
    if missing:
        return f"config field(s) {', '.join(missing)} do not exist in this tree"
    try:
        load_config("tiny_hanabi", overrides=METHODS[method])
    except ConfigError as err:
        return str(err)
    return None


def run(method: str, game: str, seed: int, steps: int, every: int, base: str = "tiny") -> dict:
    import tempfile

    import torch

    from kit.run.config import load_config
    from kit.tasks.coordination import enumerable, exact_eval, greedy_moves
    from kit.trainers.game_trainer import GameTrainer

    torch.set_num_threads(1)
    preset, style = BASES[base][:2]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(preset, overrides=[
            f"run_dir={Path(tmp) / 'run'}", f"seed={seed}", f"num_steps={steps}", "eval_every=0", "save_every=0",
            "progress=false", "log_rollouts=false",
            f"task_args={{game: tiny_hanabi, prompt_style: {style}, suite: {game}}}", *overrides(method, base, steps)])
        trainer = GameTrainer(cfg, log=lambda *_: None)
        curve, seconds = [], 0.0
        while trainer.step < steps:
            start = time.perf_counter()
            trainer.train(max_steps=every)
            seconds += time.perf_counter() - start
            curve.append(exact_eval(trainer.sampler, trainer.task, sampled=False)["eval/exact_greedy"])
        sampled = enumerable(trainer.team)
        final = {"eval/exact_sampled": float("nan"), "eval/exact_unresolved": float("nan"),
                 **exact_eval(trainer.sampler, trainer.task, sampled=sampled)}
        first, second = greedy_moves(trainer.sampler, trainer.task)
        trainer.close()
    return {"method": method, "game": game, "seed": seed, "steps": steps, "base": base, "curve": curve,
            "greedy": final["eval/exact_greedy"], "sampled": final["eval/exact_sampled"],
            "unresolved": final["eval/exact_unresolved"], "optimum": final["eval/exact_optimum"],
            "reached": bool(abs(final["eval/exact_greedy"] - final["eval/exact_optimum"]) < 1e-9),
            "train_s": seconds, "s_per_step": seconds / steps,
            "moves": {"player_0": first, "player_1": second}}  # greedy moves per card / per (card, seen move)


def table(rows: list[dict]) -> str:
    keys = sorted({(r["method"], r["game"], r["steps"]) for r in rows},
                  key=lambda k: (k[1], list(METHODS).index(k[0]) if k[0] in METHODS else 99, k[2]))
    from kit.tasks.coordination import card_blind_moves, deterministic, payoff_table, value

    def blind(game: str) -> float:  # the best return of a team that ignores the cards
        P = payoff_table(game)
        a0, reply = card_blind_moves(P)
        return value(P, deterministic([a0] * P.shape[0], P.shape[-1]), deterministic([reply] * P.shape[0], P.shape[-1]))

    lines = ["| game (optimum, card-blind best) | method | seeds | reached the optimum | at the card-blind best | "
             "final greedy (mean) | final sampled (mean) | player 0 reads its card | s/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for method, game, steps in keys:
        mine = sorted((r for r in rows if (r["method"], r["game"], r["steps"]) == (method, game, steps)),
                      key=lambda r: r["seed"])
        n = len(mine)
        mean = lambda k: sum(r[k] for r in mine) / n  # noqa: E731
        seeds = f"{mine[0]['seed']}-{mine[-1]['seed']}" if n > 1 else str(mine[0]["seed"])
        b = blind(game)
        at_blind = sum(abs(r["greedy"] - b) < 1e-9 for r in mine)
        reads = sum(len(set(map(str, r.get("moves", {}).get("player_0", [])))) > 1  # its greedy move differs by card
                    for r in mine)  # (rows written before `moves` existed count as not reading it)
        lines.append(f"| {game} ({mine[0]['optimum']:.4g}, {b:.4g}) | {method} | {seeds} ({n}) | "
                     f"{sum(r['reached'] for r in mine)}/{n} | {at_blind}/{n} | {mean('greedy'):.3f} | "
                     f"{mean('sampled'):.3f} | {reads}/{n} | {mean('s_per_step'):.3f} |".replace("nan", "-"))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--games", nargs="+", default=["E"], choices=list("ABCDEF"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(16)))
    parser.add_argument("--base", choices=list(BASES), default="tiny", help="tiny (the built-in model) or smol")
    parser.add_argument("--steps", type=int, default=None, help="default: 300 (tiny), 30 (smol)")
    parser.add_argument("--every", type=int, default=None, help="steps between exact greedy evaluations "
                        "(default: a twelfth of the steps, at least 1)")
    parser.add_argument("--table", action="store_true", help="print the table of the saved rows and stop")
    args = parser.parse_args(argv)
    out = BASES[args.base][3]
    args.steps = args.steps or BASES[args.base][2]
    args.every = args.every or max(1, args.steps // 12)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if not args.table:
        methods = []
        for m in args.methods:
            why = runnable(m)
            if why:
                print(f"[bench] {m} skipped: {why}", flush=True)
            else:
                methods.append(m)
        done = {(r["method"], r["game"], r["seed"], r["steps"]) for r in rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        for seed in args.seeds:
            for game in args.games:
                for m in methods:
                    if (m, game, seed, args.steps) in done:
                        continue
                    row = run(m, game, seed, args.steps, args.every, args.base)
                    rows.append(row)
                    with out.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                    print(f"[bench] {m} game {game} seed {seed}: greedy {row['greedy']:.3f} sampled "
                          f"{row['sampled']:.3f} (optimum {row['optimum']:.4g}) {row['s_per_step']:.3f} s/step",
                          flush=True)
    print(table([r for r in rows if r["method"] in args.methods and r["game"] in args.games]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
