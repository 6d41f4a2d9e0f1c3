"""Data parallelism over items, for runs launched on several processes by accelerate (or torchrun).

    accelerate launch --multi_gpu --num_processes 2 -m kit train --preset colab_a100   # two GPUs, same config
    torchrun --nproc_per_node 2 -m kit train --preset tiny_cpu                           # two CPU processes (gloo)

Each process holds the whole team (base + adapters) on its own device and takes its share of every step's items
(`batch_size` is the global batch: process r takes items r, r + P, r + 2P, ...). It samples and scores its share;
each adapter's gradients are summed across processes (the loss is already weighted by the global row or token
count) before its optimizer step, so every process keeps identical adapters. Samples are seeded by (seed, step,
item index in the global batch, ...) (kit/engine/sampling.py), so 1 and 2 processes produce the same rollouts. The main
process alone writes files (metrics and rollouts gathered from all, checkpoints, the Drive mirror); the others
only compute.

With one process (the usual Colab run) every method here is a no-op and nothing is initialised.
"""

from __future__ import annotations

import atexit
import os

import torch


class Dist:
    """This process's place in the run: rank, number of processes, and the few collectives the trainer needs."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.world > 1 and not torch.distributed.is_initialized():
            from accelerate import PartialState

            PartialState()  # the process group: nccl on CUDA, gloo on a CPU (from the launcher's environment)
            # a process group left to the interpreter's teardown can abort the exit ("terminate called without an
            # active exception"): take it down first
            atexit.register(self.close)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, n: int) -> list[int]:
        """The indices of this process's items among n."""
        return list(range(self.rank, n, self.world))

    def device(self, device: str) -> str:
        """`device=auto` on several GPUs: this process's own GPU."""
        if self.world > 1 and device == "auto" and torch.cuda.is_available():
            return f"cuda:{self.local_rank}"
        return device

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Sum tensors across processes, in place (one collective for the lot)."""
        if self.world == 1 or not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        torch.distributed.all_reduce(flat)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64)
        if torch.distributed.get_backend() == "nccl":
            t = t.cuda()
        torch.distributed.all_reduce(t)
        return t.cpu().tolist()

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order (on every process)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Destroy the process group (at exit; nothing to do with one process)."""
        if self.world > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
