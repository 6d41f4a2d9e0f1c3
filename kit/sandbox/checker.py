"""The sandbox's trusted side: runs the tests and decides, calling into the untrusted runner only for values.

kit/sandbox/sandbox.py starts it as `python -I -S -B -c <kit/sandbox/wire.py + this file> <socket_fd> <undumpable>` as
the caller's own user (never inside the runner's user or namespaces) and keeps it for many programs, one at a
time: each job (the tests, the setup, the problem's own context code, the names of the functions under test, the
limits) comes over the socket with the two pipe ends of that program's fresh runner. Nothing of one job is kept
for the next but the modules the tests imported; a checker that timed out or failed is never reused.

In its namespace each function under test is a stub that sends the call's arguments to the runner and rebuilds
the reply with the wire module's strict decoder, so the tests, the expected values and every comparison live here,
where the generated program has no object, frame, file or memory. It reports one line per test to the caller:
`["test", i, ok, reason]`, then `["done", violation]`. A reply that says the runner refused an operation or hit a
resource limit, or the runner ending or breaking the channel, marks the run as a violation and stops the tests. A
runner that does not answer within its time limit (a long call in C takes no alarm; a program that ignores it)
stops the tests too, but is a timeout: the tests before it keep their result, the rest fail.
"""
import builtins, os, resource, select, signal, socket, sys, time

_GRACE = 1.0  # seconds the runner has, past a call's budget, to reply "timeout" itself


class _Timeout(BaseException):
    pass


class _Stop(BaseException):
    """The runner is gone or broke the rules: no test after this one runs."""


def _on_alarm(signum, frame):
    raise _Timeout()


class Runner:
    """The calls channel to the untrusted runner, and what it has done so far."""

    def __init__(self, calls_fd, replies_fd):
        self.calls_fd, self.replies_fd = calls_fd, replies_fd
        self.pending = b""
        self.violation = ""  # why this run earns no test credit ("" while nothing happened)
        self.ended = ""  # why no further test can run (a violation, or a runner that stopped answering)
        self.deadline = 0.0  # the current test's end: calls get the time that is left
        self.lost = False  # a test's own alarm cut a call short: its reply would answer the next call

    def read(self, timeout, limit=8 << 20):
        """The next message, or None when nothing whole came in time. EOF and garbage are violations."""
        end = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.replies_fd], [], [], left)[0]:
                return None
            chunk = os.read(self.replies_fd, 1 << 16)
            if not chunk:
                self.stop("the program ended its process before the tests were done")
            self.pending += chunk
            if len(self.pending) > limit:
                self.stop("the program sent a reply of more than 8 MB")
        line, self.pending = self.pending.split(b"\n", 1)
        try:
            message = loads(line)
        except (ValueError, RecursionError):
            message = None
        if type(message) is not list or not message or type(message[0]) is not str:
            self.stop("the program wrote something that is not a reply on the result channel")
        if message[0] == "violation":
            self.stop(f"refused: {message[1] if len(message) > 1 else '?'}")
        return message

    def close_calls(self):
        if self.calls_fd >= 0:
            os.close(self.calls_fd)
            self.calls_fd = -1

    def close(self):
        self.close_calls()
        if self.replies_fd >= 0:
            os.close(self.replies_fd)
            self.replies_fd = -1

    def stop(self, why, violation=True):
        if violation:
            self.violation = self.violation or str(why)[:300]
        self.ended = self.ended or str(why)[:300]
        raise _Stop(self.ended)

    def drain(self):
        """After the last test: close the calls channel (the runner then exits) and read what it still sent, so a
        refused operation after its last answer (replies written ahead of the calls) is seen too."""
        self.close_calls()
        data, end = self.pending, time.monotonic() + 1.0
        while len(data) <= 8 << 20 and select.select([self.replies_fd], [], [], max(0.0, end - time.monotonic()))[0]:
            chunk = os.read(self.replies_fd, 1 << 16)
            if not chunk:
                break  # the runner ended, as it should once the calls channel is closed
            data += chunk
        for line in data.split(b"\n"):
            if line.startswith(b'["violation"'):
                try:
                    why = loads(line)[1]
                except (ValueError, RecursionError, IndexError):
                    why = "?"
                self.violation = self.violation or f"refused: {why}"[:300]
                return

    def start(self, top_level_budget):
        """Wait for the program's top level: "" when it ran, else why not (a violation raises _Stop)."""
        message = self.read(top_level_budget + _GRACE)
        if message is None:
            self.stop("the program's top level did not stop at its time limit", violation=False)
        if message == ["ready"]:
            return ""
        if message[0] == "error" and len(message) == 2:
            return str(message[1])[:400]
        self.stop("the program wrote something that is not a reply on the result channel")

    def call(self, name, args, kwargs):
        if self.ended:
            raise _Stop(self.ended)
        if self.lost:
            raise _Timeout()
        budget = max(0.01, self.deadline - time.monotonic())
        try:
            os.write(self.calls_fd, dumps(["call", name, encode(args), encode(kwargs), budget]))
        except ValueError as e:
            raise TypeError(f"the sandbox cannot pass these arguments to {name}: {e}") from None
        except OSError:
            self.stop("the program ended its process before the tests were done")
        try:
            message = self.read(budget + _GRACE)
        except _Timeout:
            self.lost = True
            raise
        if message is None:
            self.stop(f"timeout: {name} did not stop at its time limit", violation=False)
        kind = message[0]
        if kind == "ok" and len(message) == 2:
            try:
                return decode(message[1])
            except (Exception, RecursionError) as e:  # whatever the bytes are, a failed test, never a crash
                raise TypeError(f"{name} returned a value that could not be read back: {e}") from None
        if kind == "timeout":
            raise _Timeout()
        if kind == "raise" and len(message) == 3:
            raise _exception(str(message[1]), str(message[2]))
        self.stop("the program wrote something that is not a reply on the result channel")


