"""Add baseline rows to a kept run of smol.py (bench/results/runs/<run>) without retraining or re-scoring its team:

    python bench/add_baselines.py coder-humaneval-lr3e-5_s5 --methods sequential discussion --n 2

The baselines are the untrained base, so they need the run's config only: `kit baselines` runs them in a scratch
copy of the config (no checkpoint there, so the trained team is not sampled again), and their rows are merged into
the kept eval/baselines.json (a method already there is replaced). Same items, seed and sampling as the run's own
baselines, so the rows pool with the others in `smol.table`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KEPT = ROOT / "bench" / "results" / "runs"


def add(run: str, methods: list[str], n: int) -> list[dict]:
    from kit.analysis.baselines import compare

    kept = KEPT / run / "eval" / "baselines.json"
    rows = json.loads(kept.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / run
        scratch.mkdir()
        shutil.copyfile(KEPT / run / "config.json", scratch / "config.json")
        new = [r for r in compare(scratch, methods, n=n) if r["method"] in methods]
    rows = [r for r in rows if r["method"] not in methods] + new
    kept.write_text(json.dumps(rows, indent=1))
    return new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a folder of bench/results/runs")
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--n", type=int, default=2, help="joint actions per held-out item (the run's own: 2)")
    args = parser.parse_args()
    for row in add(args.run, args.methods, args.n):
        print(row["method"], f"reward {row['reward/mean']:.3f}", f"pass@1 {row['pass@1']:.3f}")


if __name__ == "__main__":
    main()
