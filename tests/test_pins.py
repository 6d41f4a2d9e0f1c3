"""The pinned environment: constraints.txt pins everything the requirements name, the README's two commands and
.ci/run install with it, and .ci/run is the README's test command (no install, no network: reads files only).

Run: python -m pytest tests/test_pins.py
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from pin import canonical, read_pins  # noqa: E402


def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            names |= requirement_names(path.parent / line[3:].strip())
        elif line:
            names.add(canonical(re.match(r"[A-Za-z0-9._-]+", line).group(0)))
    return names


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Two commands"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_constraints_pin_every_requirement_exactly_and_torch_at_the_cpu_pin():
    pins = read_pins(ROOT / "constraints.txt")
    assert pins["torch"] == "2.13.0"
    missing = requirement_names(ROOT / "requirements-dev.txt") - set(pins)
    assert not missing, f"not in constraints.txt (run python tools/pin.py): {sorted(missing)}"
    for name, version in pins.items():
        assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?", version), f"{name}=={version}: not exact"


def test_requirements_stay_lower_bounds_for_colab():
    for path in ("requirements.txt", "requirements-dev.txt"):
        for line in (ROOT / path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            assert "==" not in line and "<" not in line, f"{path}: {line} (pins belong in constraints.txt)"


def test_readme_commands_install_with_the_constraints_and_ci_runs_the_test_command():
    demo, real, tests = readme_commands()  # the tiny demo, the same with SmolLM2, the tests
    assert real.startswith("kit train --preset smol_writing")
    assert "pip install -e . -c constraints.txt" in demo and "&& kit train" in demo  # the package, its command
    assert '-e ".[dev]" -c constraints.txt' in tests and tests.endswith("python -m pytest")
    ci = [x for x in (ROOT / ".ci" / "run").read_text().splitlines() if x.strip() and not x.startswith("#")]
    assert tests in ci, ".ci/run must run exactly the README's test command"
