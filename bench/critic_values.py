"""What a trained critic learned on Tiny Hanabi game E: its Q per card and move, beside the policies it trained.

    python bench/critic_values.py                          # maac_q_cf, seed 0, 300 steps (bench/coordination.py's)
    python bench/critic_values.py --method iac --seed 1

Trains one method of bench/coordination.py (same preset, overrides and steps) and then prints, for every deal
(c0, c1) of game E: the greedy team's moves, and the MAAC-q critic's Q at player 0's decision (every first move a0,
with both players' observations, as the critic reads them in training) against the true expected payoff of a0 when
player 1 answers with its greedy policy; then Q at player 1's decision (every a0, a1) against the payoff table.
For a v critic (iac, maac_v) it prints V per observation instead. Results are printed only (a diagnosis, not a
table row); the bench/README.md section quotes one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main(argv=None) -> int:
    import torch

    from coordination import METHODS
    from kit.run.config import load_config
    from kit.tasks.coordination import exact_eval, observations, table_of
    from kit.trainers.critic import joint_prompt
    from kit.trainers.game_trainer import GameTrainer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="maac_q_cf", choices=["iac", "maac_v", "maac_q_cf"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny_hanabi", overrides=[
            f"run_dir={Path(tmp) / 'run'}", f"seed={args.seed}", f"num_steps={args.steps}", "eval_every=0",
            "save_every=0", "progress=false", "log_rollouts=false",
            "task_args={game: tiny_hanabi, prompt_style: compact, suite: E}", *METHODS[args.method]])
        trainer = GameTrainer(cfg, log=lambda *_: None)
        trainer.train()
        task, sampler, algo = trainer.task, trainer.sampler, trainer.algorithm
        table = table_of(task.game)
        C, A = table.shape[0], table.shape[-1]
        first, second = observations(task, table)
        greedy = []
        for player, eps in ((0, first), (1, second)):
            ro = sampler.sample([(player, task.prompt(ep, player)) for ep in eps], 1, sampler.greedy)
            greedy.append([task.parse(ep, ro.texts[k][0]) for k, ep in enumerate(eps)])
        p0, p1 = greedy[0], np.array(greedy[1], dtype=object).reshape(C, A)
        print(f"{args.method} seed {args.seed}, {args.steps} steps: exact greedy return "
              f"{exact_eval(sampler, task, sampled=False)['eval/exact_greedy']:.3f} (optimum 10)")
        print(f"greedy player 0 (card -> move): {dict(enumerate(p0))}; player 1 ((card, seen move) -> move): "
              f"{ {(c, a): p1[c, a] for c in range(C) for a in range(A)} }")

        def state(c0, c1, *moves):
            ep = task.reset(0)
            ep.state = task.game.new_initial_state()
            for a in (c0, c1, *moves):
                ep.state.apply_action(a)
            return ep

        def score(name, texts):
            return algo.values(name, texts)

        q = cfg.critic_type == "q"
        for c0 in range(C):
            for c1 in range(C):
                ep = state(c0, c1)
                obs = [task.prompt(ep, i) for i in range(2)]
                if algo.name == "maac":
                    base = joint_prompt(obs)
                    texts = [base + f"\n[Agent 0 move] {a + 1}" for a in range(A)] if q else [base]
                    vals = score("critic", texts)
                else:
                    vals = score("critic_0", [algo.fmt(obs[0])])
                truth = [table[c0, c1, a, p1[c1, a]] if p1[c1, a] is not None else np.nan for a in range(A)]
                print(f"deal c0={c0} c1={c1}: decision 0 critic {np.round(vals, 2).tolist()}  payoff of a0 given "
                      f"player 1's greedy answer {truth}  (greedy a0 = {p0[c0]})")
                for a0 in range(A):
                    ep1 = state(c0, c1, a0)
                    obs1 = [task.prompt(ep1, i) for i in range(2)]
                    if algo.name == "maac":
                        base = joint_prompt(obs1)
                        texts = [base + f"\n[Agent 1 move] {a + 1}" for a in range(A)] if q else [base]
                        vals1 = score("critic", texts)
                    else:
                        vals1 = score("critic_1", [algo.fmt(obs1[1])])
                    print(f"    a0={a0}: decision 1 critic {np.round(vals1, 2).tolist()}  payoff "
                          f"{table[c0, c1, a0].tolist()}  (greedy a1 = {p1[c1, a0]})")
        trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
