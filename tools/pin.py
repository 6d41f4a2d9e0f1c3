"""Pin the tested environment: resolve requirements-dev.txt afresh in a scratch venv and write constraints.txt.

    python tools/pin.py                  # newest of everything, torch kept at constraints.txt's pin
    python tools/pin.py --torch 2.14.0   # ... with another torch (a CPU wheel where one is served)

constraints.txt then holds the exact version of every package `pip install -r requirements-dev.txt` installed
(torch's own dependencies included; pip, setuptools and wheel, which a venv brings, excluded), and both README
commands and .ci/run install with `-c constraints.txt`. Review the change with `git diff constraints.txt` and run
the tests before committing it; `python tools/drift.py` does the same resolve and runs the fast tests in it first.

requirements*.txt keep lower bounds only: Colab installs requirements.txt over its own torch and packages and
must not be pinned to what a CPU machine resolved (see the install cell in notebooks/build_notebooks.py).
The resolve is for this machine's Python and platform (Linux x86-64 here); the header records both.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
DEFAULT_TORCH = "2.13.0"  # only when constraints.txt does not exist yet


def canonical(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash (how pip compares names)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """{canonical name: version} of a constraints file ('name==version' lines; comments and blanks skipped)."""
    pins = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, version = line.partition("==")
                pins[canonical(name)] = version.strip()
    return pins


def torch_pin() -> str:
    return read_pins().get("torch", DEFAULT_TORCH)


def scratch_env() -> dict:
    """The environment for the scratch venv's commands: nothing of an active venv or a PYTHONPATH leaks in."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd: list[str], log, **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    got = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=scratch_env(), text=True, capture_output=True, **kw)
    if got.returncode != 0:
        raise SystemExit(f"failed ({got.returncode}): {' '.join(map(str, cmd))}\n{got.stdout[-3000:]}{got.stderr[-3000:]}")
    return got


def resolve(where: Path, torch: str | None, log=print) -> tuple[Path, dict[str, str]]:
    """A fresh venv in `where` with torch (`torch==<torch>`, or the newest when None) and then requirements-dev.txt
    resolved with no constraints, the way a newcomer's pip would today. Returns (its python, {name: version})."""
    venv.create(where, with_pip=True, clear=True)
    python = where / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", "torch" if torch is None else f"torch=={torch}"], log)
    run([python, "-m", "pip", "install", "-q", "-r", ROOT / "requirements-dev.txt"], log)
    return python, freeze(python)


def freeze(python: Path) -> dict[str, str]:
    """{canonical name: version} installed in that venv, local labels dropped (torch 2.13.0+cpu -> 2.13.0, which
    the constraint `torch==2.13.0` matches: the CPU wheel where it is served, the plain one elsewhere)."""
    out = run([python, "-m", "pip", "freeze"], lambda *_: None).stdout
    pins = {}
    for line in out.splitlines():
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s+]+)(\+\S+)?", line.strip())
        if not m:
            raise SystemExit(f"pip freeze gave a line that is not name==version: {line!r}")
        pins[canonical(m.group(1))] = m.group(2)
    return pins


def render(pins: dict[str, str], python: Path) -> str:
    version = subprocess.run([str(python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    head = f"""\
# Exact versions of everything `pip install -r requirements-dev.txt` installs (requirements.txt's packages, the
# test tools, and all their dependencies; torch's too). Made by `python tools/pin.py` from a fresh resolve on
# {datetime.date.today().isoformat()} with Python {version} on {platform.system()} {platform.machine()}; do not edit by hand.
# Used by the README's two commands and .ci/run: pip install -r requirements-dev.txt -c constraints.txt
# torch=={pins.get('torch', '?')} is the CPU wheel here; `python tools/pin.py --torch X` moves it. Colab does not use this file.
# What newer versions would change, with the fast tests run on them: python tools/drift.py
"""
    return head + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--torch", default=None, help="torch version to pin (default: constraints.txt's, else "
                    f"{DEFAULT_TORCH}); 'latest' for the newest pip finds")
    ap.add_argument("--out", type=Path, default=CONSTRAINTS)
    args = ap.parse_args(argv)
    torch = None if args.torch == "latest" else (args.torch or torch_pin())
    with tempfile.TemporaryDirectory(prefix="kit-pin-") as tmp:
        python, pins = resolve(Path(tmp) / "venv", torch, log=lambda s: print(s, file=sys.stderr))
        args.out.write_text(render(pins, python))
    print(f"wrote {args.out}: {len(pins)} packages (torch=={pins.get('torch')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
