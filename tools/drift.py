"""What would change if the pins moved to today's newest: resolve requirements-dev.txt afresh in a scratch venv,
print the version diff against constraints.txt, run the fast tests there (`-m "not slow"`), report.

    python tools/drift.py                       # diff + fast tests on the newest versions (torch kept at its pin)
    python tools/drift.py --update              # ... and, when they pass, write those versions to constraints.txt
    python tools/drift.py --torch latest        # let torch move too
    python tools/drift.py --tests tests/test_compiled_engine.py   # another selection of tests

Upgrading the pins is then one command and a reviewed diff (`git diff constraints.txt`), followed by the full
suite in the README's test command. The scratch venv is deleted afterwards unless --keep is given. Exit status:
0 when the tests pass (drift or not), 1 when they fail.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pin import CONSTRAINTS, ROOT, read_pins, render, resolve, scratch_env, torch_pin  # noqa: E402


def diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
    lines = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            lines.append(f"  {name:28s} {a or '(not pinned)':>14s} -> {b or '(not installed)'}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default=None, help="torch version (default: constraints.txt's pin); 'latest': newest")
    ap.add_argument("--tests", nargs="*", default=None, help='pytest arguments (default: -m "not slow")')
    ap.add_argument("--update", action="store_true", help="write the new versions to constraints.txt if tests pass")
    ap.add_argument("--keep", action="store_true", help="keep the scratch venv (its path is printed)")
    args = ap.parse_args(argv)
    torch = None if args.torch == "latest" else (args.torch or torch_pin())
    tmp = Path(tempfile.mkdtemp(prefix="kit-drift-"))
    try:
        t0 = time.time()
        python, new = resolve(tmp / "venv", torch, log=lambda s: print(s, flush=True))
        print(f"resolved {len(new)} packages in {time.time() - t0:.0f} s ({tmp / 'venv'})")
        changed = diff(read_pins(), new)
        print(f"\nagainst {CONSTRAINTS.name}: " + (f"{len(changed)} differ" if changed else "no drift"))
        if changed:
            print("\n".join(changed))
        pytest_args = args.tests if args.tests is not None else ["-m", "not slow"]
        cmd = [str(python), "-m", "pytest", "-q", *pytest_args]
        print("\n$ " + shlex.join(cmd), flush=True)
        t0 = time.time()
        tests = subprocess.run(cmd, cwd=ROOT, env=scratch_env(), text=True, capture_output=True)
        tail = [x for x in tests.stdout.splitlines() if x.strip()][-15:]
        print("\n".join(tail))
        ok = tests.returncode == 0
        print(f"\ndrift: {len(changed)} version(s) differ; fast tests on them "
              f"{'PASS' if ok else 'FAIL'} (exit {tests.returncode}, {time.time() - t0:.0f} s)")
        if args.update:
            if ok and changed:
                CONSTRAINTS.write_text(render(new, python))
                print(f"wrote {CONSTRAINTS}: review with git diff, run the full suite, commit")
            elif not ok:
                print(f"{CONSTRAINTS.name} left as it is: the tests fail on the new versions")
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
