"""An optional Claude judge (the `anthropic` SDK) behind a hard dollar budget.

    judge = Judge(run_dir, model="claude-sonnet-4-5", budget_usd=15, timeout=30, max_retries=2,
                  max_failures=3, cooldown_s=300)   # off, with one line, when no key
    judge.score(rubric, text)        -> float in [0, 1], or None (unscored)
    judge.feedback(problem, code, report) -> expert advice for the next turn, or None
    kit.tasks.rewards.JudgeReward(judge, rubric)  its score as a reward function (reward_model_for adds it)

The budget is a hard cap. Before each call the worst case of that call is reserved: every byte of the request
counted as a token (a token is never shorter than a byte) plus `max_tokens` of output, at the model's prices
from `PRICES`. A call goes out only when spent + reserved + this worst case stays within the cap (it waits while
calls in flight hold the room), so concurrent calls can never push the spend past it. After the call the
reservation is replaced by the real cost from the reply's `usage` (by the worst case when a timeout or an
unreadable reply leaves the billing unknown). The ledger is written to `<run_dir>/budget.json` after every
call, so a resumed run continues from what was already spent. A process that dies with calls in flight (a
crash, a killed runtime) never settles them, but its requests may have reached the API: whoever reads the ledger
next charges a dead process's reservations at their worst case (`crashed_usd`), so the cap holds across crashes.
The ledger counts `calls` (judge calls made), `requests` (HTTP requests, retries included), `billed_calls` (calls
charged: a reply, or an unknown bill) and `failed_calls`. A warning is logged at 80%; at the cap the judge stops,
says so once, and training goes on without it.

Identical requests within a run are answered from a cache and not paid twice. Each HTTP request may take
`timeout` seconds (config `judge_timeout_s`); rate limits, 5xx and timeouts are retried with the SDK's own
backoff (`max_retries`, config `judge_max_retries`), so one call waits at most about (retries + 1) x timeout.
After that, and for a malformed reply, the item is unscored (None) and training goes on. A circuit breaker keeps
an outage from holding training hostage: after `max_failures` failed calls in a row (`judge_max_failures`) the
judge is off for `cooldown_s` seconds (`judge_cooldown_s`), said in one line; calls in that time are unscored at
once, and the first call after it tries again (a success closes the breaker, a failure reopens it).

The API key comes from the argument, ANTHROPIC_API_KEY or Colab secrets, lives only inside the SDK client, and is
never printed, logged, written to the run directory, or given to generated code (the sandbox's environment is an
allow-list).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path

# USD per million tokens (input, output), matched by model-name prefix. The one place prices live.
PRICES = {
    "claude-opus-4": (15.00, 75.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-haiku-4": (1.00, 5.00),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-3-haiku": (0.25, 1.25),
}
_OVERHEAD_TOKENS = 64  # message framing beyond the text itself


def price_of(model: str) -> tuple[float, float]:
    for prefix in sorted(PRICES, key=len, reverse=True):
        if model.startswith(prefix):
            return PRICES[prefix]
    raise ValueError(f"no price for judge model {model!r}; add (input, output) USD per million tokens to "
                     f"kit.judge.judge.PRICES (known: {', '.join(PRICES)})")


class Budget:
    """A dollar ledger with reservations, kept in budget.json and shared by every process of a run.

    Each change happens under an exclusive lock (`flock` on budget.json.lock, plus a thread lock), reading the file
    first: the spend and the reservations of calls in flight are those of ALL processes (data-parallel training
    scores on each one), so the cap holds for the run, not per process. A reservation belongs to its process
    (pid, boot and start time, so a reused pid or a new machine is not mistaken for it); those of processes that no
    longer exist (a crash mid-call) are charged at their worst case when the ledger is next read."""

    def __init__(self, path: str | Path, cap_usd: float, warn_at: float = 0.8, log=print):
        if cap_usd < 0:
            raise ValueError(f"budget_usd={cap_usd}; it must be >= 0")
        self.path = Path(path)
        self.cap = float(cap_usd)
        self.warn_at = warn_at
        self.log = log
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self.spent, self.calls, self.input_tokens, self.output_tokens = 0.0, 0, 0, 0
        self.requests, self.billed_calls, self.failed_calls, self.crashed_usd = 0, 0, 0, 0.0
        self.reservations: dict[str, float] = {}
        with self._shared():  # a resumed run (or another process) continues the ledger
            pass
        self._warned = self.spent >= warn_at * self.cap

    @property
    def reserved(self) -> float:
        return sum(self.reservations.values())

    @contextlib.contextmanager
    def _shared(self, write: bool = False):
        """Hold the thread lock (the caller) and the file lock; load the ledger; write it back if asked."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            locked = _flock(lock, fcntl.LOCK_EX, self.log)
            try:
                charged = self._load()
                yield
                if write or charged:
                    self._write()
            finally:
                if locked:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _load(self) -> bool:
        """Read the ledger; charge dead processes' reservations at their worst case. True when it charged some."""
        if not self.path.exists():
            return False
        try:
            saved = json.loads(self.path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"the judge's ledger {self.path} is not valid JSON ({err.msg}); restore it from the "
                             "run's Drive copy: without it the spend so far is unknown") from None
        self.spent = float(saved.get("spent_usd", 0.0))
        self.calls = int(saved.get("calls", 0))
        self.input_tokens = int(saved.get("input_tokens", 0))
        self.output_tokens = int(saved.get("output_tokens", 0))
        self.requests = int(saved.get("requests", 0))
        self.billed_calls = int(saved.get("billed_calls", 0))
        self.failed_calls = int(saved.get("failed_calls", 0))
        self.crashed_usd = float(saved.get("crashed_usd", 0.0))
        self.reservations = {}
        charged = 0.0
        for owner, usd in saved.get("reserved_usd", {}).items():
            if _alive(owner):
                self.reservations[owner] = usd
            else:  # its calls may have reached the API and been billed: count the worst case
                charged += usd
        self.spent += charged
        self.crashed_usd += charged
        return charged > 0

    def reserve(self, usd: float) -> bool:
        """Reserve `usd`, waiting while calls in flight (of any process) hold the room; False once the spend
        itself leaves none."""
        me = _me()
        with self._settled:
            while True:
                with self._shared(write=True):
                    if self.spent + self.reserved + usd <= self.cap:
                        self.reservations[me] = self.reservations.get(me, 0.0) + usd
                        return True
                    if self.spent + usd > self.cap:
                        return False
                self._settled.wait(0.05)  # a settle here wakes us; another process's is seen on the next read

    def settle(self, reserved_usd: float, actual_usd: float, input_tokens: int = 0, output_tokens: int = 0,
               requests: int = 1, billed: bool = True, failed: bool = False) -> None:
        """Replace a reservation by what the call cost. `requests`: HTTP requests it took (retries included);
        `billed`: whether it may have been charged (a reply, or a timeout / unreadable reply; an error status
        costs nothing); `failed`: it gave no usable reply."""
        me = _me()
        with self._lock, self._shared(write=True):
            left = self.reservations.get(me, 0.0) - reserved_usd
            if left > 1e-12:
                self.reservations[me] = left
            else:
                self.reservations.pop(me, None)
            self.spent += actual_usd
            self.calls += 1
            self.requests += requests
            self.billed_calls += int(billed)
            self.failed_calls += int(failed)
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            warn = not self._warned and self.spent >= self.warn_at * self.cap
            self._warned = self._warned or warn
            self._settled.notify_all()
        if warn:
            self.log(f"[kit] judge budget: ${self.spent:.2f} of ${self.cap:.2f} spent ({self.warn_at:.0%} reached)")

    def _write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"cap_usd": self.cap, "spent_usd": round(self.spent, 9), "calls": self.calls,
                                   "requests": self.requests, "billed_calls": self.billed_calls,
                                   "failed_calls": self.failed_calls, "crashed_usd": round(self.crashed_usd, 9),
                                   "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                                   "reserved_usd": self.reservations,
                                   "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1))
        os.replace(tmp, self.path)


