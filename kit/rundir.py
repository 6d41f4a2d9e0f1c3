"""The run directory's files, read safely, and where a run lives (this disk or its Drive mirror).

    read_jsonl(path)                  metrics.jsonl / rollouts.jsonl rows; a torn last line is dropped, with a warning
    truncate_jsonl(path, step)        keep the rows of steps <= step (what a resume does)
    find_run(run_name, drive)         the run folder to analyse: local checkpoints/<run_name> or its Drive mirror

A runtime that dies while a line is being appended leaves a half-written last line. It belongs to a step after
the newest checkpoint, so a resume drops it anyway; readers skip it instead of failing on it. A broken line
anywhere else is real damage and is reported with its file and line number.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

CONFIG, METRICS, ROLLOUTS, BUDGET = "config.json", "metrics.jsonl", "rollouts.jsonl", "budget.json"
DRIVE_FOLDER = "magrpo-kit/runs"  # runs under MyDrive, as 01_train mirrors them
LOCAL_ROOT = "checkpoints"


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


def truncate_jsonl(path: str | Path, step: int) -> None:
    """Rewrite a log keeping the rows of steps <= `step` (and dropping a torn last line)."""
    path = Path(path)
    if path.exists():
        keep = [row for row in read_jsonl(path) if row["step"] <= step]
        path.write_text("".join(json.dumps(row) + "\n" for row in keep))


def newest_step(run_dir: str | Path) -> int:
    """The newest complete checkpoint's step, -1 when there is none (kept adapters count: see checkpoint.py)."""
    from kit.checkpoint import saved_steps

    return max(saved_steps(run_dir), default=-1)


def find_run(run_name: str, drive: str | Path | None = None, drive_folder: str = DRIVE_FOLDER,
             local_root: str | Path = LOCAL_ROOT) -> Path:
    """The folder of run `run_name` as 01_train made it: `<local_root>/<run_name>` on this disk, or
    `<drive>/<drive_folder>/<run_name>` on Drive (a new runtime has only the Drive copy). When both hold the
    run, the one with the newer checkpoint wins (this disk on a tie: it is faster)."""
    places = [Path(local_root) / run_name]
    if drive is not None:
        places.append(Path(drive) / drive_folder / run_name)
    found = [p for p in places if (p / CONFIG).exists()]
    if not found:
        hint = "" if drive is not None else " Google Drive is not mounted, so only this disk was searched."
        raise FileNotFoundError(
            f"no run named {run_name!r}: looked in {', '.join(str(p) for p in places)}.{hint} Train it in "
            "01_train with the same RUN_NAME (and DRIVE_FOLDER), or set RUN_DIR to the run's folder.")
    return max(found, key=lambda p: (newest_step(p), p == places[0]))
