"""Credit assignment on the Tiny Hanabi Suite with tabular policies: the model the `lenient` setting was chosen on.

    python bench/tabular_credit.py                      # games E C A B D F, seeds 100-115 (not the LLM bench's 0-15)
    python bench/tabular_credit.py --games E --seeds 0 1 2

Each player is a table of softmax logits (player 0: per card; player 1: per card and seen move), trained by policy
gradient as the kit's cross mode trains its LLM players (bench/coordination.py's `marginal` and `lenient`): per step
8 deals, G = 8 first moves per deal, each answered G times by player 1; player 1's advantage is its reply's return
minus the mean of the G replies to the same first move, over their std; player 0's sample k is scored by
(1 - kappa) mean + kappa max of its G continuations (kit/maths/magrpo.py `lenient`, `leniency_at`), minus the group mean,
over the group std. Plain gradient ascent on the logits at rate 0.5, 300 steps. The greedy joint policy's exact
return (kit/tasks/coordination.py `value`) is compared with the game's optimum.

What it shows (2026-11-25, seeds 100-115; E was read before any LLM run of `lenient`): on game E the mean keeps
every seed at the card-blind 8 and leniency takes every seed to 10; B and D reach their optimum on every seed
either way, A on 7 of 16 either way; on C neither reaches 2.5; on F leniency reaches it on 3-4 seeds against 1.
What it leaves out is what an LLM player adds: one network for every card, whose answers move together
(bench/README.md: in the LLM runs, player 0's greedy move never depends on its card).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kit.tasks.coordination import optimum, payoff_table, value  # noqa: E402
from kit.maths.magrpo import leniency_at, lenient  # noqa: E402

SETTINGS = {"mean": (0.0, 0), "max": (1.0, 0), "max -> mean over 150 steps": (1.0, 150)}  # (kappa, decay steps)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def train(game: str, seed: int, kappa: float, decay: int, steps: int = 300, G: int = 8, deals: int = 8,
          lr: float = 0.5) -> float:
    """The exact return of the greedy joint policy after `steps` steps."""
    P = payoff_table(game)
    C, A = P.shape[0], P.shape[-1]
    rng = np.random.default_rng(seed)
    l0, l1 = rng.normal(0, 0.1, (C, A)), rng.normal(0, 0.1, (C, A, A))
    eye = np.eye(A)
    for t in range(steps):
        k = leniency_at(kappa, decay, t)
        g0, g1 = np.zeros_like(l0), np.zeros_like(l1)
        for _ in range(deals):
            c0, c1 = rng.integers(C), rng.integers(C)
            p0 = softmax(l0[c0])
            a0 = rng.choice(A, G, p=p0)
            p1 = softmax(l1[c1, a0])  # (G, A): the reply policy to each first move
            a1 = np.array([rng.choice(A, G, p=p) for p in p1])  # (G first moves, G replies)
            r = P[c0, c1, a0[:, None], a1]
            judged = lenient(r, k)
            adv0 = (judged - judged.mean()) / (judged.std() + 1e-4)
            g0[c0] += (adv0[:, None] * (eye[a0] - p0)).sum(0) / G
            adv1 = (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)
            for j in range(G):
                g1[c1, a0[j]] += (adv1[j][:, None] * (eye[a1[j]] - p1[j])).sum(0) / G / G
        l0 += lr * g0 / deals
        l1 += lr * g1 / deals
    return value(P, eye[l0.argmax(-1)], eye[l1.argmax(-1)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", nargs="+", default=list("ECABDF"), choices=list("ABCDEF"))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 116)))
    args = parser.parse_args(argv)
    print("| game (optimum) | credit | seeds at the optimum | mean greedy return |\n|---|---|---|---|")
    for game in args.games:
        best = optimum(payoff_table(game))
        for name, (kappa, decay) in SETTINGS.items():
            got = [train(game, s, kappa, decay) for s in args.seeds]
            print(f"| {game} ({best:.4g}) | {name} | {sum(abs(v - best) < 1e-9 for v in got)}/{len(got)} | "
                  f"{np.mean(got):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
