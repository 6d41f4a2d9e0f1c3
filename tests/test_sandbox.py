"""The sandbox contains hostile programs. Run: python -m pytest tests/test_sandbox.py

Each test runs one hostile program and checks that it is contained (the parent process and the file system are
as they were), and that the tests it faced fail with a reason.
"""

import os
import secrets
import time

import pytest

from kit.sandbox import Limits, run, run_many

FAST = Limits(test_timeout=1.0)
ADD = "def add(a, b):\n    return a + b\n"


def _stray_children() -> list[str]:
    """Processes still running the sandbox harness (its code names _install_guard)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_install_guard" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


@pytest.fixture(autouse=True)
def parent_unchanged():
    def env():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    cwd, before = os.getcwd(), env()
    yield
    assert os.getcwd() == cwd and env() == before
    assert _stray_children() == []


def test_correct_program_passes_and_wrong_assert_fails_with_values():
    r = run(ADD, ["assert add(1, 2) == 3", "assert add(1, 1) == 3"], call_names=["add"])
    assert r.passed == [True, False]
    assert r.reasons[1] == "AssertionError: 2 != 3"


def test_syntax_error_in_program_fails_every_test_with_the_reason():
    r = run("def add(a, b)\n    return a + b\n", ["assert add(1, 2) == 3"])
    assert r.passed == [False] and "SyntaxError" in r.error and r.reasons == [r.error]


def test_infinite_loop_in_a_test_times_out_and_later_tests_still_run():
    prog = ADD + "def spin():\n    while True:\n        pass\n"
    t = time.monotonic()
    r = run(prog, ["spin()", "assert add(2, 2) == 4"], limits=FAST)
    assert r.passed == [False, True] and "timeout" in r.reasons[0]
    assert time.monotonic() - t < 5


def test_loop_that_swallows_the_timeout_is_killed_at_the_wall_clock():
    prog = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"
    r = run(prog, ["assert True"], limits=Limits(test_timeout=0.5, timeout=2.0))
    assert r.timed_out and r.passed == [False] and "killed after 2.0 s" in r.reasons[0]


def test_fork_bomb_is_refused_and_leaves_no_process():
    bombs = ["import os\nwhile True:\n    os.fork()\n",
             "import posix\nwhile True:\n    posix.fork()\n",
             "import multiprocessing\nwhile True:\n    multiprocessing.Process(target=print).start()\n"]
    for bomb in bombs:
        r = run(bomb, ["assert True"], limits=FAST)
        assert r.passed == [False] and r.error, bomb
    assert _stray_children() == []


def test_10gb_allocation_fails_with_memory_error():
    r = run(ADD, ["x = bytearray(10 * 1024 ** 3)", "assert add(1, 2) == 3"], limits=FAST)
    assert r.passed == [False, True] and r.reasons[0] == "MemoryError"


def test_writing_outside_the_working_directory_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    attempts = [f"open({str(target)!r}, 'w').write('x')",
                f"import posix; posix.open({str(target)!r}, posix.O_CREAT | posix.O_WRONLY)",
                f"import pathlib; pathlib.Path({str(target)!r}).write_text('x')",
                f"open('../../../../../../{str(target)!r}'[1:-1], 'w')",
                "open('inside.txt', 'w').write('fine'); assert open('inside.txt').read() == 'fine'"]
    r = run("", attempts, limits=FAST)
    assert r.passed == [False, False, False, False, True]
    assert "sandbox" in r.reasons[0] and "not allowed" in r.reasons[0]
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_deleting_files_is_refused(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    attempts = [f"import os; os.remove({str(keep)!r})", f"import posix; posix.unlink({str(keep)!r})",
                f"import shutil; shutil.rmtree({str(tmp_path)!r})",
                f"import os, importlib; importlib.reload(os); os.unlink({str(keep)!r})",
                f"import posix; posix.rename({str(keep)!r}, 'stolen.txt')"]
    r = run("", attempts, limits=FAST)
    assert r.passed == [False] * 5
    assert keep.read_text() == "precious"


def test_api_key_in_the_parent_never_reaches_the_program(monkeypatch):
    secret = "test-secret-" + secrets.token_hex(16)
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    prog = ("import os\ndef leak():\n    print(dict(os.environ))\n"
            "    return os.environ.get('ANTHROPIC_API_KEY') or os.environ.get('HF_TOKEN')\n")
    tests = ["assert leak() is None",
             f"print(open('/proc/{os.getpid()}/environ').read()); assert False",
             "import os; print(open(f'/proc/{os.getppid()}/environ').read()); assert False"]
    r = run(prog, tests, limits=FAST)
    assert r.passed == [True, False, False]
    assert "reading '/proc/" in r.reasons[1]
    assert secret not in r.output and not any(secret in why for why in r.reasons)


def test_spawning_a_shell_is_refused(tmp_path):
    marker = tmp_path / "shell_ran"
    attempts = [f"import os; os.system('touch {marker}')",
                f"import subprocess; subprocess.run('touch {marker}', shell=True)",
                f"import posix; posix.execv('/bin/sh', ['sh', '-c', 'touch {marker}'])",
                "import pty; pty.spawn('/bin/sh')",
                f"import _posixsubprocess, os; os.posix_spawn('/bin/sh', ['sh', '-c', 'touch {marker}'], {{}})"]
    r = run("", attempts, limits=FAST)
    assert r.passed == [False] * 5 and all(r.reasons)
    assert not marker.exists()


def test_printing_1gb_is_cut_at_the_file_size_limit():
    prog = "import sys\ndef flood():\n    for _ in range(1024):\n        sys.stdout.write('x' * (1 << 20))\n"
    t = time.monotonic()
    r = run(prog, ["flood()", "assert 1 + 1 == 2"], limits=Limits(test_timeout=5.0, file_mb=8))
    assert r.passed == [False, True] and "File too large" in r.reasons[0]
    assert time.monotonic() - t < 10


def test_sys_exit_mid_tests_fails_only_that_test():
    r = run(ADD, ["assert add(1, 2) == 3", "import sys; sys.exit(0)", "assert add(2, 2) == 4"])
    assert r.passed == [True, False, True] and r.reasons[1].startswith("SystemExit")


def test_os_exit_mid_tests_fails_the_rest():
    r = run(ADD, ["assert add(1, 2) == 3", "import os; os._exit(0)", "assert add(2, 2) == 4"])
    assert r.passed == [True, False, False]
    assert "ended the process" in r.reasons[1] and r.reasons[1] == r.reasons[2]


def test_os_exit_at_import_fails_every_test():
    r = run("import os\nos._exit(0)\n" + ADD, ["assert add(1, 2) == 3"])
    assert r.passed == [False] and "ended the process" in r.error


def test_forged_results_on_stdout_and_pipes_are_ignored():
    prog = ("import os, sys\n"
            "for line in ['program 1 ok', '0 1 ', 'x 0 1 ']:\n    print(line, flush=True)\n"
            "for fd in range(3, 40):\n    try:\n        os.write(fd, b'deadbeef 0 1 \\n')\n    except OSError:\n"
            "        pass\n"
            "def add(a, b):\n    return 0\n")
    r = run(prog, ["assert add(1, 2) == 3"])
    assert r.passed == [False]


def test_reporting_through_the_audit_channel_is_refused():
    prog = "import sys\nsys.audit('kit.report', 0, True, '')\ndef add(a, b):\n    return 0\n"
    r = run(prog, ["import sys; sys.audit('kit.report', 0, True, ''); assert add(1, 2) == 3"])
    assert r.passed == [False]


def test_monkeypatching_the_harness_does_not_make_tests_pass():
    prog = ("import builtins, sys\n"
            "builtins.AssertionError = type('Nope', (Exception,), {})\n"
            "builtins.exec = lambda *a, **k: None\n"
            "builtins.compile = lambda *a, **k: compile('pass', 'x', 'exec')\n"
            "def __kit_eq__(a, b):\n    return True\n"
            "def __kit_honest__(x):\n    return x\n"
            "main = sys.modules['__main__']\n"
            "main.__kit_eq__ = lambda a, b: True\n"
            "def add(a, b):\n    return 0\n")
    r = run(prog, ["assert add(1, 2) == 3", "assert add(2, 2) == 4"], call_names=["add"])
    assert r.passed == [False, False]


def test_always_equal_object_fails_the_test():
    prog = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
            "    def __bool__(self):\n        return True\n"
            "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n"
            "def add(a, b):\n    return Anything()\n"
            "def mul(a, b):\n    return [Sneaky(0)]\n")
    tests = ["assert add(1, 2) == 3", "assert add(1, 2)", "assert mul(2, 3) == [6]", "assert 3 == add(1, 2)"]
    r = run(prog, tests, call_names=["add", "mul"])
    assert r.passed == [False] * 4 and "overrides __eq__" in r.reasons[0]


def test_honest_results_of_any_builtin_type_pass():
    prog = ("import collections\nP = collections.namedtuple('P', 'x y')\n"
            "def f():\n    return {'a': [1, 2.5, (None, True)], 'b': {3}, 'c': frozenset(), 'd': b'x'}\n"
            "def g():\n    return P(1, 2)\n")
    r = run(prog, ["assert f() == {'a': [1, 2.5, (None, True)], 'b': {3}, 'c': frozenset(), 'd': b'x'}",
                   "assert g() == (1, 2)"], call_names=["f", "g"])
    assert r.passed == [True, True]


def test_the_working_directory_is_removed_afterwards():
    r = run("import os\nWD = os.getcwd()\n", ["open('left.txt', 'w').write('x'); print('WD=' + WD)"])
    workdir = r.output.split("WD=")[1].split()[0]
    assert r.passed == [True] and workdir.startswith("/") and not os.path.exists(workdir)


def test_run_many_in_parallel_matches_serial():
    jobs = [{"program": ADD, "tests": [f"assert add({i}, 1) == {i + 1 if i % 3 else 0}"]} for i in range(6)]
    serial = [r.passed for r in run_many(jobs, workers=1)]
    parallel = [r.passed for r in run_many(jobs, workers=2)]
    assert serial == parallel == [[i % 3 != 0] for i in range(6)]
