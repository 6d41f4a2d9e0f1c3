"""Which runtime writes a run's Drive folder: `runtime.json` there names the last one (a random id per process, its
host and pid, when), so two runtimes training one run into one folder (a second tab, a runtime not stopped) are
caught by the mirror (kit/run/mirror.py) and noted by a restore.

May import: the standard library.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path

RUNTIME = "runtime.json"  # in the mirror: which runtime wrote it last, and when
RECENT_S = 15 * 60  # a runtime that wrote the mirror this recently may still be training
RUNTIME_ID = uuid.uuid4().hex  # this process: every mirror it makes (a resume cell run twice) is the same runtime


def read_runtime(mirror_dir: str | Path) -> dict | None:
    """The mirror's runtime.json (None: none, or unreadable)."""
    try:
        return json.loads((Path(mirror_dir) / RUNTIME).read_text())
    except (OSError, ValueError):
        return None


def gone_here(runtime: dict) -> bool:
    """The runtime was a process of this machine that no longer runs (a kernel restarted on the same VM)."""
    if runtime.get("host") != socket.gethostname():
        return False
    try:
        pid = int(runtime.get("pid", 0))
        if pid <= 0:
            return True
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (OSError, ValueError, OverflowError):
        return True
    return False


def who(runtime: dict) -> str:
    ago = time.time() - runtime.get("time", 0)
    return (f"host {runtime.get('host', '?')}, process {runtime.get('pid', '?')}, last copy "
            f"{max(ago, 0) / 60:.0f} min ago")


def write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
