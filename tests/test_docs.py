"""The documentation a user reads (issue 75): a short README, a docs site that builds with --strict, every `kit` command
the README and the docs show accepted by the CLI, and the README's Python example running.

Run: python -m pytest tests/test_docs.py
"""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kit.__main__ import main as cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_fits_on_a_few_screens_and_says_what_why_and_how_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    first = "\n".join(lines[:40])
    assert "MAGRPO" in first and "colab.research.google.com" in first  # what, and the notebooks to start from
    assert not re.search(r"20\d\d-\d\d-\d\d", "\n".join(lines)), "a date in the README: true on one day only"


def test_the_docs_site_builds_strictly(tmp_path):
    """A broken link, a page missing from the nav or a placeholder the hook does not know fails the build."""
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    config = (tmp_path / "site" / "config" / "index.html").read_text()
    assert "learning_rate" in config and "{{" not in config  # the field reference was made from the code
    assert "coder_code" in (tmp_path / "site" / "results" / "index.html").read_text()  # bench/README.md inlined


def shown_commands() -> list[tuple[str, list[str]]]:
    """(page, argv) of every `kit ...` / `python -m kit ...` command in the bash blocks of the README and the docs
    (launcher prefixes and `&&` chains cut off, comments dropped)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    part = re.sub(r"\s+#.*$", "", part).strip()
                    m = re.search(r"(?:^|\s)(?:python3? -m kit|-m kit|kit)\s+(train|eval|baselines|schemes|report|compare)"
                                  r"\b(.*)$", part)
                    if m:
                        found.append((page.name, [m.group(1), *shlex.split(m.group(2))]))
    return found


def test_the_pages_show_commands_of_every_kind():
    kinds = {argv[0] for _, argv in shown_commands()}
    assert {"train", "eval", "baselines", "schemes", "report", "compare"} <= kinds
    assert len(shown_commands()) >= 20


@pytest.mark.parametrize("page, argv", shown_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_every_command_the_docs_show_is_accepted_by_the_cli(page, argv, tmp_path, monkeypatch, capsys):
    """A dry run: the arguments parsed, and for train the preset, the config file, the overrides and the task
    resolved; a renamed option, preset, field or task argument fails here."""
    monkeypatch.chdir(tmp_path)
    for flag, value in zip(argv, argv[1:]):
        if flag == "--config":  # the file a command names: an empty config (the preset and overrides are checked)
            Path(value).write_text("{}\n")
    try:
        code = cli([*argv, "--dry-run"])
    except SystemExit as stop:  # argparse refused it
        code = stop.code
    assert code == 0, f"{page}: kit {' '.join(argv)}\n{capsys.readouterr().err[-2000:]}"


def test_the_readmes_python_example_trains(tmp_path, monkeypatch):
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    code = block.replace('"num_steps=20"', '"num_steps=2", "progress=false", "eval_every=0"')
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["summary"]["steps"] == 2 if "steps" in scope["summary"] else True
    assert (tmp_path / "checkpoints" / "mine" / "metrics.jsonl").read_text().count("\n") == 2


def test_a_relative_data_path_resolves_in_data(tmp_path, monkeypatch):
    """task=rows file=my_rows.jsonl: as given from the current folder, else in data/ ($KIT_DATA_DIR), else bundled."""
    from kit.tasks.rows import bundled

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KIT_DATA_DIR", str(tmp_path / "mine"))
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_rows.jsonl").write_text('{"prompt": "hi"}\n')
    assert bundled("my_rows.jsonl") == str(tmp_path / "mine" / "my_rows.jsonl")
    (tmp_path / "my_rows.jsonl").write_text('{"prompt": "here"}\n')
    assert Path(bundled("my_rows.jsonl")).resolve() == (tmp_path / "my_rows.jsonl").resolve()  # as given first
    assert bundled("key_rows.jsonl").endswith("kit/data/key_rows.jsonl")  # the bundled file last
    assert (ROOT / "data" / "README.md").exists()
