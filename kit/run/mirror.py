"""The Drive mirror of a run directory: copied there after each save, brought back after a disconnect.

    Mirror(run_dir, mirror_dir)       copies checkpoints and logs to Drive after each save, in the background; a
                                      failed copy is said loudly once, with its reason in words (Drive full,
                                      read-only, ...), and retried at the next save
    restore(mirror_dir, run_dir)      brings the newest complete checkpoint back after a disconnect

Why a mirror and not training straight on Drive: Drive is slow and can drop writes when a runtime dies. The
trainer writes each checkpoint locally (atomically), then the mirror copies it to Drive under a temporary name
and renames it only when the copy is whole, so a half-copied checkpoint never looks complete on Drive. The logs
follow the checkpoints, so Drive's logs always reach its newest checkpoint. A path under Colab's Drive mount that is
not a mount point (Drive unmounted) is neither written nor read.

A Drive slower than `save_every` steps: while a checkpoint is being copied, the trainer may prune it (to history/,
or away). Pruning renames a folder in one step (kit/run/checkpoint.py), so the copy either read it whole or finds it
gone; a checkpoint gone from under the copy was superseded by a newer one, which the next copy takes, and is
skipped, not reported as a failure. A copy's temporary `.partial` folder is removed when it fails, and any left
behind (a runtime that died mid-copy) is removed by the next copy: they would fill the user's Drive.

Two runtimes training one run into one Drive folder (a second tab, a runtime not stopped) overwrite each other's
checkpoints. Each copy writes `runtime.json` (a random id for this process, its host, when) into the mirror; a copy
that finds another id there after writing its own knows a second runtime is writing the folder and says so loudly,
and `restore` says when the folder was written by another runtime minutes ago.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from kit.run import runtimes
from kit.run.rundir import _LOG_FILES, METRICS, read_jsonl
from kit.run.runtimes import RECENT_S, RUNTIME_ID, gone_here, read_runtime, who


class Mirror:
    """Copy a run directory's logs and complete checkpoints to another folder (Drive) in a background thread.

    A failed copy never stops training: `check()` (the trainer calls it every step, in the main thread, so the
    message lands in the training cell) says it loudly the first time, with the reason and the newest step that
    is safe on Drive; the next `push()` copies everything that is still missing, so a retry is automatic."""

    def __init__(self, run_dir: str | Path, mirror_dir: str | Path, keep_last: int = 3, keep_history: int = 0,
                 log=print, training: bool = True):
        self.run_dir, self.mirror_dir = Path(run_dir), Path(mirror_dir)
        self.training = training  # a training run's copies (a failure: training goes on), or a finished run's
        self.keep_last, self.keep_history = keep_last, keep_history
        self.log = log
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kit-mirror")  # one copy at a time, in order
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self.last_good: int | None = None  # the newest checkpoint step a whole copy put on the mirror
        self.error: BaseException | None = None  # the last copy's error; None once a copy succeeds again
        self._outcomes: list[BaseException | None] = []  # finished copies not yet reported (kept until check())
        self._warned = self._closed = False
        self._failures = 0  # failed copies in a row
        self.runtime = {"id": RUNTIME_ID, "host": socket.gethostname(), "pid": os.getpid()}
        self._claimed = False  # runtime.json written by this mirror at least once
        self._others: list[dict] = []  # other runtimes found writing the mirror, to be said by check()
        self._said_others: set[str] = set()

    def push(self) -> Future:
        """Queue a copy of everything new; returns at once. After close() too (the training cell run again once
        Drive is back): the mirror opens again, so a Drive that missed the end of the run catches up."""
        self.check()
        if self._closed:
            self._pool, self._closed = ThreadPoolExecutor(1, thread_name_prefix="kit-mirror"), False
        future = self._pool.submit(self._copy)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]
        return future

    def check(self) -> None:
        """Report copies that finished since the last call: the first failure loudly, later ones in a line each,
        and a recovery. Never raises: a failing Drive must not cost the run."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
            others, self._others = self._others, []
        for other in others:
            if other["id"] not in self._said_others:
                self._said_others.add(other["id"])
                self.log("!" * 100 + f"\n[kit] WARNING: ANOTHER RUNTIME is writing this run to {self.mirror_dir} "
                         f"({who(other)}). Two runtimes training one run overwrite each other's checkpoints and "
                         "logs on Drive.\n      Stop one of them (Colab: Runtime > Manage sessions), or give this "
                         "one another RUN_NAME.\n" + "!" * 100)
        for err in outcomes:
            if err is None:
                if self.error is not None:
                    self.log(f"[kit] the Drive backup works again: {self.status()}")
                self.error, self._failures = None, 0
                continue
            self.error, self._failures = err, self._failures + 1
            why = reason(err)
            if self._failures > 1:  # said already: a short line at the 2nd, 4th, 8th ... failure in a row
                if self._failures & (self._failures - 1) == 0:
                    self.log(f"[kit] the Drive backup is still failing ({why}; {self._failures} copies in a row); "
                             f"{self.status()}")
                continue
            if self._warned:  # it had recovered since the first warning
                self.log(f"[kit] WARNING: the Drive backup failed again ({why}); {self.status()}")
                continue
            self._warned = True
            then = ("Training goes on and the copy is retried at the next save" if self.training else
                    "The run has ended: run the training cell again once Drive is back to copy what it lacks")
            self.log("!" * 100 + f"\n[kit] WARNING: the backup to {self.mirror_dir} FAILED: {why}\n"
                     f"      {then}; {self.status()}. Newer "
                     f"checkpoints are only on this runtime's disk ({self.run_dir}) and are lost if it "
                     "disconnects.\n      Check that Drive is mounted and has space, and that the folder is "
                     "writable.\n" + "!" * 100)

    def status(self) -> str:
        """'last good backup: step N (<mirror>)', or that none was made."""
        if self.last_good is None:
            return f"last good backup: none yet ({self.mirror_dir})"
        return f"last good backup: step {self.last_good} ({self.mirror_dir})"

    def flush(self) -> None:
        """Wait for queued copies, saying so when one is still running, and report how they went (see check). A
        stop (KeyboardInterrupt) while waiting leaves the copies queued and running: the next flush waits for them."""
        with self._lock:
            pending = list(self._pending)
        if any(not f.done() for f in pending):
            from kit.run.checkpoint import complete_checkpoints

            newest = complete_checkpoints(self.run_dir)
            what = f"the checkpoint of step {_step_of(newest[0])} and the logs" if newest else "the logs"
            self.log(f"[kit] waiting for the copy to Drive to finish ({what}, to {self.mirror_dir}); a slow Drive "
                     "can take minutes. A stop here loses nothing: the copy goes on, and running this cell again "
                     "waits for it and says how it went")
        for f in pending:
            try:
                f.result()
            except Exception:  # recorded by _copy, said by check()
                pass
            with self._lock:
                self._pending = [p for p in self._pending if p is not f]
        self.check()

    def close(self) -> str:
        """Wait for the last copy; returns status(). Closing twice is harmless; closing again after a stop during
        the wait waits for the copies still running."""
        if not self._closed:
            self.flush()
            self._closed = True
            self._pool.shutdown(wait=True)
            if self.error is not None:
                self.log(f"[kit] WARNING: the last backup to Drive FAILED ({reason(self.error)}); {self.status()}. "
                         f"The newest checkpoint is only in {self.run_dir}.")
        return self.status()

    def _copy(self) -> None:
        try:
            self._copy_all()
        except Exception as err:  # recorded here, before the future is done, so a flush() never misses it
            with self._lock:
                self._outcomes.append(err)
            raise
        finally:
            self._count_good()
        with self._lock:
            self._outcomes.append(None)

    def _count_good(self) -> None:
        """last_good: the newest checkpoint whole on the mirror that its logs there reach (a checkpoint that got
        through counts even when a later part of the copy failed). Never raises: it runs after a failure too."""
        try:
            require_mounted(self.mirror_dir)
            trusted = restorable(self.mirror_dir)
        except Exception:
            return
        if trusted:
            self.last_good = max(self.last_good or -1, _step_of(trusted[0]))

    def _copy_all(self) -> None:
        """Checkpoints first, then the logs: logs copied after a checkpoint reach its step (it was logged before
        it was saved), so a copy cut short anywhere never leaves Drive a checkpoint its logs do not reach (a resume
        from it would leave a hole in metrics.jsonl for good). The mirror's pruning runs even when a copy fails,
        and makes room first: a full Drive gets space back."""
        from kit.run.checkpoint import HISTORY, complete_checkpoints, prune

        require_mounted(self.mirror_dir)  # else the copy would make a plain folder of this disk at Drive's path
        self.mirror_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # a full Drive: the marker must not stop the cleanup and pruning below
            self._claim()
        remove_partials(self.mirror_dir)  # one copy at a time: any .partial here is a dead copy's
        local = complete_checkpoints(self.run_dir)  # newest first: the one a slow Drive must not miss
        on_mirror = complete_checkpoints(self.mirror_dir)
        if local and on_mirror and _step_of(local[0]) > _step_of(on_mirror[0]):  # room for the new one first
            prune(self.mirror_dir, max(self.keep_last - 1, 1), self.keep_history)
        try:
            for ckpt in local:
                _copy_tree(ckpt, self.mirror_dir / "ckpt" / ckpt.name)
            for kept in reversed(complete_checkpoints(self.run_dir, HISTORY)):
                _copy_tree(kept, self.mirror_dir / HISTORY / kept.name)
            for name in _LOG_FILES:
                _copy_file(self.run_dir / name, self.mirror_dir / name)
            if (self.run_dir / "eval").is_dir():
                for f in (self.run_dir / "eval").iterdir():
                    if f.is_file():
                        _copy_file(f, self.mirror_dir / "eval" / f.name)
        finally:
            with contextlib.suppress(OSError):  # never hides the copy's own error; retried at the next copy
                prune(self.mirror_dir, self.keep_last, self.keep_history)


    def _claim(self) -> None:
        """Write runtime.json; another runtime's id there after this mirror wrote its own is a second writer."""
        found = read_runtime(self.mirror_dir)
        if self._claimed and found and found.get("id") != self.runtime["id"]:
            with self._lock:
                self._others.append(found)
        runtimes.write_json(self.mirror_dir / runtimes.RUNTIME, {**self.runtime, "time": time.time()})
        self._claimed = True


