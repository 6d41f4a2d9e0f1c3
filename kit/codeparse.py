"""Reading generated code: pull the code out of a completion, find functions, and see how main uses aux.

    extract_code(text) -> str                 code from fenced blocks, prose and chat markers stripped
    function_info(code, name) -> (defined, returns_value)
    drop_function(code, name) -> str          the code without a top-level def of `name`
    aux_use(main_code, entry_point) -> AuxUse how the entry point uses aux: calls, thin wrapper, ignored results

Everything here is static: nothing is executed. `aux_use` reads the AST and follows simple aliases (`h = aux`),
calls through lambdas and nested functions, and aux passed as a value (`map(aux, xs)`); a local rebinding of
the name `aux` (a parameter or assignment) shadows the helper. The cooperation schemes (issue 5) build on it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

AUX = "aux"

# End-of-turn markers cut the text; other chat markers are removed.
_END_MARKERS = re.compile(r"<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<\|end\|>|</s>|<eos>")
_MARKERS = re.compile(r"<\|[^|>\n]{1,40}\|>|\[/?INST\]|<s>")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_CODE_START = re.compile(r"(async\s+def|def|class|import|from|@)\b")


def extract_code(text: str) -> str:
    """The Python code in a completion: fenced blocks if any, else the text from the first def/import on,
    with chat markers and trailing prose removed. Returns "" when there is no code at all."""
    text = _END_MARKERS.split(text, maxsplit=1)[0]
    text = _MARKERS.sub("", text)
    blocks = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("", "python", "py", "python3")]
    if blocks:
        text = "\n\n".join(b.strip("\n") for b in blocks)
    return _trim_prose(text.replace("\r\n", "\n").expandtabs(4))


def _is_prose(line: str) -> bool:
    """An unindented line that is not Python and reads like words ("This function returns ...")."""
    if not line or line[0].isspace() or line.lstrip().startswith("#") or _CODE_START.match(line):
        return False
    if len(line.split()) < 2 or not re.match(r"[A-Za-z*`-]", line):
        return False
    try:
        ast.parse(line)
        return False
    except SyntaxError:
        return True


def _trim_prose(text: str) -> str:
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return text.strip() if not any(_is_prose(line) for line in lines) else ""
    kept = []
    for line in lines[start:]:
        if _is_prose(line):
            break
        kept.append(line)
    return "\n".join(kept).strip("\n") + "\n"


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _top_function(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            found = node  # the last definition wins, as at run time
    return found


def function_info(code: str, name: str) -> tuple[bool, bool]:
    """(is `name` defined at top level, does its body return a value). Falls back to reading lines when the
    code does not parse, so structure can be credited before syntax is checked."""
    tree = _parse(code)
    if tree is not None:
        fn = _top_function(tree, name)
        if fn is None:
            return False, False
        returns = any(isinstance(n, ast.Return) and n.value is not None for n in _walk_own(fn))
        return True, returns
    lines = code.split("\n")
    for i, line in enumerate(lines):
        if re.match(rf"(async\s+)?def\s+{re.escape(name)}\s*\(", line):
            body = []
            for nxt in lines[i + 1:]:
                if nxt.strip() and not nxt[0].isspace():
                    break
                body.append(nxt)
            return True, any(re.match(r"\s+return\s*[^\s#]", b) for b in body)
    return False, False


def _walk_own(fn: ast.AST):
    """Nodes of a function's body, not descending into nested functions, classes or lambdas."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def drop_function(code: str, name: str) -> str:
    """`code` without its top-level definitions of `name` (decorators included); unchanged if it does not parse."""
    tree = _parse(code)
    if tree is None:
        return code
    lines = code.split("\n")
    cut = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            cut.update(range(first - 1, node.end_lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in cut)


@dataclass
class AuxUse:
    """How the entry point uses aux (all False/0 when main is missing or does not parse)."""

    calls: int = 0  # calls to aux (or an alias), plus aux passed as a value (map(aux, xs), key=aux)
    wrapper: bool = False  # main's body only returns aux's result, its arguments passed straight through
    ignored: bool = False  # an aux result is thrown away: a bare call statement, or a variable never read
    shadowed: bool = False  # main rebinds the name aux locally, so the helper is not what it calls

    @property
    def uses(self) -> bool:
        return self.calls > 0 and not self.shadowed


def aux_use(main_code: str, entry_point: str, aux: str = AUX) -> AuxUse:
    tree = _parse(main_code)
    fn = _top_function(tree, entry_point) if tree is not None else None
    if fn is None:
        return AuxUse()
    names, shadowed = helper_aliases(fn, {aux})
    calls = len(helper_uses(fn, names))
    wrapper = calls > 0 and is_wrapper(body_without_docstring(fn), names)
    return AuxUse(calls, wrapper, calls > 0 and _ignores(fn, names), aux in shadowed)


def helper_aliases(fn, helpers: set[str]) -> tuple[set[str], set[str]]:
    """(the names through which `fn` reaches a helper, the helpers it shadows). A helper is shadowed when `fn`
    rebinds its name (a parameter, an assignment, a nested def); the others reach it, and so do their aliases,
    followed to a fixed point: `h = aux`, `g = h`, `a = b = aux`. The one alias rule of the reward (aux_use) and
    of the scheme detector (kit/schemes.py)."""
    params = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    rebound = set(params)
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not fn:
            rebound.add(node.name)
        elif isinstance(node, ast.Assign) and not (isinstance(node.value, ast.Name) and node.value.id in helpers):
            rebound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    names = helpers - rebound
    changed = True
    while changed:
        changed = False
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id not in names:
                        names.add(t.id)
                        changed = True
    return names, helpers & rebound


def helper_uses(fn, names: set[str]) -> list[ast.Name]:
    """Every read of one of `names` in `fn` (a call, or the helper passed as a value), except as the source of an
    alias (`h = aux` is not a use; `h(x)` is)."""
    alias_sources = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)}
    return [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
            and id(n) not in alias_sources]


def calls_one_of(node, names) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names


def passthrough(call: ast.Call) -> bool:
    """Arguments are plain names or constants: nothing is computed before handing over to aux."""
    args = list(call.args) + [k.value for k in call.keywords]
    return all(isinstance(a, (ast.Name, ast.Constant)) or
               (isinstance(a, ast.Starred) and isinstance(a.value, ast.Name)) for a in args)


def body_without_docstring(fn) -> list[ast.stmt]:
    """A function's statements without its docstring and `pass`."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Pass)]


def is_wrapper(body: list[ast.stmt], names) -> bool:
    """The body only returns a helper's result (directly, or through one variable), its arguments passed as they
    came: `return aux(x)`, or `r = aux(x)` then `return r`."""
    body = [s for s in body if not (isinstance(s, ast.Assign) and isinstance(s.value, ast.Name)
                                    and s.value.id in names)]  # aliases such as h = aux
    if len(body) == 1 and isinstance(body[0], ast.Return) and calls_one_of(body[0].value, names):
        return passthrough(body[0].value)
    if len(body) == 2 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1 \
            and isinstance(body[0].targets[0], ast.Name) and calls_one_of(body[0].value, names) \
            and isinstance(body[1], ast.Return) and isinstance(body[1].value, ast.Name) \
            and body[1].value.id == body[0].targets[0].id:
        return passthrough(body[0].value)
    return False


def _ignores(fn, names) -> bool:
    loaded = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Expr) and calls_one_of(node.value, names):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and calls_one_of(node.value, names):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if all(isinstance(t, ast.Name) and t.id not in loaded for t in targets):
                return True
    return False
