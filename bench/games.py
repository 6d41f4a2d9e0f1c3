"""Game rollouts: decisions/s of the kit's episode loop (one generate per decision for ALL live episodes) against
a naive loop that plays one episode at a time (one generate per decision, one row), on the same deals.

    python bench/games.py                                        # CPU: the built-in tiny model, hanabi, 8 episodes
    python bench/games.py --episodes 16 --max-decisions 40
    python bench/games.py --shape 1.5b --prompt-style full       # GPU: random weights in Qwen2.5-1.5B's shape
    python bench/games.py --tiny                                 # smoke (tests/test_bench.py)

Both loops go through the same `kit.tasks.games.play` and the same Sampler; the naive one calls it once per episode.
Samples are seeded per (deal, episode, decision), not by batch position, so both loops play exactly the same
games (checked: every move of every episode is compared), and the ratio is the batching alone. One untimed
round of each loop comes first (the compiled engine compiles its shapes then). Results are appended to
bench/out/games.jsonl and printed as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
OUT = ROOT / "bench" / "out"


def build(args):
    from kit.run.config import load_config
    from kit.engine.models import build_team
    from kit.engine.rollout import Sampler
    from kit.tasks import task_for

    overrides = ["task=game", f"num_agents={args.players}", f"rollout_engine={args.engine}",
                 f"max_new_tokens={args.new_tokens}", "progress=false",
                 "task_args={game: %s, prompt_style: %s, max_decisions: %d}" % (args.game, args.prompt_style,
                                                                                args.max_decisions)]
    if args.shape == "tiny":
        overrides = ["model_name=tiny", "use_chat_template=false", "temperature=1.0", "top_p=1.0", *overrides]
    else:
        from gpu import build_model

        overrides = [f"model_name={build_model(args.shape)}", "temperature=0.7", "top_p=0.9", *overrides]
    cfg = load_config(None, overrides=overrides)
    task = task_for(cfg)
    team = build_team(cfg, log=lambda *_: None)
    return task, Sampler.from_config(team, cfg), cfg, overrides


def train_row(args, overrides: list[str], like: dict) -> dict:
    """GameTrainer steps (sample + update) on the same model and game: s/step, decisions/s, peak GPU memory."""
    import shutil

    import torch

    from kit.run.config import load_config
    from kit.trainers.game_trainer import GameTrainer

    run_dir = OUT / "run_games"
    shutil.rmtree(run_dir, ignore_errors=True)
    G = min(4, args.episodes)
    cfg = load_config(None, overrides=[*overrides, f"run_dir={run_dir}", f"batch_size={max(args.episodes // G, 1)}",
                                       f"num_generations={G}", f"num_steps={args.train_steps + 1}", "eval_every=0",
                                       "save_every=0", "log_rollouts=false", "learning_rate=1e-5"])
    cfg.save_every = 10**9  # the final save is not part of a step
    trainer = GameTrainer(cfg, log=lambda *_: None)
    trainer.train(max_steps=1)  # warm-up: compiles
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train(max_steps=args.train_steps)
    trainer.close()
    timed_rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")][1:]
    step_s = sum(r["perf/step_s"] - r.get("perf/compile_s", 0.0) for r in timed_rows) / len(timed_rows)
    decisions = sum(r["episode/length"] * cfg.batch_size * G for r in timed_rows) / len(timed_rows)
    out = {**like, "loop": f"train ({cfg.batch_size} deals x G={G})", "seconds": step_s, "decisions": decisions,
           "decisions_per_s": decisions / step_s, "speedup": float("nan"),
           "update_s": sum(r["perf/update_s"] for r in timed_rows) / len(timed_rows)}
    if torch.cuda.is_available():
        out["peak_alloc_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def timed(fn) -> tuple[float, object]:
    import torch

    start = time.perf_counter()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", help="tiny (the kit's built-in CPU model) or a bench/gpu.py shape")
    parser.add_argument("--game", default="hanabi")
    parser.add_argument("--players", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=8, help="episodes played together (one deal each)")
    parser.add_argument("--max-decisions", type=int, default=20)
    parser.add_argument("--prompt-style", default="compact", choices=["compact", "full"])
    parser.add_argument("--new-tokens", type=int, default=3)
    parser.add_argument("--engine", default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each loop (the best is reported)")
    parser.add_argument("--loops", nargs="+", default=["batched", "naive"], choices=["batched", "naive"])
    parser.add_argument("--train-steps", type=int, default=0,
                        help="also time this many GameTrainer steps (after one warm-up step) on the same settings, "
                             "--episodes split as deals x G=4")
    parser.add_argument("--tiny", action="store_true", help="smoke: 2 episodes, 3 decisions, 1 round")
    args = parser.parse_args(argv)
    if args.tiny:
        args.episodes, args.max_decisions, args.repeats = 2, 3, 1

    from kit.tasks.games import play

    task, sampler, cfg, overrides = build(args)
    seeds = list(range(args.episodes))
    keys = [("bench", s) for s in seeds]

    def batched():
        return play(sampler, task, seeds, 1, keys)

    def naive():
        played = [play(sampler, task, [s], 1, [k]) for s, k in zip(seeds, keys)]
        return [ep for eps, _ in played for ep in eps], [r for _, rounds in played for r in rounds]

    results = {}
    for name in args.loops:
        loop = {"batched": batched, "naive": naive}[name]
        t0 = time.perf_counter()
        _, rounds = loop()  # untimed: compiles (GPU) and warms the caches
        compile_s = sum(r.rollout.compile_seconds for r in rounds)
        print(f"[bench] {name}: warm-up round {time.perf_counter() - t0:.1f} s, {compile_s:.1f} s of it compiling",
              flush=True)
        best, (episodes, _) = min((timed(loop) for _ in range(args.repeats)), key=lambda t: t[0])
        decisions = sum(ep.length for ep in episodes)
        results[name] = {"loop": name, "seconds": best, "decisions": decisions, "decisions_per_s": decisions / best,
                         "warmup_compile_s": compile_s, "moves": [[d["move"] for d in ep.decisions] for ep in episodes]}
        print(f"[bench] {name}: {decisions} decisions in {best:.2f} s", flush=True)
    same = len(results) == 2 and results["batched"]["moves"] == results["naive"]["moves"]
    base = results.get("naive", next(iter(results.values())))
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    rows = []
    for r in results.values():
        del r["moves"]
        rows.append({**r, "speedup": r["decisions_per_s"] / base["decisions_per_s"],
                     "same_games": same, "shape": args.shape, "game": args.game, "episodes": args.episodes,
                     "max_decisions": args.max_decisions, "prompt_style": args.prompt_style,
                     "new_tokens": args.new_tokens, "engine": cfg.rollout_engine, "device": device})
    if args.train_steps:
        rows.append(train_row(args, overrides, rows[0]))
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "games.jsonl", "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print("| loop | shape | game | episodes | decisions | seconds | decisions/s | vs naive | same games |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['loop']} | {r['shape']} | {r['game']} | {r['episodes']} | {r['decisions']} | {r['seconds']:.2f} "
              f"| {r['decisions_per_s']:.1f} | {r['speedup']:.2f}x | {r['same_games']} |")
    if len(results) == 2 and not same:
        print("WARNING: the two loops played different games (the sampler's seeds depend on the batch)")
    return rows


if __name__ == "__main__":
    main()