def behind(run_dir: str | Path, mirror_dir: str | Path) -> str | None:
    """None when the mirror holds this run's newest checkpoint and its logs reach this run's; else what it lacks,
    in words ("Drive's copy stops at step 20; this runtime has step 40")."""
    from kit.run.checkpoint import complete_checkpoints

    local = complete_checkpoints(run_dir)
    here = _step_of(local[0]) if local else -1
    there = restorable(mirror_dir)
    on_drive = _step_of(there[0]) if there else -1
    logs_here, logs_there = logged_through(run_dir) or 0, logged_through(mirror_dir) or 0
    if here >= 0:  # logs past the newest checkpoint are trained again by any resume: Drive need not hold them
        logs_here = min(logs_here, here)
    if on_drive >= here and logs_there >= logs_here:
        return None
    have = f"checkpoint of step {on_drive}" if on_drive >= 0 else "no checkpoint"
    return (f"Drive's copy has the {have} and logs through step {logs_there}; this runtime has "
            + (f"the checkpoint of step {here} and " if here >= 0 else "") + f"logs through step {logs_here}")


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name.split("_")[-1])


def logged_through(run_dir: str | Path) -> int | None:
    """The last step metrics.jsonl holds a row of; None without the file."""
    path = Path(run_dir) / METRICS
    if not path.exists():
        return None
    return max((r.get("step", 0) for r in read_jsonl(path)), default=0)


