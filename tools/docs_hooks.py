"""mkdocs hooks (mkdocs.yml `hooks:`): pages that are made from the code and files they describe, so they cannot drift.

    {{ config_reference }}       every TrainConfig field: its default and its one-line comment (kit/run/fields.py),
                                 by the section comments that group them, and the choices a field allows
    {{ presets }}                every preset and the fields it sets (kit/run/presets.py)
    {{ include bench/README.md }}   a file of the repository, inlined (the results page shows bench/README.md's tables)

Run: mkdocs build --strict (tests/test_docs.py does, from a fresh checkout too).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def config_reference() -> str:
    """The TrainConfig fields as markdown tables, one per section comment of kit/run/fields.py."""
    source = (ROOT / "kit" / "run" / "fields.py").read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainConfig")
    sys.path.insert(0, str(ROOT))
    try:
        from kit.run.fields import CHOICES
    except ImportError:
        CHOICES = {}
    finally:
        sys.path.pop(0)
    out, section = [], None
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign):
            continue
        above = lines[node.lineno - 2].strip()
        if above.startswith("# ---"):
            section = above.strip("# -")
            out += ["", f"### {section}", "", "| field | default | what it does |", "|---|---|---|"]
        line = lines[node.lineno - 1]
        comment = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        name = node.target.id
        default = ast.get_source_segment(source, node.value) if node.value is not None else ""
        default = re.sub(r"field\(default_factory=(\w+)\)", lambda m: {"dict": "{}", "list": "[]"}.get(m.group(1), m.group(1)),
                         default)
        choices = CHOICES.get(name)
        what = comment.replace("|", "\\|") + (f" (one of: {', '.join(map(str, choices))})" if choices else "")
        out.append(f"| `{name}` | `{default}` | {what} |")
    return "\n".join(out).strip() + "\n"


def presets() -> str:
    sys.path.insert(0, str(ROOT))
    try:
        from kit.run.presets import PRESETS
    finally:
        sys.path.pop(0)
    out = ["| preset | fields it sets |", "|---|---|"]
    for name, fields in PRESETS.items():
        sets = ", ".join(f"`{k}={v!r}`" for k, v in fields.items()).replace("|", "\\|")
        out.append(f"| `{name}` | {sets} |")
    return "\n".join(out) + "\n"


REPO_FILES = "https://github.com/magrpo-kit/magrpo-kit/blob/main/"  # where an included file's own links point


def include(path: str) -> str:
    """A repository file's text, its relative links made links to the repository (they are not pages of the site)."""
    folder = str(Path(path).parent)
    text = (ROOT / path).read_text()
    return re.sub(r"\]\((?!https?:|#)([^)\s]+)\)", lambda m: f"]({REPO_FILES}{folder}/{m.group(1)})", text)


def on_page_markdown(markdown: str, page=None, config=None, files=None) -> str:
    markdown = markdown.replace("{{ config_reference }}", config_reference())
    markdown = markdown.replace("{{ presets }}", presets())
    return re.sub(r"\{\{ include ([\w./-]+) \}\}", lambda m: include(m.group(1)), markdown)
