"""The sandbox's untrusted side: runs the generated program and answers the checker's calls with plain data.

kit/sandbox/sandbox.py starts it as `python -I -S -B -X utf8 -c <kit/sandbox/wire.py + this file> <calls_fd> <replies_fd>`
(so `encode`, `decode`, `dumps` and `loads` come from the wire module's source, sent first), usually as an
unprivileged user of its own in fresh namespaces, and writes the job (program, limits, workdir) to its stdin.

It never sees a test, an expected value or a verdict. After its limits and guards are in place it runs the
program's top level, then loops: read a call (function name, arguments as data, time budget), run it under an
alarm, reply with the value as data, or the exception's type and message, or "timeout". Anything the program does
to this process (rebinding the harness, walking frames, writing to the reply pipe) can only change the values it
answers, which it could compute anyway; the checker decides.

The audit hook and the limits here are not the wall (the separate user, the namespaces and the checker are): they
name what the program tried. The first refused operation writes `["violation", why]` and ends the process at once,
so an attempt cannot be caught and followed by correct answers; the run then earns no test credit.
"""
import builtins, os, resource, signal, sys

VIOLATION_EXIT = 86  # the exit status of a run ended by a refused operation


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _guard(reply_fd, read_roots, write_root):
    """Install the audit hook. Everything it calls is bound here, so the program cannot rebind it, and nothing
    here is returned or stored: a Python function the program can reach can be rewritten (its code, defaults and
    closure cells are writable), the hook cannot. The harness reports through the hook too, with
    `sys.audit("kit.violation", why)` held in a functools.partial, which is immutable."""
    write, exit_, str_, bytes_, int_, tuple_, type_ = os.write, os._exit, str, bytes, int, tuple, type
    getcwd, encode_str, translate = os.getcwd, str.encode, bytes.translate
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    read_files = ("/dev/null", "/dev/urandom", "/etc/localtime")
    refused = ("os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.system", "os.kill",
               "os.killpg", "os.startfile", "os.setuid", "os.setgid", "os.setreuid", "os.setresuid", "subprocess.",
               "socket.", "ctypes.", "pty.", "gc.get_", "sys._current_", "sys.settrace", "sys.setprofile",
               "sys.addaudithook", "resource.setrlimit", "resource.prlimit", "_thread.start_new_thread",
               "signal.pthread_kill", "os.chroot", "mmap.", "winreg.", "sys.remote_exec", "cpython.", "os.unshare",
               "os.setns", "os.symlink", "os.link")  # links: a relative symlink chain defeats the path checks
    # builtin modules that act without an audit event (fork_exec, raw memory, sockets) may not be loaded
    modules = ("_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket", "_testcapi", "_testinternalcapi",
               "_testmultiphase", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_thread",
               "_multiprocessing", "_posixshmem", "multiprocessing", "mmap", "pty")
    path_events = ("os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.utime",
                   "os.mkdir", "shutil.rmtree", "os.chdir", "os.chflags", "os.lchflags", "os.lchmod", "os.lchown",
                   "os.mkfifo", "os.mknod", "shutil.chown")
    # the reason goes out as a JSON string: printable ASCII without quote or backslash, nothing to escape
    unsafe = bytes(c for c in range(256) if not 32 <= c < 127 or c in b'"\\')

    # Nothing below may run the program's code: every value is checked to be an exact str, bytes, int or None
    # before it is used (a subclass, a metaclass `__name__` or a PathLike would call back into the program while
    # this hook is on the stack, and from there its frames and closures could be rewritten), and nothing here
    # calls a module attribute the program could rebind (json.dumps, say).
    def violation(why):
        try:
            text = translate(encode_str(why[:300], "ascii", "replace"), None, unsafe)
            write(reply_fd, b'["violation","' + text + b'"]\n')
        finally:
            exit_(VIOLATION_EXIT)

    def normal(path):
        # a lexical absolute path, or None (links cannot be made, so the text is the path)
        t = type_(path)
        if t is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif t is not str_:
            return None
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        parts = []
        for part in path.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def under(path, roots):
        p = normal(path)
        if p is None:
            return False
        for r in roots:
            if p == r or p.startswith(r + "/"):
                return True
        return False

    def shown(x):
        t = type_(x)
        return x[:200] if t is str_ else x[:200].decode("utf-8", "replace") if t is bytes_ else "(not a str)"

    def hook(event, args):
        try:
            check(event, args)
        except BaseException:  # never a traceback (its frames would lead back here), never a way out
            exit_(VIOLATION_EXIT)

    def check(event, args):
        if type_(args) is not tuple_:
            violation("odd audit arguments")
        if event == "kit.violation":
            violation(args[0] if args and type_(args[0]) is str_ else "?")
        elif event == "open":
            if len(args) != 3:
                violation("odd audit arguments")
            path, mode, flags = args
            if type_(path) is int_:
                return
            if not (mode is None or type_(mode) is str_) or not (flags is None or type_(flags) is int_):
                violation("odd audit arguments")
            writing = ((flags or 0) & write_flags) != 0 or (mode is not None and (
                "w" in mode or "a" in mode or "x" in mode or "+" in mode))
            if writing and under(path, (write_root,)):
                return
            if not writing and ((type_(path) is str_ and path in read_files) or under(path, read_roots)):
                return
            violation(("writing " if writing else "reading ") + shown(path))
        elif event == "import":
            if not args or type_(args[0]) is not str_ or args[0] in modules:
                violation("importing " + (shown(args[0]) if args else "?"))
        elif event.startswith(refused):
            violation(event)
        elif event in path_events:
            for a in args:
                if type_(a) is not int_ and a is not None and not under(a, (write_root,)):
                    violation(event + " outside the working directory")
        elif event in ("os.listdir", "os.scandir") and args and args[0] is not None and type_(args[0]) is not int_ \
                and not under(args[0], read_roots):
            violation("listing " + shown(args[0]))

    sys.addaudithook(hook)


