"""The run: its config, presets, run directory, checkpoints and processes.

    fields.py       TrainConfig: every field with its default and one comment, the choices, the config's files
    config.py       a preset, a file and overrides made into one validated config; resume checks (start here)
    presets.py      the presets as plain data: the fields each changes, and why
    rundir.py       the run directory: file names, .jsonl readers, open a run for analysis, find a run
    mirror.py       the Drive mirror: copies after each save in the background, restore after a disconnect
    runtimes.py     which runtime writes a Drive folder (runtime.json): two runtimes on one run are caught
    checkpoint.py   atomic save, keep-last-K, adapter history, newest complete checkpoint, exact resume
    distributed.py  data parallelism over items (accelerate launch / torchrun)

May import: kit.tasks, kit.engine, kit.judge, kit.maths, kit.env; not analysis or trainers.
"""
