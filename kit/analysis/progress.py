"""What a long evaluation says while it runs: its estimate before, and its bars during.

    say_estimate(ctx, evaluations, n)      before: rows to sample and, from the run's own training speed, minutes
    for step in progress(steps, "checkpoints"): ...     a bar over checkpoints or methods, and decoding_bar under it
    with decoding_bar(): ...               a bar over the decoding steps of each generate call inside

On a CPU one evaluation of a 0.5B team is minutes of one batched generate; a bar that moves once per method or
checkpoint looks stuck, so the decoding bar moves with every token (kit.engine.batching.watching_decode).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np


def progress(things: list, unit: str):
    """The things (checkpoints, methods) one by one under a tqdm.auto bar over them (each is minutes on a CPU; its
    rate gives the estimate; shown for two or more) and, under it, `decoding_bar`."""
    from tqdm.auto import tqdm

    outer = tqdm(things, desc=unit, unit=unit.rstrip("s"), disable=len(things) < 2, leave=False)
    try:
        with decoding_bar():
            yield from outer
    finally:
        outer.close()


@contextlib.contextmanager
def decoding_bar():
    """Inside: a tqdm.auto bar over the decoding steps of the generate call running now
    (kit.engine.batching.watching_decode), so a cell shows that it works every few seconds, not once per method or
    checkpoint of several minutes."""
    from tqdm.auto import tqdm

    from kit.engine.batching import watching_decode

    bar = tqdm(total=0, desc="  decoding", unit="token", leave=False)

    def tick(step: int, total: int) -> None:
        if step == 1:  # a new generate call: its own max_new_tokens
            bar.reset(total=total)
        bar.update(1)

    try:
        with watching_decode(tick):
            yield
    finally:
        bar.close()


def generate_seconds_per_row(run_dir: str | Path) -> float | None:
    """Seconds this run's training spent generating one joint sample (all agents' completions of one item), the
    median over its steps: what an evaluation's estimate is built from. None without logged steps, or when the run
    trained on another kind of device than this one (a GPU run evaluated on a CPU, or the reverse)."""
    import torch

    from kit.run.rundir import ENVIRONMENT

    run = Path(run_dir)
    env = json.loads((run / ENVIRONMENT).read_text()) if (run / ENVIRONMENT).exists() else {}
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    if bool(env.get("gpu")) != torch.cuda.is_available():
        return None
    from kit.run.rundir import METRICS, read_jsonl

    times = [r["perf/generate_s"] for r in read_jsonl(run / METRICS) if r.get("perf/generate_s")] \
        if (run / METRICS).exists() else []
    rows = config.get("batch_size", 1) * config.get("num_generations", 1) * config.get("num_turns", 1)
    return float(np.median(times)) / max(rows, 1) if times else None


def say_estimate(ctx, evaluations: int, n: int, log=print) -> None:
    """Before long work on a real model: how many rows it samples and, from this run's own training speed on the
    same kind of device, about how long. Said only when it may take more than a minute."""
    rows = len(ctx.items) * n * evaluations
    per_row = generate_seconds_per_row(ctx.run_dir)
    if ctx.cfg.model_name == "tiny" or not per_row or per_row * rows < 60:
        return
    log(f"[kit] {evaluations} evaluation(s) x {len(ctx.items)} items x {n} samples = {rows} joint samples of "
        f"{ctx.cfg.max_new_tokens} tokens; at this run's training speed about {per_row * rows / 60:.0f} min "
        "(a lower N is faster; pass@k needs k <= N)")
