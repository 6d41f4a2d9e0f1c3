"""The run directory's files, read safely, and where a run lives (this disk or its Drive mirror, kit/run/mirror.py).

    read_jsonl(path)                  metrics.jsonl / rollouts.jsonl rows; a torn last line is dropped, with a warning
    truncate_jsonl(path, step)        keep the rows of steps <= step (what a resume does)
    open_run(run_dir)                 a run's config, task and reward model: how the trainer (from_run), evaluation,
                                      schemes and the explorer open a run
    find_run(run_name, drive)         the run folder to analyse: local checkpoints/<run_name> or its Drive mirror
    append_jsonl(path, rows)          add a step's rows in one write that a Ctrl-C / Colab stop cannot cut short

A runtime that dies while a line is being appended leaves a half-written last line. It belongs to a step after
the newest checkpoint, so a resume drops it anyway; readers skip it instead of failing on it. A broken line
anywhere else is real damage and is reported with its file and line number.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import warnings
from pathlib import Path

CONFIG, METRICS, ROLLOUTS, BUDGET = "config.json", "metrics.jsonl", "rollouts.jsonl", "budget.json"
DRIVE_FOLDER = "magrpo-kit/runs"  # runs under MyDrive, as 01_train mirrors them
LOCAL_ROOT = "checkpoints"
COLAB_ROOT = "/content/magrpo-kit/checkpoints"  # where 01's install cell (cwd: the checkout) has always put runs


def runs_root() -> Path:
    """Where the notebooks keep runs on this disk, as an absolute path: in Colab always COLAB_ROOT (after a kernel
    restart with the install cell skipped the working folder is /content, and a relative `checkpoints/` would be a
    second, empty run folder); elsewhere `checkpoints/` of the working folder, resolved now."""
    from kit.env import in_colab

    return Path(COLAB_ROOT) if in_colab() else Path(LOCAL_ROOT).absolute()
ENVIRONMENT = "environment.json"  # versions, GPU, peak memory (kit/analysis/runinfo.py), for the report
RM_PAIRS = "rm_pairs.jsonl"  # marlhf: each fit's pairs, their task rewards and the reward model's scores
STEP_LOGS = (METRICS, ROLLOUTS, RM_PAIRS)  # rows by step: a resume drops those after its checkpoint
_LOG_FILES = (CONFIG, *STEP_LOGS, BUDGET, ENVIRONMENT)


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON rows of a .jsonl file. A torn (half-written) last line is dropped with a warning."""
    path = Path(path)
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            if any(rest.strip() for rest in lines[number:]):
                raise ValueError(f"{path} line {number} is not valid JSON ({err.msg}); only a torn last line "
                                 "is skipped. Repair or delete that line.") from None
            warnings.warn(f"{path}: dropped a half-written last line (the runtime stopped while writing it)",
                          RuntimeWarning, stacklevel=2)
    return rows


@contextlib.contextmanager
def interrupt_deferred():
    """Hold back a Ctrl-C (a Colab or Jupyter stop: SIGINT) until the block is done, then raise it. Outside the
    main thread, where no signal handler can be set, the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # honoured now, by the handler that was there before


def append_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Append `rows` as JSON lines in one write, with an interrupt held back until the write is done: a step's
    rows reach the file whole (a runtime that dies outright can still tear the last line: see read_jsonl)."""
    if not rows:
        return
    with interrupt_deferred():
        text = "".join(json.dumps(row) + "\n" for row in rows)
        with open(path, "a") as f:
            f.write(text)


def truncate_jsonl(path: str | Path, step: int) -> None:
    """Rewrite a log keeping the rows of steps <= `step` (and dropping a torn last line)."""
    path = Path(path)
    if path.exists():
        keep = [row for row in read_jsonl(path) if row["step"] <= step]
        path.write_text("".join(json.dumps(row) + "\n" for row in keep))


def dropped(run_dir, step: int) -> str:
    """What a resume from checkpoint `step` redoes: the logged steps after it (a kill or a stop between saves),
    which the trainer drops from the logs and trains again; empty when there are none."""
    path = Path(run_dir) / METRICS
    later = sorted({r["step"] for r in read_jsonl(path) if r.get("step", 0) > step}) if path.exists() else []
    if not later:
        return ""
    if len(later) == 1:
        return f"; the logged step after it (step {later[0]}) is dropped from the logs and will be trained again"
    return (f"; the {len(later)} logged steps after it (steps {later[0]}-{later[-1]}) are dropped from the logs and "
            "will be trained again")


class Run:
    """A run directory opened for analysis: its config, and (built on first use) its task and reward model."""

    def __init__(self, run_dir: str | Path, overrides: list[str] = ()):
        from kit.run.config import load_config

        self.path = Path(run_dir)
        if not (self.path / CONFIG).exists():
            raise FileNotFoundError(f"{self.path} has no {CONFIG}: is it a run directory made by `python -m kit "
                                    "train` or 01_train?")
        self.cfg = load_config(path=self.path / CONFIG, overrides=list(overrides), saved=True)
        self._task = None

    @property
    def task(self):
        if self._task is None:
            from kit.tasks import task_for

            self._task = task_for(self.cfg)
        return self._task

    def reward_model(self, reward_funcs=(), log=print):
        """The reward the run trained with (kit.tasks.rewards.reward_model_for). Reward functions passed to the Trainer
        in Python are not in config.json: pass the same ones here."""
        from kit.tasks.rewards import reward_model_for

        try:
            return reward_model_for(self.cfg, self.task, reward_funcs, log=log)
        except ValueError as err:
            if "reward_weights" not in str(err):
                raise
            raise ValueError(f"{err}. The run at {self.path} was trained with reward functions passed in Python; "
                             "pass the same ones (reward_funcs=[...]) to score it the same way") from None


def open_run(run_dir: str | Path, overrides: list[str] = ()) -> Run:
    """The run in `run_dir` as it was saved (`overrides`, "key=value" strings, change fields on the way in)."""
    return Run(run_dir, overrides)


def newest_step(run_dir: str | Path) -> int:
    """The newest complete checkpoint's step, -1 when there is none (kept adapters count: see checkpoint.py)."""
    from kit.run.checkpoint import saved_steps

    return max(saved_steps(run_dir), default=-1)


def find_run(run_name: str, drive: str | Path | None = None, drive_folder: str = DRIVE_FOLDER,
             local_root: str | Path | None = None) -> Path:
    """The folder of run `run_name` as 01_train made it: `<local_root>/<run_name>` on this disk, or
    `<drive>/<drive_folder>/<run_name>` on Drive (a new runtime has only the Drive copy). When both hold the
    run, the one with the newer checkpoint wins (this disk on a tie: it is faster)."""
    places = [Path(local_root or runs_root()) / run_name]
    if drive is not None:
        places.append(Path(drive) / drive_folder / run_name)
    found = [p for p in places if (p / CONFIG).exists()]
    if not found:
        hint = "" if drive is not None else " Google Drive is not mounted, so only this disk was searched."
        raise FileNotFoundError(
            f"no run named {run_name!r}: looked in {', '.join(str(p) for p in places)}.{hint} Train it in "
            "01_train with the same RUN_NAME (and DRIVE_FOLDER), or set RUN_DIR to the run's folder.")
    return max(found, key=lambda p: (newest_step(p), p == places[0]))