_NO_FLOCK_WARNED = False


def _flock(file, op: int, log) -> bool:
    """flock, or (on a file system without locks, e.g. some FUSE mounts) a one-time warning and False: the ledger
    is then safe within this process only, so keep a multi-process run's directory on a local disk."""
    global _NO_FLOCK_WARNED
    try:
        fcntl.flock(file, op)
        return True
    except OSError as e:
        if not _NO_FLOCK_WARNED:
            _NO_FLOCK_WARNED = True
            log(f"[kit] judge budget: this file system cannot lock {file.name} ({e}); the budget is exact for one "
                "process only. Keep the run directory on a local disk when training on several processes.")
        return False


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return ""


_BOOT = _boot_id()


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot, from /proc), or None: no such process, a zombie (it has
    exited; only its parent has not reaped it), or no /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in "ZX" else fields[19]


def _process_key(pid: int) -> str:
    """Who holds a reservation: `pid:boot:start` where /proc exists (a reused pid, or the same pid after a
    restart on a new machine, is another process), else the pid alone."""
    start = _start_time(pid)
    return f"{pid}:{_BOOT}:{start}" if start is not None and _BOOT else str(pid)


_KEYS: dict[int, str] = {}


def _me() -> str:
    pid = os.getpid()  # per call: a forked child is another owner
    if pid not in _KEYS:
        _KEYS[pid] = _process_key(pid)
    return _KEYS[pid]


