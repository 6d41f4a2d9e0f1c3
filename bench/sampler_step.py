"""One decoding step of the seeded sampler at a real vocabulary size: the warp and the noise, before and after issue 77.

    python bench/sampler_step.py --rows 8 256          # appends rows to bench/results/sampler_step.md

`before`: what SeededSampling computed until issue 77 (transformers' TemperatureLogitsWarper, TopKLogitsWarper and
TopPLogitsWarper, which sorts the vocabulary, then every token's noise hashed); `after`: kit.engine.sampling's
SeededSampling (the nucleus among the largest scores, noise only at the kept tokens). Logits shaped like a language
model's (a head of 40 plausible tokens, a long tail; `--flat` of the rows nearly uniform, whose nucleus is thousands
of tokens), 151,936 tokens (Qwen2.5's), temperature 0.7, top_p 0.9. Each
time is the best of `--repeats` after a warm-up; `same` checks that both pick the same tokens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def before(seeds, step, logits, temperature, top_p):
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    from kit.engine.sampling import seeded_gumbel

    scores = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits)).float()
    scores.log_softmax(-1)  # the sampler's log-probs, kept per step
    return scores + seeded_gumbel(seeds, step, scores.shape[-1])


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 256])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--flat", type=float, default=0.1, help="share of rows with a flat distribution (a wide nucleus)")
    args = ap.parse_args()

    from kit.engine.sampling import SeededSampling, row_seed

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    header = ("| commit | threads | rows x vocabulary | flat rows | before: sort + every token hashed (ms) | after (ms) | "
              "speed-up | same tokens |\n|---|---|---|---|---|---|---|---|")
    print(header)
    lines = []
    for rows in args.rows:
        gen = torch.Generator().manual_seed(3)
        logits = torch.randn(rows, args.vocab, generator=gen) * 2
        logits[:, :40] += torch.randn(rows, 40, generator=gen) * 3 + 12
        flat = int(round(args.flat * rows))
        logits[:flat] = torch.randn(flat, args.vocab, generator=gen) * 0.05  # uncertain rows: thousands in the nucleus
        seeds = torch.tensor([row_seed(5, ("bench",), r) for r in range(rows)])
        ids = torch.zeros(rows, 4, dtype=torch.long)
        t_old, old = best(lambda: before(seeds, 0, logits, 0.7, 0.9), args.repeats)
        t_new, new = best(lambda: SeededSampling(seeds, 0.7, 0.9, 0)(ids, logits), args.repeats)
        same = torch.equal(old.argmax(-1), new.argmax(-1))
        line = (f"| {commit} | {torch.get_num_threads()} | {rows} x {args.vocab:,} | {flat} | {t_old * 1000:.0f} | "
                f"{t_new * 1000:.0f} | {t_old / t_new:.1f}x | {same} |")
        print(line, flush=True)
        lines.append(line)
    out = ROOT / "bench" / "results" / "sampler_step.md"
    new_file = not out.exists()
    with open(out, "a") as f:
        f.write((header + "\n" if new_file else "") + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
