"""The suite runs on every core (pytest.ini: `-n auto --dist loadfile`, pytest-xdist): each test file goes whole to
one worker process, so a file's module and session fixtures are built once.

Each worker computes with one thread, and so do the processes it starts (notebook kernels, torchrun, sandboxes):
torch's default is a thread per core in every process, and two workers that each ask for every core wait on each
other's threads, far slower than one thread each.
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker of `-n`; `-n 0` (one process, as tools/mutate.py runs)
    # keeps torch's default
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import torch

    torch.set_num_threads(1)