def _alive(owner: str) -> bool:
    pid, *rest = owner.split(":")
    if rest:
        boot, start = rest
        return boot == _BOOT and _start_time(int(pid)) == start
    try:
        os.kill(int(pid), 0)  # PermissionError: alive, owned by another user
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Judge:
    def __init__(self, run_dir: str | Path, model: str = "claude-sonnet-4-5", budget_usd: float = 15.0,
                 max_tokens: int = 512, timeout: float = 30.0, max_retries: int = 2, api_key: str | None = None,
                 base_url: str | None = None, log=print, max_failures: int = 3, cooldown_s: float = 300.0):
        self.model, self.max_tokens, self.log = model, max_tokens, log
        self.prices = price_of(model)
        self.budget = Budget(Path(run_dir) / "budget.json", budget_usd, log=log)
        self._cache: dict[str, str] = {}
        self._cache_lock = threading.Lock()
        self.stopped = False
        self.max_failures, self.cooldown_s = max_failures, cooldown_s
        self._failures, self._off_until = 0, float("-inf")  # the circuit breaker: failures in a row, off until
        self._sent = threading.local()  # HTTP requests of this thread's call in flight (retries included)
        self.client = None
        if api_key is None:
            from kit.env import secret

            api_key = secret("ANTHROPIC_API_KEY")
        if not api_key:
            log("[kit] no ANTHROPIC_API_KEY: the LLM judge is off, training uses the rule-based reward")
            return
        try:
            import anthropic
        except ImportError:
            log("[kit] the anthropic package is not installed (pip install anthropic): the LLM judge is off")
            return
        counting = anthropic.DefaultHttpxClient(event_hooks={"request": [self._count_request]})
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout,
                                          max_retries=max_retries, http_client=counting)

    def _count_request(self, request) -> None:  # every attempt the SDK sends, its retries included
        self._sent.n = getattr(self._sent, "n", 0) + 1

    @property
    def enabled(self) -> bool:
        return self.client is not None and not self.stopped

    def worst_case_usd(self, system: str, prompt: str) -> float:
        tokens_in = len(system.encode()) + len(prompt.encode()) + _OVERHEAD_TOKENS
        return (tokens_in * self.prices[0] + self.max_tokens * self.prices[1]) / 1e6

    def ask(self, system: str, prompt: str) -> str | None:
        """The reply text, from the cache or one paid call; None when off, over budget, or the call failed."""
        if self.client is None:
            return None
        key = hashlib.sha256(json.dumps([self.model, self.max_tokens, system, prompt]).encode()).hexdigest()
        with self._cache_lock:
            if key in self._cache:
                return self._cache[key]
        if self.stopped or time.monotonic() < self._off_until:  # over budget, or the breaker is open
            return None
        worst = self.worst_case_usd(system, prompt)
        if not self.budget.reserve(worst):
            if not self.stopped:
                self.stopped = True
                self.log(f"[kit] judge budget cap reached (${self.budget.spent:.2f} spent of "
                         f"${self.budget.cap:.2f}): the judge stops, training continues without it")
            return None
        # until a reply says otherwise the call costs its worst case (a Ctrl-C mid-call included)
        actual, usage_in, usage_out, text, billed = worst, 0, 0, None, True
        self._sent.n = 0
        try:
            reply = self.client.messages.create(model=self.model, max_tokens=self.max_tokens, system=system,
                                                messages=[{"role": "user", "content": prompt}])
            usage_in, usage_out = int(reply.usage.input_tokens), int(reply.usage.output_tokens)
            actual = (usage_in * self.prices[0] + usage_out * self.prices[1]) / 1e6
            text = "".join(getattr(block, "text", "") for block in reply.content)
        except Exception as err:  # rate limit / 5xx / timeout after the SDK's retries, or a malformed reply
            import anthropic

            # an HTTP error status is not billed; a timeout or an unreadable reply may have been: count the
            # worst case, so the ledger is an upper bound and the cap holds whatever was billed
            billed = not isinstance(err, anthropic.APIStatusError)
            actual = worst if billed else 0.0
            self.log(f"[kit] judge call failed, item unscored: {type(err).__name__}")
            self._failed(err)
        finally:
            self.budget.settle(worst, min(actual, worst), usage_in, usage_out, requests=getattr(self._sent, "n", 0),
                               billed=billed, failed=text is None)
        if text is not None:
            with self._cache_lock:
                self._cache[key] = text
                self._failures = 0
        return text

    def _failed(self, err: Exception) -> None:
        """Count a failed call; the `max_failures`-th in a row opens the breaker for `cooldown_s` (one line)."""
        with self._cache_lock:
            self._failures += 1
            now = time.monotonic()
            opens = self._failures >= self.max_failures and now >= self._off_until
            if opens:
                self._off_until = now + self.cooldown_s
        if opens:
            self.log(f"[kit] judge: {self._failures} calls in a row failed (last: {type(err).__name__}); it is off "
                     f"for {self.cooldown_s:g} s (judge_cooldown_s): those items are unscored, training goes on, "
                     "then it is tried again")

    def score(self, rubric: str, text: str) -> float | None:
        """A score in [0, 1] for `text` against `rubric` (the judge answers 0-10), or None."""
        reply = self.ask(SCORE_SYSTEM, f"Rubric:\n{rubric}\n\nText to score:\n{text}\n\n"
                                       "End your reply with a line `SCORE: <number from 0 to 10>`.")
        return parse_score(reply) if reply is not None else None

    def feedback(self, problem: str, code: str, report: str) -> str | None:
        """Expert advice for the next turn of the code task (the paper's guided mode)."""
        return self.ask(FEEDBACK_SYSTEM, f"Problem:\n{problem}\n\nThe team's program:\n{code}\n\n"
                                         f"What happened when it ran:\n{report}\n\nGive brief, concrete advice.")


SCORE_SYSTEM = "You are a strict, fair grader. Judge only against the rubric."
FEEDBACK_SYSTEM = ("You review Python written by two collaborating programmers (a helper writing `aux` and a main "
                   "function that calls it). Point out the most important fixes in at most five short bullets. "
                   "Do not write the full solution.")
_SCORE = re.compile(r"score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*(\d+(?:\.\d+)?))?", re.I)


def parse_score(reply: str) -> float | None:
    """The last `SCORE: x` (or `x/10`, or JSON {"score": x}) in a reply, scaled to [0, 1]; None if absent."""
    found = _SCORE.findall(reply or "")
    if found:
        value, scale = found[-1]
        out_of = float(scale) if scale else 10.0
    else:
        try:
            value, out_of = json.loads(reply.strip())["score"], 10.0
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
    try:
        score = float(value) / out_of
    except (ValueError, ZeroDivisionError):
        return None
    return min(max(score, 0.0), 1.0)
