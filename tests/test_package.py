"""The kit as an installable package (issue 34): pyproject.toml's metadata agrees with the requirement files, the
console command is `kit`, the data the tasks read ships inside the package, and a wheel installed into a fresh
virtual environment trains the tiny demo from another directory.

Run: python -m pytest tests/test_package.py
"""

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def own_lines(path: Path) -> list[str]:
    """A requirements file's requirements, comments and `-r` includes left out."""
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("-r ")]


def test_the_distribution_is_magrpo_kit_with_the_console_command_kit():
    project = pyproject()["project"]
    assert project["name"] == "magrpo-kit"
    assert project["scripts"] == {"kit": "kit.__main__:main"}
    from kit.__main__ import main

    assert callable(main)


def test_dependencies_are_requirements_txt_and_the_dev_extra_is_requirements_dev_txt():
    data = pyproject()
    assert data["tool"]["setuptools"]["dynamic"]["dependencies"] == {"file": ["requirements.txt"]}
    assert data["project"]["optional-dependencies"]["dev"] == own_lines(ROOT / "requirements-dev.txt")
    torch = [r for r in own_lines(ROOT / "requirements.txt") if r.startswith("torch")]
    assert torch and re.fullmatch(r"torch>=[\d.]+", torch[0])  # a lower bound only: Colab keeps its own torch


def test_the_data_the_tasks_read_is_inside_the_package():
    from kit.tasks import code, writing

    for folder in (code.DATA_DIR, writing.DATA_DIR):
        assert Path(folder).resolve() == ROOT / "kit" / "data"
    shipped = pyproject()["tool"]["setuptools"]["package-data"]["kit"]
    for f in (ROOT / "kit" / "data").iterdir():
        assert any(Path(f.relative_to(ROOT / "kit")).match(pattern) for pattern in shipped), f
    # data/ at the top is the user's own (data/README.md): no bundled file is read from there, none is copied there
    assert not any((ROOT / "data" / f.name).exists() for f in (ROOT / "kit" / "data").iterdir())


@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_trains_the_tiny_demo_from_another_directory(tmp_path):
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and *.egg-info there
    shutil.copytree(ROOT / "kit", src / "kit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "requirements.txt"):
        shutil.copy(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")} | {"OMP_NUM_THREADS": "1"}
    run = dict(capture_output=True, text=True, env=env, timeout=300)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                            "-w", str(tmp_path / "dist")], **run)
    assert built.returncode == 0, built.stderr
    # a fresh venv that reuses this environment's packages (torch ...) through a .pth file, installed offline:
    # pip checks that every dependency the wheel names is there
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, **run)
    python = tmp_path / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, **run).stdout.strip()
    Path(purelib, "_reuse.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    wheel = next((tmp_path / "dist").glob("magrpo_kit-*.whl"))
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", str(wheel)], **run)
    assert installed.returncode == 0, installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trained = subprocess.run([str(tmp_path / "venv" / "bin" / "kit"), "train", "--preset", "tiny_cpu", "--set",
                              "num_steps=2", "--set", "eval_every=0", "--set", "progress=false", "--run-dir", "demo"],
                             cwd=elsewhere, **run)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert "trained 2 steps" in trained.stdout and (elsewhere / "demo" / "ckpt").is_dir()
    where = subprocess.run([str(python), "-c", "import kit; from kit.tasks.code import coop_problems; "
                            "print(kit.__file__); print(len(coop_problems()))"], cwd=elsewhere, **run)
    assert where.returncode == 0, where.stderr[-2000:]
    path, count = where.stdout.split()
    assert path.startswith(purelib) and int(count) == 47  # the installed kit, its bundled problems
