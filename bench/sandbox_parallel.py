"""Sandbox throughput: 256 small correct programs with 1 worker vs N workers.

    python bench/sandbox_parallel.py [--programs 256] [--workers 2] [--repeats 3] [--layers]

Each program is a helper/main pair with 5 asserts, run by kit.sandbox.sandbox.run_many (a runner and a checker process per
program, every isolation layer this machine allows). Prints one markdown row per worker count and the speed-up,
and the CPU seconds per program (this process and its children: what bounds throughput on a busy machine).
`--layers` adds rows at N workers with the namespaces, then also the separate uid, turned off, to show what each
layer costs.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kit.sandbox import sandbox, isolation as sandbox_isolation  # noqa: E402
from kit.sandbox.sandbox import run_many  # noqa: E402


def programs(n: int) -> list[dict]:
    jobs = []
    for i in range(n):
        prog = (f"def aux(n):\n    return n * {i % 7 + 1}\n\n"
                f"def scaled_sum(xs):\n    return sum(aux(x) for x in xs)\n")
        tests = [f"assert scaled_sum({list(range(k))}) == {(i % 7 + 1) * sum(range(k))}" for k in range(5)]
        jobs.append({"program": prog, "tests": tests, "call_names": ["scaled_sum"]})
    return jobs


def timed(jobs, workers, repeats):
    """(best wall seconds, CPU seconds per program over all repeats, every test passed)."""
    times, ok = [], True
    t0 = os.times()
    for _ in range(repeats):
        t = time.perf_counter()
        results = run_many(jobs, workers=workers)
        times.append(time.perf_counter() - t)
        ok = ok and all(all(r.passed) for r in results)
    t1 = os.times()
    cpu = sum(t1[:4]) - sum(t0[:4])  # user + system, this process and its children
    return min(times), cpu / (repeats * len(jobs)), ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", action="store_true", help="also time with layers turned off")
    args = ap.parse_args()
    jobs = programs(args.programs)
    iso = sandbox.isolation()
    print(f"{args.programs} programs x 5 asserts, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(sandbox.layers() + "\n")
    print("| layers | workers | best of %d (s) | programs/s | CPU ms per program | all passed |" % args.repeats)
    print("|---|---|---|---|---|---|")
    best = {}
    for workers in (1, args.workers):
        best[workers], cpu, ok = timed(jobs, workers, args.repeats)
        print(f"| all | {workers} | {best[workers]:.2f} | {args.programs / best[workers]:.1f} | {cpu * 1000:.1f} | {ok} |")
    if args.layers:
        for name, less in (("no namespaces", sandbox.Isolation(iso.python, iso.drop_user, (), iso.no_new_privs,
                                                               iso.prlimit)),
                           ("no namespaces, no own uid", sandbox.Isolation(iso.python, False))):
            sandbox_isolation._isolation = less
            t, cpu, ok = timed(jobs, args.workers, args.repeats)
            print(f"| {name} | {args.workers} | {t:.2f} | {args.programs / t:.1f} | {cpu * 1000:.1f} | {ok} |")
        sandbox_isolation._isolation = iso
    print(f"\nspeed-up with {args.workers} workers: {best[1] / best[args.workers]:.2f}x")


if __name__ == "__main__":
    main()
