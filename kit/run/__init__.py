"""The run: its config, presets, run directory, checkpoints and processes.

    config.py       TrainConfig (every field commented), file and key=value loading, validation (start here)
    presets.py      the presets as plain data: the fields each changes, and why
    rundir.py       the run directory: file names, .jsonl readers, open a run for analysis, the Drive mirror
    checkpoint.py   atomic save, keep-last-K, adapter history, newest complete checkpoint, exact resume
    distributed.py  data parallelism over items (accelerate launch / torchrun)

May import: kit.tasks, kit.engine, kit.judge, kit.maths, kit.env; not analysis or trainers.
"""