def restorable(mirror_dir: str | Path, log=None) -> list[Path]:
    """The mirror's complete checkpoints, newest first, that its logs reach (all of them when it has no
    metrics.jsonl). A newer one is a copy cut short between a checkpoint and its logs (an older kit copied the logs
    first): restoring it would leave those steps out of metrics.jsonl for good; `log` says it is passed over."""
    from kit.run.checkpoint import complete_checkpoints

    found = complete_checkpoints(mirror_dir)
    reach = logged_through(mirror_dir)
    if reach is None:
        return found
    newer = [p for p in found if _step_of(p) > reach]
    if newer and log is not None:
        steps = ", ".join(str(_step_of(p)) for p in reversed(newer))
        log(f"[kit] {mirror_dir}: the checkpoint of step {steps} is newer than the logs there (through step {reach}), "
            "a copy cut short: not restored; the run goes on from an older one and trains those steps again")
    return [p for p in found if _step_of(p) <= reach]


# A failed copy's reason in words: what the user can act on, from the error's errno
REASONS = {errno.ENOSPC: "Drive is full", errno.EDQUOT: "Drive is full", errno.EROFS: "Drive is read-only",
           errno.EACCES: "no permission to write to Drive", errno.EPERM: "no permission to write to Drive",
           errno.ENOTCONN: "Drive is not mounted", errno.EIO: "Drive had an input/output error"}


def require_mounted(mirror_dir: Path) -> None:
    """Raise (ENOTCONN, said as "Drive is not mounted (...)") when `mirror_dir` is on Colab's Drive path while
    Drive is not mounted there (e.g. after 01's last cell flushed and unmounted it): what is written there stays on
    this disk and what is read there is not Drive."""
    from kit.env import unmounted_drive

    if unmounted_drive(mirror_dir):
        raise OSError(errno.ENOTCONN, "run the Drive cell, colab.mount_drive(), to mount it again", str(mirror_dir))