def main():
    calls_fd, reply_fd = int(sys.argv[1]), int(sys.argv[2])
    job = loads(sys.stdin.buffer.read())
    sys.stdin.close()
    if job["workdir"]:  # a fresh /tmp of its own (mount namespace): the directory is made here, as this user
        os.mkdir(job["workdir"], 0o700)
        os.chdir(job["workdir"])
    limits, workdir = job["limits"], os.getcwd()
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH="/usr/bin:/bin")

    mb, cpu = 1 << 20, int(job["wall"]) + 1
    for res, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, limits["memory_mb"] * mb),
                       (resource.RLIMIT_FSIZE, limits["file_mb"] * mb), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NOFILE, limits["max_open_files"]), (resource.RLIMIT_NPROC, 1)):
        hard = resource.getrlimit(res)[1]  # threads count as processes: NPROC 1 leaves this one alone
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (value, value))
    signal.signal(signal.SIGALRM, _on_alarm)

    roots = {workdir, "/usr/share/zoneinfo"}
    for p in sys.path:  # with -S: the standard library only, so no installed package (or its data) is readable
        if p and os.path.isdir(p):
            roots.update({os.path.abspath(p), os.path.realpath(p)})
    import _thread  # loaded at start-up already; imported before the guard, which refuses loading it
    from functools import partial

    _guard(reply_fd, tuple(sorted(roots)), workdir)
    report = partial(sys.audit, "kit.violation")  # a local that no nested function captures: not rewritable
    signal.signal(signal.SIGXFSZ, partial(report, "file size limit"))  # even if the program catches the error
    # the audit event for threads is Python 3.13+; the process limit refuses the thread anyway
    _thread.start_new_thread = _thread.start_new = partial(report, "starting a thread")

    # the harness keeps its own references: the program may rebind builtins and modules
    write, read, exit_, setitimer, ITIMER_REAL = os.write, os.read, os._exit, signal.setitimer, signal.ITIMER_REAL
    BaseException_, MemoryError_, type_, str_, len_ = BaseException, MemoryError, type, str, len
    exec_, compile_, encode_, decode_, dumps_, loads_, Timeout = exec, compile, encode, decode, dumps, loads, _Timeout
    saved_builtins = dict(builtins.__dict__)

    builtins.exit = builtins.quit = None

    def reply(message):
        line = dumps_(message)
        if len_(line) > 8 << 20:  # the checker reads no more: too large to check is a failed test, not a breach
            line = dumps_(["raise", "ValueError", "the returned value is too large to check (over 8 MB)"])
        write(reply_fd, line)

    def describe(e):
        try:  # the nearest builtin class: the checker raises that (a test's `except ValueError` catches it)
            name = next(c.__name__ for c in type_(e).__mro__ if c.__module__ == "builtins")
            text = str_(e) if type_(e).__module__ == "builtins" else f"{type_(e).__name__}: {e}"
            return [name[:100], text[:300]]
        except BaseException_:
            return ["Exception", "an exception that could not be described"]

    def timed(fn, budget):
        # a repeating alarm: a bare `except:` in the program swallows one, the next one still lands
        setitimer(ITIMER_REAL, budget, 0.05)
        try:
            return fn()
        finally:
            setitimer(ITIMER_REAL, 0)
            builtins.__dict__.clear()
            builtins.__dict__.update(saved_builtins)

    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        timed(lambda: exec_(compile_(job["program"], "<program>", "exec"), ns), limits["test_timeout"])
        reply(["ready"])
    except Timeout:
        reply(["error", f"the program's top level ran past {limits['test_timeout']:.1f} s"])
    except MemoryError_:
        report("memory limit")
    except BaseException_ as e:
        reply(["error", ": ".join(x for x in describe(e) if x)])
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = read(calls_fd, 1 << 16)
            if not chunk:
                exit_(0)  # the checker is done
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        _, name, args, kwargs, budget = loads_(line)
        try:
            if name not in ns:
                raise NameError(f"name {name!r} is not defined")
            fn = ns[name]
            args, kwargs = decode_(args), decode_(kwargs)
            value = timed(lambda: encode_(fn(*args, **kwargs)), budget)
            message = ["ok", value]
        except Timeout:
            message = ["timeout"]
        except MemoryError_:
            report("memory limit")
        except BaseException_ as e:
            message = ["raise", *describe(e)]
        reply(message)


if __name__ == "__main__":
    main()
