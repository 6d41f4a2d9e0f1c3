"""The entry point's signature as a problem's prompt declares it, for prompts that tell an agent how to call aux
(`task_args.aux_signature: entry`, kit/tasks/code.py).

    entry_params('def f(a: int, *, key=1) -> int:', "f")     # "a, *, key"
    call_form("a, *, key")                                     # "a, key=key": how a call passes them on
"""

from __future__ import annotations

import ast
import re

from kit.tasks.codeparse import _parse as parse  # None where the code does not parse

def entry_params(prompt: str, entry_point: str) -> str | None:
    """The entry point's parameter names as the problem's prompt declares them (`def f(a: int, *xs)` -> "a, *xs"),
    or None when the prompt holds no readable `def entry_point(...)`. Read by the AST from the def's own lines (its
    signature may span several), never from the docstring."""
    lines = prompt.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", line):
            for j in range(i, min(i + 20, len(lines))):
                header = "\n".join(x.strip() for x in lines[i:j + 1])
                tree = parse(header + "\n    pass\n") or parse(header + "\n")  # the latter: `def f(a): return a`
                if tree is not None and tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = tree.body[0].args
                    names = [p.arg for p in a.posonlyargs + a.args]
                    names += [f"*{a.vararg.arg}"] if a.vararg else (["*"] if a.kwonlyargs else [])
                    names += [p.arg for p in a.kwonlyargs] + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
                    return ", ".join(names)
            # not a def that parses (a docstring's words, say): the next line that starts like one
    return None


def call_form(params: str) -> str:
    """How a call passes `entry_params`' names on: the keyword-only ones (after `*` or `*args`) by keyword
    (`a, *, key` -> `a, key=key`; `a, *xs, key` -> `a, *xs, key=key`)."""
    names = [p for p in params.split(", ") if p] if params else []
    star = next((k for k, n in enumerate(names) if n.startswith("*") and not n.startswith("**")), None)
    if star is None:
        return params
    kwonly = [n if n.startswith("**") else f"{n}={n}" for n in names[star + 1:]]
    return ", ".join(names[:star] + ([names[star]] if names[star] != "*" else []) + kwonly)
