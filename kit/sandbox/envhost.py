"""Environments the agents act on (TRL's `environment_factory` classes), run in a child process, never in the
notebook's own.

    host = EnvHost("my_module:MyEnv", timeout_s=10)   # the class is imported and built in the child
    EnvHost("my_module:MyEnv", args={"size": 5})        # built as MyEnv(size=5): a factory with arguments
    host.tools                                         # name -> JSON schema (transformers.utils.get_json_schema)
    host.reset([row, row, ...])                        # one instance per world, built once and reset each step
    host.call(world, "run_tests", {"code": "..."})     # the tool message's content: the result, or {"error": ...}
    host.rewards([0, 1, ...])                          # get_reward() of each world, when the class has one
    host.agent_rewards([0, 1, ...], roles)             # get_agent_rewards() of each world: a float per role
    host.view(world).attribute, host.view(world).method()   # a world as reward functions see it (EnvView)
    host.close()

The contract is TRL's (trl 1.16, `GRPOTrainer(environment_factory=...)`): `reset(**row) -> str | None` gets a row's
fields as keyword arguments (a returned string is added to the prompt); every other public method (no leading `_`,
not `reset`, not `get_reward`) is a tool whose schema comes from its name, type hints and Google-style docstring;
an optional `get_reward() -> float` means the environment owns the reward. One instance per world, built once and
reset often. The kit adds three optional parts (a TRL class has none): a class attribute `tools_by_role =
{"helper": ["left_half"], ...}` offers a tool named there only to those roles, any other tool to every agent; a
method `get_agent_rewards()`, each agent's own share of the outcome, a `{role: float}` dict or a list in the team's
agent order (the reward parts local_0 .. local_{N-1} that `local_reward_weight` mixes into each agent's return); and a
class attribute `caller = ""`, which the kit sets to the calling agent's role before each of its tool calls (one
world is the team's: the Board labels a post with its author's role from it, not from an argument the model fills).

Randomness: each world's streams of Python's `random` and numpy's global generator are seeded at its reset (the
seed the rollout derives from the run's seed, the step, the item and the sample) and kept apart: a world's later calls
go on from where it left them, whatever other worlds of the child drew in between.

Safety and time: the class is imported, built and called only in the child, a fresh `python -m
kit.sandbox.envhost` (nothing of the notebook's state is inherited; JSON lines over its stdin and stdout, so rows,
arguments and results are JSON values; what the environment prints goes to stderr). Each call has a time limit; a
call past it kills the child, a new one is started, its instances built and reset again with their rows and seeds
(their state is lost: docs/environments.md), and the call answers `{"error": "... timed out after Ns"}`; a child that
crashed is said to have died, with its exit code. An exception in a tool, a request nested deeper than MAX_DEPTH or
one JSON cannot carry is that call's error message, not a crash, and touches no other world. Results are text: a str
as it is, anything else as JSON, cut to MAX_RESULT_CHARS.

Not a sandbox for hostile code: the environment class is the researcher's own code (as a reward function is), run
apart so that a hang, a crash or a stray print cannot take the notebook down; generated code a tool runs (CodeTests'
run_tests) goes through kit/sandbox/sandbox.py as every program the agents write.

May import: the standard library (the child imports the user's module and transformers for the schemas).

What a class offers and how its values are read (tools' schemas, argument errors, shares, results as text):
kit/sandbox/envclass.py.

Past 400 lines on purpose (about 450): the child's loop and the parent's client are the two ends of one protocol
(numbered JSON lines, what either end does with a line it cannot read), read side by side.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import select
import subprocess
import sys
import threading
import time

from kit.sandbox.envclass import (MAX_RESET_CHARS, EnvironmentClassError, _awaited, agent_shares, arguments_error,
                                    as_text, class_bytes, describe, load_class, spec_of)


def _serve(spec: str) -> None:
    """The child (`python -m kit.sandbox.envhost <spec>`): read the constructor's arguments (the first line, JSON)
    and a notebook's class by value (the second, empty for an importable class), build instances of the class (each
    `cls(**arguments)`, from its own copy) and answer reset / call / reward requests, one JSON line each, one at a
    time. The requests and answers travel on private copies of its stdin and stdout: what the environment's code
    prints goes to stderr, and what it reads from stdin is empty."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    requests = os.fdopen(os.dup(0), "r")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    null = os.open(os.devnull, os.O_RDONLY)  # a tool that reads stdin reads nothing, never the requests
    os.dup2(null, 0)
    sys.stdin = open(os.devnull)

    server = os.getpid()
    number = [0]  # the request being answered: the parent drops any answer not numbered as its request

    def send(status, value):
        if os.getpid() != server:  # a tool forked and its copy came back here: it must not answer
            os._exit(0)
        proto.write(json.dumps([number[0], status, value]) + "\n")

    envs = {}
    streams = {}  # world -> (its seed, random's state, numpy's state): each world draws from its own stream

    def enter(world, seed=None):
        """Before a world's code runs: its stream, seeded anew by a reset with a seed."""
        np = sys.modules.get("numpy")
        if seed is not None:
            streams[world] = (seed, None, None)
        if world not in streams:
            return
        seed, state, np_state = streams[world]
        random.seed(seed) if state is None else random.setstate(state)
        if np is not None:
            np.random.seed(seed % 2**32) if np_state is None else np.random.set_state(np_state)

    def leave(world):
        """After a world's code ran: where its stream stands."""
        if world in streams:
            np = sys.modules.get("numpy")
            streams[world] = (streams[world][0], random.getstate(), None if np is None else np.random.get_state())

    try:
        constructor = requests.readline()  # not on the command line: no size limit, not shown by ps
        pickled = requests.readline().strip()

        def build():  # every world gets its own copy of the arguments: none shares a list or dict with another
            return cls(**json.loads(constructor))

        cls = load_class(spec, pickled)
        envs[0] = build()
        send("ok", describe(envs[0]))
    except BaseException as err:  # said in the parent with the class's name
        send("error", f"{type(err).__name__}: {err}")
        return
    for line in requests:
        try:
            number[0], op, *args = json.loads(line)
        except (ValueError, RecursionError) as err:  # a request nested past this process's stack: its own error
            head = re.match(r"\[(\d+),", line)
            number[0] = int(head.group(1)) if head else 0
            send("error", f"the request could not be read ({type(err).__name__}: nested too deeply)")
            continue
        if op == "close":
            return
        world = args[0] if op in WORLD_OPS and args else None
        try:
            if op == "reset":
                world, row, *seed = args
                if world not in envs:
                    envs[world] = build()
                enter(world, seed[0] if seed else None)
                out = _awaited(envs[world].reset(**row))
                send("ok", None if out is None else as_text(str(out), MAX_RESET_CHARS))
                continue
            enter(world)
            if op == "call":
                world, name, arguments, caller = args
                if caller is not None and isinstance(getattr(type(envs[world]), "caller", None), str):
                    envs[world].caller = caller  # the kit's `caller`: the role of the agent whose call this is
                tool = getattr(envs[world], name)
                wrong = arguments_error(name, tool, arguments)
                if wrong:
                    send("error", wrong)
                    continue
                send("ok", as_text(_awaited(tool(**arguments))))
            elif op == "attr":  # a reward function reading its world (EnvView): a value, or "a method"
                world, name = args
                value = getattr(envs[world], name)
                send("ok", {"method": True} if callable(value) else {"value": json.loads(json.dumps(value,
                                                                                                  default=str))})
            elif op == "method":
                world, name, positional, keywords = args
                send("ok", json.loads(json.dumps(_awaited(getattr(envs[world], name)(*positional, **keywords)),
                                                 default=str)))
            elif op == "reward":
                value = float(_awaited(envs[args[0]].get_reward()))
                if not math.isfinite(value):
                    raise ValueError(f"get_reward() returned {value}: a reward must be a finite number")
                send("ok", value)
            elif op == "agent_rewards":
                send("ok", agent_shares(_awaited(envs[args[0]].get_agent_rewards()), args[1]))
            else:
                send("error", f"unknown request {op!r}")
        except BaseException as err:
            send("error", f"{type(err).__name__}: {err}")
        finally:
            leave(world)


