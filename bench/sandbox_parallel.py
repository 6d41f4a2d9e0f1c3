"""Sandbox throughput: 256 small correct programs with 1 worker vs N workers.

    python bench/sandbox_parallel.py [--programs 256] [--workers 2] [--repeats 3]

Each program is a helper/main pair with 5 asserts, run by kit.sandbox.run_many (one `python -I` child per program,
with all of the sandbox's limits and the audit hook on). Prints one markdown row per worker count and the speed-up.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.sandbox import run_many  # noqa: E402


def programs(n: int) -> list[dict]:
    jobs = []
    for i in range(n):
        prog = (f"def aux(n):\n    return n * {i % 7 + 1}\n\n"
                f"def scaled_sum(xs):\n    return sum(aux(x) for x in xs)\n")
        tests = [f"assert scaled_sum({list(range(k))}) == {(i % 7 + 1) * sum(range(k))}" for k in range(5)]
        jobs.append({"program": prog, "tests": tests, "call_names": ["scaled_sum"]})
    return jobs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    jobs = programs(args.programs)
    print(f"{args.programs} programs x 5 asserts, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}\n")
    print("| workers | best of %d (s) | programs/s | all passed |" % args.repeats)
    print("|---|---|---|---|")
    best = {}
    for workers in (1, args.workers):
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            results = run_many(jobs, workers=workers)
            times.append(time.perf_counter() - t)
        best[workers] = min(times)
        ok = all(all(r.passed) for r in results)
        print(f"| {workers} | {best[workers]:.2f} | {args.programs / best[workers]:.1f} | {ok} |")
    print(f"\nspeed-up with {args.workers} workers: {best[1] / best[args.workers]:.2f}x")


if __name__ == "__main__":
    main()
