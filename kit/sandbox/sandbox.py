"""Run untrusted generated code so that it cannot change its own verdict, reach the caller, or outlive its run.

    result = run(program, tests=["assert add(1, 2) == 3", ...], call_names=("add",))
    result.passed          # [True, False, ...], one per test
    result.reasons         # "" for a pass, else why: "AssertionError", "timeout after 3.0 s", ...
    result.violation       # "" or why the run earns no credit: "refused: reading '/proc/1/environ'", ...

The design: **the verdict lives in a different process from the program.** Each run has two interpreters:
- the *runner* (kit/sandbox/runner.py) runs the generated program and answers calls, nothing else: it gets a
  function name and arguments as plain data and sends back the return value as plain data (kit/sandbox/wire.py);
- the *checker* (kit/sandbox/checker.py) runs the tests, in its own namespace where the functions under test are
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
import functools
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from kit.sandbox import wire as sandbox_wire
from kit.sandbox.isolation import Isolation, Limits, isolation, layers  # noqa: F401  (the sandbox's public names)
from kit.sandbox.isolation import (_allowed_env, _clean_up, _kill_group, _kill_namespace, _kill_user, _state_dir,
                                   _uid_slot)

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
_MAX_REPORT_BYTES = 1 << 20
_MAX_REASON = 300  # characters of a failure's reason (feedback prompts quote them)


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
                    iso.runner_command(uid, ["-I", "-S", "-B", "-X", "utf8", "-c", _source("runner.py"),
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
    """A long-lived checker process (kit/sandbox/checker.py): one interpreter start, `import json` and compile
    for many programs instead of one each (about 20 ms of CPU per program). It takes one job at a time over a Unix
    socket, with the two pipe ends of that program's runner; one that timed out or failed is never reused."""

    def __init__(self, undumpable: bool):
        ours, theirs = socket.socketpair()
        self.log = tempfile.TemporaryFile(dir=_state_dir())
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _source("checker.py"), str(theirs.fileno()),
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


# --- parent side


@functools.lru_cache(maxsize=None)
def _source(name: str) -> str:
    """The wire module's source followed by the runner's or the checker's: neither side imports the kit."""
    return Path(sandbox_wire.__file__).read_text() + "\n\n" + (_HERE / name).read_text()


def _send(proc: subprocess.Popen, job: dict) -> None:
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass


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