def reason(err: BaseException) -> str:
    """Why a copy failed, in one line: "Drive is full (No space left on device)", "Drive is read-only (...)", or
    the error's type and message; a shutil.Error's list of (src, dst, why) tuples is reduced to its first why."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        first = err.args[0][0]
        return str(first[-1] if isinstance(first, tuple) else first).splitlines()[0]
    if isinstance(err, OSError) and err.strerror:
        if err.errno in REASONS:
            return f"{REASONS[err.errno]} ({err.strerror})"
        return f"{type(err).__name__}: {err.strerror}" + (f": {err.filename}" if err.filename else "")
    return f"{type(err).__name__}: {err}"


def remove_partials(folder: Path) -> None:
    """Remove the temporary copies (`.<name>.partial`) that a failed or killed copy left in a mirror."""
    from kit.run.checkpoint import HISTORY

    for place in (folder, folder / "ckpt", folder / HISTORY, folder / "eval"):
        for p in place.glob(".*.partial") if place.is_dir() else ():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


def _copy_file(src: Path, dst: Path) -> None:
    if not src.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.partial")
    try:
        shutil.copyfile(src, tmp)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full Drive needs the space back
        if not src.exists():  # rewritten away meanwhile: the next copy takes the new one
            return
        raise
    os.replace(tmp, dst)


def _copy_folder(src: Path, dst: Path) -> None:
    """`src` into the new folder `dst`, file by file. A failure is the OSError itself (its errno says why), not
    copytree's list of tuples."""
    dst.mkdir(parents=True)
    for entry in sorted(src.iterdir()):
        if entry.is_dir():
            _copy_folder(entry, dst / entry.name)
        else:
            shutil.copyfile(entry, dst / entry.name)


def _copy_tree(src: Path, dst: Path) -> bool:
    """Copy a checkpoint folder under a temporary name, then rename: never a half checkpoint at `dst`. False when
    `src` went away during the copy: pruned by the trainer (superseded, see the module docstring), not a failure."""
    if (dst / "COMPLETE").exists():
        return True
    tmp = dst.with_name(f".{dst.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_folder(src, tmp)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave a whole checkpoint's worth of files behind
        if not src.exists():
            return False
        raise
    if not src.exists():  # read whole (folders leave in one rename), but its place is taken by history/ now
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return True


def restore(mirror_dir: str | Path, run_dir: str | Path, log=print) -> int | None:
    """Bring a mirrored run back to `run_dir` (after a disconnect wiped the local disk). Returns the newest
    complete checkpoint step now in `run_dir`, or None when the mirror holds no run."""
    from kit.run.checkpoint import HISTORY, complete_checkpoints

    mirror_dir, run_dir = Path(mirror_dir), Path(run_dir)
    try:
        require_mounted(mirror_dir)
    except OSError as err:
        log(f"[kit] WARNING: not restoring from {mirror_dir}: {reason(err)}")
        return None
    if not (mirror_dir / "config.json").exists():
        return None
    other = read_runtime(mirror_dir)
    if other and other.get("id") != RUNTIME_ID and time.time() - other.get("time", 0) < RECENT_S \
            and not gone_here(other):
        log(f"[kit] NOTE: another runtime copied this run to Drive recently ({who(other)}). Expected after a "
            "disconnect (nothing to do then); if that runtime is still training (another tab, a runtime not "
            "stopped), stop it first (Colab: Runtime > Manage sessions): two runtimes training one run overwrite "
            "each other's checkpoints on Drive")
    run_dir.mkdir(parents=True, exist_ok=True)

    def newest(found):
        return _step_of(found[0]) if found else -1

    remote = restorable(mirror_dir, log)
    if remote and newest(remote) > newest(complete_checkpoints(run_dir)):  # the mirror is ahead: take it
        for name in _LOG_FILES:
            _copy_file(mirror_dir / name, run_dir / name)
        for ckpt in remote:
            _copy_tree(ckpt, run_dir / "ckpt" / ckpt.name)
        for kept in complete_checkpoints(mirror_dir, HISTORY):
            if _step_of(kept) <= newest(remote):
                _copy_tree(kept, run_dir / HISTORY / kept.name)
        log(f"[kit] restored {run_dir} from {mirror_dir} ({remote[0].name})")
    elif not (run_dir / "config.json").exists():
        _copy_file(mirror_dir / "config.json", run_dir / "config.json")
    step = newest(complete_checkpoints(run_dir))
    return step if step >= 0 else None
