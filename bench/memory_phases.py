"""Where a training step's resident memory peaks: one step of a run, the process's RSS sampled every 20 ms and
charged to the phase running then (generation with its tool rounds, scoring, the update's forwards, its backwards,
the optimizer step).

    python bench/memory_phases.py --preset coder_code --seed 25 --set "task_args={dataset: coop, prefill: \
        discussion, code_after_tools: true}" environment=kit.tasks.environments:Board max_new_tokens=480 \
        max_tool_calls=2 micro_batch_size=1

Prints one line per phase: its peak RSS (GB), the RSS when it started, and its calls; and the step's rows' lengths.
The run goes to a scratch folder (checkpoints/memory_phases), removed first.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * 4096 / 1e9


class Phases:
    """A stack of named phases; a sampler thread charges the RSS it reads to the innermost phase running."""

    def __init__(self):
        self.stack, self.peak, self.start, self.calls = ["other"], {}, {}, {}
        self.done, self.trace, self.t0 = False, [], time.time()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self.done:
            name, now = self.stack[-1], rss_gb()
            self.peak[name] = max(self.peak.get(name, 0.0), now)
            if not self.trace or self.trace[-1][1:] != (name, round(now, 1)):
                self.trace.append((round(time.time() - self.t0, 1), name, round(now, 1)))
            time.sleep(0.02)

    def wrap(self, owner, attr: str, name: str):
        fn = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            self.start.setdefault(name, rss_gb())
            self.calls[name] = self.calls.get(name, 0) + 1
            self.stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                now = rss_gb()
                self.peak[name] = max(self.peak.get(name, 0.0), now)
                self.stack.pop()

        setattr(owner, attr, wrapped)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="coder_code")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--set", nargs="*", default=[], dest="extra")
    args = ap.parse_args()

    import torch

    import kit.engine.tools as tools
    import kit.trainers.trainer as trainer_mod
    from kit.run.config import load_config

    phases = Phases()
    run_dir = ROOT / "checkpoints" / "memory_phases"
    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(args.preset, overrides=[f"seed={args.seed}", f"run_dir={run_dir}", "progress=false",
                                              "num_steps=1", "eval_every=0", "save_every=0", *args.extra])
    print(f"before the trainer: {rss_gb():.2f} GB", flush=True)
    trainer = trainer_mod.Trainer(cfg)
    print(f"trainer built: {rss_gb():.2f} GB", flush=True)
    phases.wrap(tools, "act", "generate (tool rounds)")
    phases.wrap(trainer_mod.Trainer, "score", "score")
    phases.wrap(trainer_mod.Trainer, "update", "update")
    phases.wrap(trainer_mod, "completion_logprobs", "update: forward")
    phases.wrap(trainer_mod.Trainer, "_eval_logprobs", "update: no-grad forward")
    phases.wrap(torch.Tensor, "backward", "update: backward")
    phases.wrap(trainer_mod.Trainer, "_step", "update: optimizer step")
    lengths = []
    orig_update = trainer_mod.Trainer.update

    def update(self, levels):
        for level in levels:
            for seg in level.rollout.segments:
                lengths.append((seg.input_ids.shape[0], seg.prompt_len, seg.input_ids.shape[1]))
        return orig_update(self, levels)

    trainer_mod.Trainer.update = update
    t0 = time.time()
    trainer.train()
    phases.done = True
    print(f"step: {time.time() - t0:.0f} s; segments (rows, prompt length, row length): {lengths}")
    print("| phase | calls | RSS at its first start (GB) | peak RSS (GB) |")
    print("|---|---|---|---|")
    for name in phases.peak:
        print(f"| {name} | {phases.calls.get(name, '')} | {phases.start.get(name, float('nan')):.2f} | "
              f"{phases.peak[name]:.2f} |")
    (run_dir / "rss_trace.tsv").write_text("".join(f"{t}\t{n}\t{r}\n" for t, n, r in phases.trace))
    trainer.close()


if __name__ == "__main__":
    main()