WORLD_OPS = ("reset", "call", "attr", "method", "reward", "agent_rewards")  # requests whose first value is a world
MAX_DEPTH = 100  # lists and dicts inside one another in a request: tool arguments are never near this


def _depth(value, limit: int = MAX_DEPTH + 1) -> int:
    """How deep lists and dicts nest in `value`, counted up to `limit` (iteratively: no recursion to overflow)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            deepest = max(deepest, d)
            if d >= limit:
                return d
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


class EnvHost:
    """An environment class's instances in a child process (see the module docstring)."""

    def __init__(self, spec, timeout_s: float = 10.0, start_timeout_s: float = 120.0, args: dict | None = None):
        spec = spec_of(spec)  # a class given as TRL takes it: its "module:ClassName"
        self.spec, self.timeout_s, self.start_timeout_s = spec, timeout_s, start_timeout_s
        self._pickled = class_bytes(spec) or ""  # a notebook's class travels by value; taken once, for restarts too
        try:  # the constructor's keyword arguments travel to the child as JSON
            if not isinstance(args or {}, dict):
                raise TypeError(f"a mapping of keyword arguments was expected, got {type(args).__name__}")
            self.args = json.dumps(args or {}, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise EnvironmentClassError(f"environment={spec!r}: its arguments {args!r} must be a mapping of names to "
                                        f"JSON values (they are sent to the environment's process): {err}") from None
        self.rows: dict[int, dict] = {}  # each world's last row: a restarted child resets its instances with them
        self.seeds: dict[int, int | None] = {}  # and its seed
        self.tool_seconds = 0.0  # wall time inside tool calls (perf/tool_s)
        self.restarts = 0
        self._proc, self._closed, self._eof = None, False, False
        self._lock = threading.RLock()  # reward functions may read worlds from several threads (EnvView)
        self._start()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen([sys.executable, "-m", "kit.sandbox.envhost", self.spec],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, bufsize=1, env=env,
                                      cwd=os.getcwd(), start_new_session=True)  # killed with what it started
        self._proc.stdin.write(self.args + "\n" + self._pickled + "\n")  # the constructor's arguments, the class
        self._proc.stdin.flush()
        self._number = 0
        answer = self._read(self.start_timeout_s)
        if answer is None:
            self._kill()
            raise EnvironmentClassError(f"environment={self.spec!r}: the class was not built within "
                                        f"{self.start_timeout_s:.0f}s (or its process ended)")
        _, status, info = answer
        if status != "ok":
            self._kill()
            raise EnvironmentClassError(f"environment={self.spec!r} could not be built"
                                        + (f" with arguments {self.args}" if self.args != "{}" else "") + f": {info}")
        self.tools: dict[str, dict] = info["tools"]
        self.by_role: dict[str, list[str]] = info["by_role"]
        self.has_reward: bool = info["reward"]
        self.has_agent_rewards: bool = info["agent_rewards"]

    def _read(self, timeout: float, number: int = 0):
        """The child's answer to request `number` ([number, status, value]), or None when none came in time or the
        child is gone. An answer numbered otherwise (a stale one) is dropped."""
        end = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self._proc.stdout], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                return None
            line = self._proc.stdout.readline()
            if not line:
                self._eof = True  # the child is gone (or going): _died says how
                return None
            try:
                answer = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(answer, list) and len(answer) == 3 and answer[0] == number:
                return answer

    def tools_for(self, role: str) -> dict[str, dict]:
        """The tools an agent of `role` is offered: the ones named for it in tools_by_role and every unnamed one."""
        named = {t for names in self.by_role.values() for t in names}
        mine = set(self.by_role.get(role, []))
        return {n: s for n, s in self.tools.items() if n not in named or n in mine}

    def _ask(self, *request, timeout: float | None = None, restart: bool = True):
        """(ok, value) of one request; a request past its time limit, or a child that died, restarts it (not with
        restart=False: the restart's own resets, which must not restart again)."""
        with self._lock:
            return self._ask_locked(request, timeout, restart)

    def _ask_locked(self, request: tuple, timeout: float | None, restart: bool):
        self._number += 1
        if _depth(request) > MAX_DEPTH:  # the child would read it from a shallower stack, or die reading it
            return False, f"the request's values are nested more than {MAX_DEPTH} deep: not sent"
        try:  # a value JSON cannot write (a NaN, an object) is this request's error, not a crash
            line = json.dumps([self._number, *request], allow_nan=False)
        except (ValueError, TypeError, RecursionError) as err:
            return False, f"the request could not be sent to the environment ({type(err).__name__}: {err})"[:300]
        self._eof = False
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            answer = None
        else:
            answer = self._read(self.timeout_s if timeout is None else timeout, self._number)
        if answer is None:
            died = self._died()
            if restart and not self._closed:  # a child killed by close() is not started again
                self._restart()
            return False, (f"the environment's process died ({died}; it was restarted)" if died else
                           f"timed out after {self.timeout_s:g}s (the environment was restarted)")
        _, status, value = answer
        return status == "ok", value

    def _died(self) -> str:
        """How the child ended, when it did ("exit code 1", "killed by signal 11"), else "": a child whose output
        ended is reaped first (polled at once, a crash still looks alive)."""
        code = self._proc.poll()
        if code is None and self._eof:
            try:
                code = self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                return "its output ended"
        if code is None:
            return ""
        return f"killed by signal {-code}" if code < 0 else f"exit code {code}"

    def _restart(self) -> None:
        """A new child, its worlds reset with their rows; a reset that fails again is an error naming its world."""
        self._kill()
        self.restarts += 1
        self._start()
        for world, row in self.rows.items():
            ok, value = self._ask("reset", world, row, self.seeds.get(world), timeout=self.start_timeout_s,
                                  restart=False)
            if not ok:
                raise EnvironmentClassError(f"environment={self.spec!r}: after a restart, reset(**row) failed again "
                                            f"in world {world}: {value}")

    def reset(self, rows: list[dict], seeds: list[int] | None = None) -> list[str | None]:
        """Reset world w with rows[w] (instances built the first time), its `random` and numpy streams seeded with
        seeds[w] first; returns what each reset added."""
        seeds = seeds or [None] * len(rows)
        return [self.reset_world(world, row, seed) for world, (row, seed) in enumerate(zip(rows, seeds))]

    def reset_world(self, world: int, row: dict, seed: int | None = None) -> str | None:
        """reset(**row) of one world. With `seed`, the world's own streams of Python's `random` and numpy's global
        generator start from it, and every later call of that world goes on from where the world left them, whatever
        other worlds drew in between (so a world repeats exactly on a run, a resume and any number of children)."""
        try:
            json.dumps(row)
        except (TypeError, ValueError) as err:
            raise EnvironmentClassError(f"row {world} cannot be sent to the environment's process as JSON "
                                        f"({err}); rows must hold JSON values") from None
        ok, value = self._ask("reset", world, dict(row), seed, timeout=max(self.timeout_s, 30.0))
        if not ok:
            raise EnvironmentClassError(f"environment={self.spec!r}: reset(**row) failed on row {world}: {value}")
        self.rows[world], self.seeds[world] = dict(row), seed
        return value

    def call(self, world: int, name: str, arguments, caller: str | None = None) -> str:
        """One tool call's result as the tool message's content; an error is `{"error": "..."}`, never raised.
        `caller`: the calling agent's role, set as the instance's `caller` first when its class has one."""
        if name not in self.tools:
            return json.dumps({"error": f"unknown tool {name!r}; tools: {sorted(self.tools)}"})
        if not isinstance(arguments, dict):
            return json.dumps({"error": f"arguments of {name} must be a JSON object, got {arguments!r}"[:300]})
        t0 = time.perf_counter()
        ok, value = self._ask("call", world, name, arguments, caller)
        self.tool_seconds += time.perf_counter() - t0
        return value if ok else json.dumps({"error": as_text(str(value))})  # cut as a result is

    def call_many(self, calls: list[tuple]) -> list[str]:
        """A round's calls, (world, tool, arguments) or (world, tool, arguments, caller) each, run in the order given
        (kit/sandbox/envpool.py runs several children's in parallel)."""
        return [self.call(*c) for c in calls]

    def view(self, world: int) -> "EnvView":
        """What a reward function with an `environment` parameter receives for a joint action of this world."""
        return EnvView(self, world)

    def rewards(self, worlds: list[int]) -> list[float]:
        out = []
        for world in worlds:
            ok, value = self._ask("reward", world)
            if not ok:
                raise EnvironmentClassError(f"environment={self.spec!r}: get_reward() failed in world {world}: {value}")
            out.append(value)
        return out

    def agent_rewards(self, worlds: list[int], roles: list[str]) -> list[list[float]]:
        """get_agent_rewards() of each world: a float per role, in the order of `roles` (the parts local_0 ..)."""
        out = []
        for world in worlds:
            ok, value = self._ask("agent_rewards", world, list(roles))
            if not ok:
                raise EnvironmentClassError(f"environment={self.spec!r}: get_agent_rewards() failed in world "
                                            f"{world}: {value}")
            out.append(value)
        return out

    def _kill(self) -> None:
        """Kill the child and everything it started (its own session: a tool's subprocesses too)."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(5)
        for pipe in (self._proc.stdin, self._proc.stdout):  # a restarted or closed child leaves no open pipe behind
            try:
                pipe.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed = True
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.stdin.write(json.dumps([0, "close"]) + "\n")
                self._proc.stdin.flush()
                self._proc.wait(5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._proc = None


class EnvView:
    """One world's environment as a reward function sees it (TRL passes reward functions the environments): reading
    `env.name` fetches that attribute's value from the child (JSON: a str, number, list, dict; anything else as its
    str), and `env.method(...)` calls it there and returns its result. The world is the one the joint action acted
    on, in the state its rollout left it (scoring runs before the next reset). Not picklable: reward functions that
    read it run in the trainer's process (reward_pool=thread, or no pool)."""

    def __init__(self, host: EnvHost, world: int):
        self._host, self._world = host, world

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        ok, value = self._host._ask("attr", self._world, name)
        if not ok:
            raise AttributeError(f"the environment of world {self._world}: {value}")
        if value.get("method"):
            return lambda *args, **kwargs: self._call(name, args, kwargs)
        return value["value"]

    def _call(self, name: str, args: tuple, kwargs: dict):
        ok, value = self._host._ask("method", self._world, name, list(args), dict(kwargs))
        if not ok:
            raise RuntimeError(f"{name}() in the environment of world {self._world}: {value}")
        return value

    def __reduce__(self):
        raise TypeError("an environment (EnvView) lives in the trainer's process and cannot go to a reward worker "
                        "process: use reward_pool=thread (or reward_workers=0) with reward functions that take "
                        "`environment`")

    def __repr__(self) -> str:
        return f"EnvView({self._host.spec!r}, world={self._world})"


if __name__ == "__main__":
    _serve(sys.argv[1])