class SandboxError(Exception):
    """An exception of a type that is not a builtin one, raised by the function under test."""


def _exception(type_name, text):
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(text)
        except BaseException:
            pass
    return SandboxError(f"{type_name}: {text}")


def __kit_eq__(a, b):
    if a == b:
        return True
    raise AssertionError(f"{repr(a)[:150]} != {repr(b)[:150]}")


def _describe(e, test_timeout):
    if isinstance(e, _Timeout):
        return f"timeout after {test_timeout:.1f} s"
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def main():
    """Serve jobs until the caller closes the socket: each comes as its length and the runner's two pipe ends
    (SCM_RIGHTS), then the job; the report goes back on the socket, ending with a `done` line."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    if sys.argv[2] == "1":  # the runner is this user: no ptrace of this process, no /proc/<pid>/mem
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    signal.signal(signal.SIGALRM, _on_alarm)
    while True:
        head, fds, _, _ = socket.recv_fds(sock, 8, 2)
        while head and len(head) < 8:
            head += sock.recv(8 - len(head))
        if len(head) < 8 or len(fds) != 2:
            return  # the caller is gone
        size, data = int.from_bytes(head, "big"), b""
        while len(data) < size:
            chunk = sock.recv(min(1 << 20, size - len(data)))
            if not chunk:
                return
            data += chunk
        runner = Runner(*fds)
        try:
            check(loads(data), runner, lambda *message: sock.sendall(dumps(list(message))))
        finally:
            runner.close()


def check(job, runner, report):
    """One program's tests, calling into `runner`; the report goes through `report`."""
    limit = job["test_timeout"]
    # what the program sends back is bounded on the wire; what the tests make of it, here
    resource.setrlimit(resource.RLIMIT_AS, (job["memory_mb"] << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))

    def stub(name):
        def call(*args, **kwargs):
            return runner.call(name, args, kwargs)
        call.__name__ = call.__qualname__ = name
        return call

    def timed(code, ns):
        runner.deadline = time.monotonic() + limit
        signal.setitimer(signal.ITIMER_REAL, limit + 2 * _GRACE)  # the test's own code, past the runner's share
        try:
            exec(code, ns)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    tests, done = job["tests"], 0
    try:
        error = runner.start(limit)
        ns = {"__name__": "__check__"}
        if not error and job["context"]:
            try:  # the problem's own definitions (helpers the tests use): never replaced by the program's
                timed(compile(job["context"], "<context>", "exec"), ns)
            except (Exception, _Timeout) as e:
                error = "the problem's context raised " + _describe(e, limit)
        # the functions under test, and the other free names of the tests that nothing here defines (the kit
        # picked them: never a builtin or a dunder), call into the runner; the program names nothing
        ns.update({name: stub(name) for name in job["free_names"] if name not in ns})
        ns.update({name: stub(name) for name in job["call_names"]})
        ns["__kit_eq__"] = __kit_eq__
        if not error and job["setup"]:
            try:
                timed(compile(job["setup"], "<setup>", "exec"), ns)
            except (Exception, _Timeout) as e:
                error = "setup raised " + _describe(e, limit)
        report("program", error)
        for i, test in enumerate(tests):
            if error:
                report("test", i, False, error)
                done += 1
                continue
            try:
                timed(compile(test, f"<test {i}>", "exec"), ns)
                ok, why = True, ""
            except _Stop:
                raise
            except (Exception, _Timeout) as e:
                ok, why = False, _describe(e, limit)
            if runner.ended:  # a test that swallowed the _Stop
                raise _Stop(runner.ended)
            report("test", i, ok, why)
            done += 1
    except _Stop:
        for i in range(done, len(tests)):
            report("test", i, False, f"not run: {runner.ended}")
    if not runner.ended:
        runner.drain()
    report("done", runner.violation)


if __name__ == "__main__":
    main()
