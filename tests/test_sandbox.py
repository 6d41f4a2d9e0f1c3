"""The sandbox holds hostile programs and their verdict cannot be rewritten. Run: python -m pytest tests/test_sandbox.py

Every attack program below also computes the right answers, so a pass would be credit earned by the attack. Each
one is checked for: no test credit, a recorded violation, the parent's environment and working directory as they
were, no process left behind, no file outside the sandbox, and the parent's secret never coming back in anything
the result holds (reasons, error, output).
"""

import os
import secrets

import pytest

from kit.sandbox import sandbox, isolation as sandbox_isolation
from kit.sandbox.sandbox import Limits, run, run_many

FAST = Limits(test_timeout=1.0)
ADD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0"]
CANARY = "sk-ant-canary-" + secrets.token_hex(8)  # made at run time: no key-shaped literal in the repository
MARK = "kitattack" + secrets.token_hex(4)  # in every path and command line an attack makes
OUTSIDE = f"/tmp/{MARK}.txt"


def _sandbox_processes(uids) -> list[str]:
    """Processes left by this test's runs: any process of a uid they ran as, or whose command line has the mark."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        if MARK.encode() in cmd or uid in uids:
            found.append(f"{pid}: {cmd[:80]!r}")
    return found


@pytest.fixture(autouse=True)
def parent_unchanged(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    uids, enter = set(), sandbox_isolation._uid_slot.__enter__

    def recorded(self):
        uid = enter(self)
        uids.add(uid)
        return uid

    monkeypatch.setattr(sandbox_isolation._uid_slot, "__enter__", recorded)

    def env():
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    cwd, before = os.getcwd(), env()
    yield
    assert os.getcwd() == cwd and env() == before
    assert not os.path.exists(OUTSIDE)
    assert _sandbox_processes(uids) == []


def _contained(r: sandbox.Result, violation: str = "") -> None:
    assert not any(r.passed), r
    assert r.violation, r
    assert violation in r.violation, r.violation
    assert CANARY not in repr(r)


# --- honest programs


def test_correct_program_passes_and_wrong_assert_fails_with_values():
    r = run(ADD, TESTS + ["assert add(1, 1) == 3"], call_names=["add"])
    assert r.passed == [True, True, True, False] and r.violation == ""
    assert r.reasons[3] == "AssertionError: 2 != 3"


def test_functions_need_not_be_named_and_asserts_can_be_any_expression():
    prog = "import math\ndef half(x):\n    return x / 2\nclass Box:\n    pass\n"
    r = run(prog, ["assert abs(half(1.0) - 0.5) < 1e-9", "assert math.isclose(half(3), 1.5)",
                   "for i in range(20):\n    assert half(2 * i) == i", "assert half(1) is not None"])
    assert r.passed == [True, False, True, True]  # the tests import their own modules: `math` is not the test's


def test_syntax_error_in_program_fails_every_test_with_the_reason():
    r = run("def add(a, b)\n    return a + b\n", TESTS)
    assert r.passed == [False] * 3 and r.reasons[0].startswith("SyntaxError") and r.violation == ""


def test_a_slow_test_is_a_timeout_not_a_violation_and_later_tests_run():
    prog = ADD + "def spin():\n    while True:\n        pass\n"
    r = run(prog, ["spin()", "assert add(2, 2) == 4"], limits=FAST)
    assert r.passed == [False, True] and "timeout" in r.reasons[0] and r.violation == ""


def test_honest_results_of_any_builtin_type_pass():
    prog = ("import collections\nP = collections.namedtuple('P', 'x y')\n"
            "def f():\n    return {'a': [1, 2.5, (None, True)], 'b': {3}, 'c': frozenset(), 'd': b'x', 'e': 1j}\n"
            "def g():\n    return P(1, 2)\n"
            "def h():\n    return float('nan'), float('-inf'), 10 ** 40, range(3), 'λ\\n'\n"
            "def gen(n):\n    yield from range(n)\n"
            "def boom(x):\n    raise ValueError('bad ' + str(x))\n")
    r = run(prog, ["assert f() == {'a': [1, 2.5, (None, True)], 'b': {3}, 'c': frozenset(), 'd': b'x', 'e': 1j}",
                   "assert g() == (1, 2)",
                   "import math\nx = h()\nassert math.isnan(x[0]) and x[1:] == (float('-inf'), 10 ** 40, range(3), 'λ\\n')",
                   "assert list(gen(4)) == [0, 1, 2, 3] and gen(4) != [0, 1, 2, 3]",
                   "try:\n    boom(1)\n    assert False\nexcept ValueError as e:\n    assert str(e) == 'bad 1'"])
    assert r.passed == [True] * 5, r.reasons


def test_context_runs_in_the_checker_and_the_programs_namesake_does_not_replace_it():
    context = "def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\n"
    cheat = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 123.0\n"
    honest = context + "def find_zero(xs):\n    return -xs[0] / xs[1]\n"
    test = ["assert abs(poly([2, 4], find_zero([2, 4]))) < 1e-6"]
    assert run(cheat, test, context=context).passed == [False]
    assert run(honest, test, context=context).passed == [True]


def test_run_many_in_parallel_matches_serial():
    jobs = [{"program": ADD, "tests": [f"assert add({i}, 1) == {i + 1 if i % 3 else 0}"]} for i in range(6)]
    serial = [r.passed for r in run_many(jobs, workers=1)]
    parallel = [r.passed for r in run_many(jobs, workers=3)]
    assert serial == parallel == [[i % 3 != 0] for i in range(6)]


def test_the_layers_are_named_in_one_line():
    line = sandbox.layers()
    assert line.startswith("sandbox layers: verdict in a separate checker process") and "\n" not in line


# --- the verdict cannot be rewritten


def test_frame_walking_finds_nothing_to_rewrite():
    # issue 20's attack 1: walk the harness's frames for the job and rewrite its tests to `pass`
    prog = ("import sys\n"
            "f = sys._getframe()\n"
            "while f is not None:\n"
            "    for d in (f.f_locals, f.f_globals):\n"
            "        for v in list(d.values()):\n"
            "            if isinstance(v, dict) and 'tests' in v:\n"
            "                v['tests'][:] = ['pass'] * len(v['tests'])\n"
            "            if isinstance(v, dict) and 'program' in v:\n"
            "                v['program'] = ''\n"
            "    f = f.f_back\n"
            "def add(a, b):\n    return 7\n")
    r = run(prog, TESTS, call_names=["add"])
    assert r.passed == [False] * 3 and r.reasons[0] == "AssertionError: 7 != 3"


def test_forged_replies_and_a_rewritten_harness_only_change_answers():
    prog = ("import os, sys, builtins\n"
            "for fd in range(3, 40):\n"
            "    try:\n        os.write(fd, b'[\"test\", 0, true, \"\"]\\n[\"done\", \"\"]\\n')\n"
            "    except OSError:\n        pass\n"
            "print('[\"test\", 1, true, \"\"]')\n"
            "builtins.AssertionError = type('Nope', (Exception,), {})\n"
            "def add(a, b):\n    return 7\n")
    r = run(prog, TESTS, call_names=["add"])
    assert r.passed == [False] * 3


def test_always_equal_objects_come_back_as_plain_data():
    prog = ("class Anything:\n    def __eq__(self, other):\n        return True\n"
            "    def __bool__(self):\n        return True\n    def __ne__(self, other):\n        return False\n"
            "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n"
            "def add(a, b):\n    return Anything()\n"
            "def mul(a, b):\n    return [Sneaky(0)]\n")
    tests = ["assert add(1, 2) == 3", "assert not add(1, 2) != 3", "assert mul(2, 3) == [6]", "assert 3 == add(1, 2)"]
    r = run(prog, tests, call_names=["add", "mul"])
    assert r.passed == [False] * 4 and "Anything from the sandbox" in r.reasons[0]


def test_the_program_cannot_define_the_checkers_helpers_or_builtins():
    # a program that names its functions __kit_eq__, abs or sum must not replace the checker's own
    prog = ("def add(a, b):\n    return 0\n"
            "def __kit_eq__(a, b):\n    return True\n"
            "def abs(x):\n    return 0\n"
            "def sum(xs):\n    return 0\n"
            "def isinstance(a, b):\n    return True\n")
    tests = ["assert add(1, 2) == 3", "assert abs(add(1, 2) - 3) < 1e-9", "assert sum([add(1, 2)]) == 3",
             "assert isinstance(add(1, 2), str)"]
    r = run(prog, tests, call_names=["add"])
    assert r.passed == [False] * 4 and r.reasons[0] == "AssertionError: 0 != 3"


def test_an_assert_message_never_calls_the_program():
    # HumanEval writes `assert candidate(x) == y, str(candidate(x))`: a second call only when the first answer
    # was wrong would tell the program so; the message is dropped and the reason says what it got instead
    prog = ("calls = []\n"
            "def add(a, b):\n    calls.append((a, b))\n    return 0\n"
            "def count():\n    return len(calls)\n")
    r = run(prog, ["assert add(1, 2) == 3, str(add(1, 2))", "assert count() == 1"], call_names=["add", "count"])
    assert r.passed == [False, True] and r.reasons[0] == "AssertionError: 0 != 3"


def test_a_failure_reason_is_short_whatever_the_program_returns():
    prog = "def add(a, b):\n    return 'x' * 100000\n"
    r = run(prog, ["assert add(1, 2) == 3", "assert add(1, 2) == 3, 'the message ' * 1000"])
    assert r.passed == [False, False] and max(len(x) for x in r.reasons) <= 300


def test_the_tripwire_cannot_be_disarmed_through_what_the_harness_leaves_reachable():
    # the harness's signal handler, thread stub and frames hold nothing whose code or cells turn reporting off
    disarm = ("import signal, sys, _thread\n"
              "def neuter(fn):\n"
              "    code, cells = getattr(fn, '__code__', None), getattr(fn, '__closure__', None) or ()\n"
              "    for name, cell in zip(code.co_freevars if code else (), cells):\n"
              "        if name in ('write', 'exit_', 'exit', 'audit'):\n"
              "            cell.cell_contents = lambda *a, **k: None\n"
              "        elif callable(cell.cell_contents):\n"
              "            neuter(cell.cell_contents)\n"
              "for fn in (signal.getsignal(signal.SIGXFSZ), _thread.start_new_thread):\n"
              "    neuter(fn)\n"
              "f = sys._getframe()\n"
              "while f is not None:\n"
              "    for k, v in list(f.f_locals.items()):\n"
              "        if k in ('violation', 'report', 'resource_violation'):\n            neuter(v)\n"
              "    f = f.f_back\n")
    prog = f"try:\n{_indent(disarm)}\nexcept BaseException:\n    pass\n" \
           "try:\n    open('/etc/hostname').read()\nexcept BaseException:\n    pass\n" + ADD
    _contained(run(prog, TESTS, call_names=["add"]))


DISARM = ("def disarm():\n"  # what a program inside the hook would do: turn the hook's report and exit off
          "    import sys\n"
          "    def neuter(fn, depth=0):\n"
          "        if getattr(fn, '__name__', '') not in ('violation', 'check', 'hook'):\n"
          "            return\n"
          "        code = getattr(fn, '__code__', None)\n"
          "        for name, cell in zip(code.co_freevars if code else (), getattr(fn, '__closure__', None) or ()):\n"
          "            if name in ('write', 'exit_'):\n"
          "                cell.cell_contents = lambda *a, **k: None\n"
          "            elif depth < 2 and callable(cell.cell_contents):\n"
          "                neuter(cell.cell_contents, depth + 1)\n"
          "    f = sys._getframe(1)\n"
          "    while f is not None:\n"
          "        for v in list(f.f_locals.values()):\n"
          "            neuter(v)\n"
          "        f = f.f_back\n")


@pytest.mark.parametrize("trick", [
    # code the hook might call back into while it is on the stack: a rebound module function, a metaclass name,
    # a str subclass's methods, odd arguments to a hand-raised audit event
    "import json\nreal = json.dumps\n"
    "def fake(*a, **k):\n    json.dumps = real\n    disarm()\n    raise ValueError\n"
    "json.dumps = fake\nopen('/etc/hostname').read()\n",
    "class Meta(type):\n    @property\n    def __name__(cls):\n        disarm()\n        return 'x'\n"
    "class P(str, metaclass=Meta):\n    pass\nopen(P('/etc/hostname')).read()\n",
    "class S(str):\n    def startswith(self, *a):\n        disarm()\n        return True\n"
    "    def __eq__(self, other):\n        disarm()\n        return True\n    __hash__ = str.__hash__\n"
    "__import__(S('ctypes'))\n",
    "class F(int):\n    def __and__(self, other):\n        disarm()\n        return 0\n"
    "import sys\nsys.audit('open', '/etc/hostname', 'r', F(1))\nopen('/etc/hostname').read()\n",
])
def test_nothing_the_program_defines_runs_inside_the_hook(trick):
    prog = DISARM + f"try:\n{_indent(trick)}\nexcept BaseException:\n    pass\n" + \
        "try:\n    open('/etc/passwd').read()\nexcept BaseException:\n    pass\n" + ADD
    _contained(run(prog, TESTS, call_names=["add"]))


def test_links_are_refused_since_a_relative_chain_defeats_path_checks():
    chain = "import os\nos.symlink('.', 'U0')\nfor k in range(1, 8):\n    os.symlink(f'U{k - 1}/..', f'U{k}')\n" \
            "open('U7/etc/hostname').read()\n"
    _contained(run(f"try:\n{_indent(chain)}\nexcept BaseException:\n    pass\n" + ADD, TESTS), "os.symlink")


def test_a_lying_reply_channel_is_a_violation():
    prog = "import os, sys\nos.write(int(sys.argv[2]), b'not json at all\\n')\n" + ADD
    _contained(run(prog, TESTS), "not a reply")


# --- attacks: refused, and trying costs the run's credit


ATTACKS = {
    # issue 20's attack 2: fork_exec raises no audit event; a shell reads the parent's environment, writes
    # outside, and leaves a detached child
    "fork_exec": ("import _posixsubprocess, os\n"
                  f"cmd = b'cat /proc/*/environ > {OUTSIDE}; setsid sleep 30 {MARK} &'\n"
                  "_posixsubprocess.fork_exec([b'/bin/sh', b'-c', cmd], [b'/bin/sh'], True, (), None, None,"
                  " -1, -1, -1, -1, -1, -1, *os.pipe(), False, False, None, None, None, -1, None, False)\n",
                  "importing _posixsubprocess"),
    "subprocess": ("import subprocess\n"
                   f"subprocess.run(['sh', '-c', 'sleep 30 {MARK}'])\n", "importing"),
    "os_system": (f"import os\nos.system('echo x > {OUTSIDE}')\n", "os.system"),
    "setsid_double_fork": ("import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                           f"        os.execv('/bin/sleep', ['sleep', '30', '{MARK}'])\n", "os.fork"),
    "threads": ("import threading\n"
                "def spin():\n    while True:\n        pass\n"
                "for _ in range(200):\n    threading.Thread(target=spin, daemon=True).start()\n",
                "thread"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n", "os.kill"),
    "kill_everyone": ("import os\nos.kill(-1, 9)\n", "os.kill"),
    "read_parent_environ": ("import os\n"
                            "data = b''.join(open(f'/proc/{p}/environ', 'rb').read() for p in os.listdir('/proc')"
                            " if p.isdigit())\n"
                            "raise RuntimeError(data)\n", "/proc"),
    "read_home": ("print(open('/root/.bashrc').read())\n", "reading"),
    "read_the_answer_key": ("import gzip, glob\n"
                            "for p in glob.glob('/usr/**/HumanEval.jsonl.gz', recursive=True):\n"
                            "    print(gzip.open(p).read()[:100])\n", "listing"),
    "write_outside": (f"open({OUTSIDE!r}, 'w').write('pwned')\n", "writing"),
    "write_home": ("open('/root/.kit_attack', 'w').write('pwned')\n", "writing"),
    "socket": ("import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))\n", "socket"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'id')\n", "ctypes"),
    "gc_walk": ("import gc\nobjs = gc.get_objects()\n", "gc.get_"),
    "setrlimit": ("import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (100, 100))\n", "resource"),
    "huge_output": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "file size limit"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_at_the_top_level_is_refused_and_earns_nothing(name):
    attack, why = ATTACKS[name]
    prog = f"try:\n{_indent(attack)}\nexcept BaseException:\n    pass\n" + ADD
    _contained(run(prog, TESTS, call_names=["add"], limits=FAST), why)


@pytest.mark.parametrize("name", ["os_system", "read_parent_environ", "write_outside", "socket", "threads",
                                  "kill_parent"])
def test_an_attack_inside_the_function_under_test_is_refused_and_earns_nothing(name):
    attack, why = ATTACKS[name]
    prog = f"def add(a, b):\n    if a == 2:\n        try:\n{_indent(attack, 12)}\n        except BaseException:\n" \
           "            pass\n    return a + b\n"
    r = run(prog, TESTS, call_names=["add"], limits=FAST)
    _contained(r, why)
    assert r.reasons[0].startswith("no credit") and r.reasons[2].startswith("not run")


def test_ignoring_the_alarm_earns_nothing_after_it_and_is_a_timeout():
    # ignoring the alarm cannot be told from a long call in C (which takes no alarm): either way the tests from
    # there on fail as timeouts, the ones before keep their result, and nothing is gained
    prog = ("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n")
    r = run(prog, TESTS, call_names=["add"], limits=Limits(test_timeout=0.5))
    assert r.passed == [True, False, False] and r.violation == "" and "timeout" in r.reasons[1]
    assert "timeout" in r.reasons[2]  # the next call was cut by its own limit too: no hang, whatever the machine's load


def test_an_honest_long_call_in_c_keeps_the_tests_before_it():
    prog = "def add(a, b):\n    if a == 2:\n        return sum(range(10 ** 11))\n    return a + b\n"
    r = run(prog, TESTS, call_names=["add"], limits=Limits(test_timeout=0.5))
    assert r.passed == [True, False, False] and r.violation == ""


def test_a_loop_that_swallows_every_timeout_earns_nothing():
    prog = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass\n"
    r = run(prog + ADD, TESTS, limits=Limits(test_timeout=0.5))
    assert r.passed == [False] * 3 and "did not stop" in r.reasons[0]


def test_a_refusal_after_answers_written_ahead_is_still_seen():
    # the program writes its replies before the calls come, then tries something refused on the last call
    prog = ("import os, sys\n"
            "fd = int(sys.argv[2])\n"
            "os.write(fd, b'[\"ready\"]\\n' + b'[\"ok\",3]\\n[\"ok\",4]\\n[\"ok\",0]\\n')\n"
            "def add(a, b):\n    if a == -1:\n        open('/etc/hostname').read()\n    return a + b\n")
    _contained(run(prog, TESTS, call_names=["add"]), "reading")


@pytest.mark.parametrize("where", ["top", "test"])
def test_ending_the_process_earns_nothing(where):
    exit_ = "import os\nos._exit(0)\n"
    prog = exit_ + ADD if where == "top" else f"def add(a, b):\n    if a == 2:\n{_indent(exit_, 8)}\n    return a + b\n"
    _contained(run(prog, TESTS, call_names=["add"]), "ended its process")


def test_an_uncaught_memory_error_earns_nothing():
    # a MemoryError the program catches itself goes unseen (Python has no hook for it); the limit still holds
    _contained(run("x = bytearray(10 ** 10)\n" + ADD, TESTS), "memory limit")
    prog = "def add(a, b):\n    if a == 2:\n        return [0] * 10 ** 10\n    return a + b\n"
    _contained(run(prog, TESTS), "memory limit")


def test_deep_recursion_that_crashes_the_interpreter_earns_nothing():
    prog = ("import sys\nsys.setrecursionlimit(10 ** 8)\n"
            "def down(n):\n    return list(map(down, [n + 1]))\n"  # through C: the C stack overflows
            "def add(a, b):\n    if a == 2:\n        down(0)\n    return a + b\n")
    r = run(prog, TESTS, call_names=["add"])
    crashed = r.violation and not any(r.passed)  # the process died: a violation
    assert crashed or (r.passed == [True, False, False] and "RecursionError" in r.reasons[1])


def test_patched_builtins_do_not_reach_the_tests():
    prog = ("import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.len = lambda x: 3\n"
            "def f(x):\n    return [0] * x\n")
    r = run(prog, ["assert abs(f(2)[0] - 1) < 0.5", "assert len(f(2)) == 3"], call_names=["f"])
    assert r.passed == [False, False]


# --- the layers under the audit hook (a program that got past it)


def _without_the_hook(code: str) -> str:
    """Run `code` as the sandbox runs its runner (user, namespaces, no_new_privs), with no audit hook at all."""
    iso = sandbox.isolation()
    if not iso.drop_user:
        pytest.skip("not root here: the runner keeps the caller's user (the audit hook and the checker hold)")
    import subprocess

    with sandbox_isolation._uid_slot(iso) as uid:
        try:
            done = subprocess.run(iso.runner_command(uid, ["-I", "-S", "-c", code]), capture_output=True,
                                  timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd="/")
        finally:
            sandbox_isolation._kill_user(uid)
    return done.stdout.decode() + done.stderr.decode()


def test_below_the_hook_the_parent_environment_and_home_are_out_of_reach():
    code = ("import os\nout = []\n"
            "for p in os.listdir('/proc'):\n"
            "    if p.isdigit():\n"
            "        try:\n            out.append(open(f'/proc/{p}/environ', 'rb').read())\n"
            "        except OSError as e:\n            out.append(repr(e).encode())\n"
            "for path in ('/root', os.path.dirname(os.path.dirname(" + repr(sandbox.__file__) + "))):\n"
            "    try:\n        out.append(repr(os.listdir(path)).encode())\n"
            "    except OSError as e:\n        out.append(repr(e).encode())\n"
            "print(b'|'.join(out))\n")
    text = _without_the_hook(code)
    assert CANARY not in text and "test_sandbox.py" not in text and "runner.py" not in text, text


def test_below_the_hook_processes_and_threads_are_bounded_and_writes_stay_inside():
    code = ("import os, threading\nres = []\n"
            "try:\n    threading.Thread(target=lambda: None).start()\n    res.append('thread started')\n"
            "except RuntimeError:\n    res.append('no thread')\n"
            "try:\n    pid = os.fork()\n    res.append('forked')\n    os._exit(0) if pid == 0 else None\n"
            "except OSError:\n    res.append('no fork')\n"
            f"open('/tmp/{MARK}', 'w').write('x')\n"
            "import socket\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n    res.append('connected')\n"
            "except OSError:\n    res.append('no network')\n"
            "print(res, os.getuid())\n")
    text = _without_the_hook(code)
    if "no_new_privs" not in sandbox.layers():
        pytest.skip("no setpriv here")
    assert "['no thread', 'no fork'" in text, text
    if sandbox.isolation().namespaces:
        assert "'no network']" in text, text
    assert not os.path.exists(f"/tmp/{MARK}")  # the runner's /tmp is its own, or the hook refuses it


def test_below_the_hook_nothing_written_to_a_world_writable_directory_outlives_the_run():
    if not sandbox.isolation().namespaces:
        pytest.skip("no mount namespace here: world-writable directories are the audit hook's to refuse")
    dirs = sandbox_isolation._writable_directories()
    code = f"for d in {dirs!r}:\n    try:\n        open(d + '/{MARK}', 'w').write('x')\n    except OSError:\n" \
           "        pass\n"
    _without_the_hook(code)
    assert [d for d in dirs if os.path.exists(f"{d}/{MARK}")] == []


def _indent(code: str, n: int = 4) -> str:
    return "\n".join(" " * n + line for line in code.strip("\n").splitlines())


# --- where namespaces are refused (a container without them): what still holds


@pytest.fixture
def no_namespaces(monkeypatch):
    iso = sandbox.isolation()
    if not iso.drop_user:
        pytest.skip("not root here")
    fallback = sandbox.Isolation(iso.python, True, (), iso.no_new_privs, iso.prlimit,
                                 writable=tuple(sandbox_isolation._writable_directories()))
    monkeypatch.setattr(sandbox_isolation, "_isolation", fallback)
    return fallback


@pytest.mark.parametrize("name", ["fork_exec", "read_parent_environ", "write_outside", "threads", "kill_everyone"])
def test_without_namespaces_the_attacks_are_still_contained(no_namespaces, name):
    attack, why = ATTACKS[name]
    prog = f"try:\n{_indent(attack)}\nexcept BaseException:\n    pass\n" + ADD
    _contained(run(prog, TESTS, call_names=["add"], limits=FAST), why)


def test_without_namespaces_what_the_uid_left_in_shared_directories_is_removed(no_namespaces):
    import subprocess

    with sandbox_isolation._uid_slot(no_namespaces) as uid:
        code = f"import os\nos.makedirs('/tmp/{MARK}/x')\nopen('/tmp/{MARK}.txt', 'w').write('answers')\n"
        subprocess.run(no_namespaces.runner_command(uid, ["-I", "-S", "-c", code]), env={"PATH": "/usr/bin:/bin"},
                       cwd="/", timeout=30, check=True)
        assert os.path.exists(OUTSIDE) and os.path.isdir(f"/tmp/{MARK}")
        sandbox_isolation._remove_files_of(uid, no_namespaces.writable)
    assert not os.path.exists(OUTSIDE) and not os.path.exists(f"/tmp/{MARK}")


def test_honest_values_the_wire_must_carry():
    prog = ("from fractions import Fraction\nfrom decimal import Decimal\n"
            "class Bad(ValueError):\n    pass\n"
            "def big():\n    return 7 ** 10000\n"
            "def frac():\n    return Fraction(1, 3), Decimal('0.1')\n"
            "def boom():\n    raise Bad('no')\n"
            "def huge():\n    return 'x' * (9 << 20)\n")
    tests = ["assert big() == 7 ** 10000",
             "from fractions import Fraction\nfrom decimal import Decimal\nassert frac() == (Fraction(1, 3), "
             "Decimal('0.1'))",
             "try:\n    boom()\n    assert False\nexcept ValueError as e:\n    assert 'no' in str(e)",
             "huge()", "assert big() % 10 == 1"]
    limits = Limits(memory_mb=2048)
    r = run(prog, tests, limits=limits)
    assert r.passed == [True, True, True, False, True] and r.violation == "", r.reasons
    assert "too large" in r.reasons[3]


def test_a_checker_serves_many_programs_and_one_that_timed_out_is_not_reused():
    first = run(ADD, TESTS, call_names=["add"])
    idle = list(sandbox._checkers.idle)
    second = run("def add(a, b):\n    return 0\n", TESTS, call_names=["add"])
    assert first.passed == [True] * 3 and second.passed == [False, False, True]
    assert idle and set(map(id, sandbox._checkers.idle)) >= set(map(id, idle))  # the same process, reused
    # a test whose own code never ends: the wall clock kills its checker, which is not put back
    stuck = run(ADD, ["while True:\n    pass"], limits=Limits(test_timeout=0.5, timeout=2.0))
    assert stuck.timed_out and all(c.proc.poll() is None for c in sandbox._checkers.idle)
    assert run(ADD, TESTS, call_names=["add"]).passed == [True] * 3
