"""Reading generated code: pull the code out of a completion, find functions, and see how main uses aux.

    extract_code(text) -> str                 the Python in a completion: fenced blocks, or the lines that parse
    function_info(code, name) -> (defined, returns_value)
    drop_function(code, name) -> str          the code without a top-level def of `name`
    top_functions(code) -> {name: source}     the top-level defs of `code`
    aux_use(main_code, entry_point) -> AuxUse how the entry point uses aux: calls, thin wrapper, ignored results

Everything here is static: nothing is executed (extraction only calls `ast.parse`). `aux_use` reads the AST and
follows simple aliases (`h = aux`), calls through lambdas and nested functions, and aux passed as a value
(`map(aux, xs)`); a local rebinding of the name `aux` (a parameter or assignment) shadows the helper. The
cooperation schemes (issue 5) build on it.
"""

from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass

AUX = "aux"

# End-of-turn markers cut the text; other chat markers are removed.
_END_MARKERS = re.compile(r"<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<\|end\|>|</s>|<eos>")
_MARKERS = re.compile(r"<\|[^|>\n]{1,40}\|>|\[/?INST\]|<s>")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_FENCES = ("", "python", "py", "python3")
_DEFINES = re.compile(r"^(?:async\s+def|def|class|import|from)\s+\w", re.M)
_WINDOW = 8  # lines first tried when growing a run that parses; doubled while it keeps parsing
_PARSE_BUDGET = 32  # lines parsed per input line at most: a 10k-line pathological text stays linear
_CUT_ERRORS = ("was never closed", "unterminated triple-quoted", "unexpected EOF", "expected an indented block")

# Telling prose from broken code, for lines that start no run that parses.
_STATEMENT = sorted(set(keyword.kwlist) - {"True", "False", "None", "and", "or", "in", "is", "as"})
_STARTS_STATEMENT = re.compile(rf"(?:{'|'.join(_STATEMENT)})\b")
_MARKDOWN = re.compile(r"[-*+]\s|\d+[.)]\s|>|\*\*|```")  # list items, quotes and >>> prompts, bold, fences
_CODE_LINE = re.compile(rf"[A-Za-z_][\w.]*(?:\[[^\]]*\])?\s*(?:[-+*/%&|^@]|//|\*\*|>>|<<)?=(?!=)"
                        rf"|[A-Za-z_][\w.]*\s*[(\[,]|[)\]}}@]|{_STARTS_STATEMENT.pattern}")
_WORD = re.compile(r"[\"'(*_]*(?:[A-Za-z]{2,}|[aAI])(?:['’-][A-Za-z]+)*[\"'.,:;!?)*_]*")


def extract_code(text: str) -> str:
    """The Python code in a completion, "" when there is none.

    End-of-turn markers cut the text and other chat markers go. With fenced python blocks (```python, ```py or a
    bare ```), the code is those blocks joined, plus any code outside the fences that defines something (a def,
    class or import: "here is aux: <code>, and usage: <fence>"). Within blocks, and in a text without them, every
    line that belongs to a run of lines that parses stays (constants, imports, try/except imports, loops, `if
    __name__ == "__main__":` blocks, comments); a line that starts no such run is dropped when it reads as prose,
    and kept when it looks like broken code, so a truncated or broken function still fails the syntax check
    instead of being cut to something that parses. A lone name or a bare annotation at top level ("Output",
    "Output: 6") is prose that happens to parse and goes too."""
    text = _END_MARKERS.split(text, maxsplit=1)[0]
    text = _MARKERS.sub("", text).replace("\r\n", "\n")
    parts, last = [], 0  # (fenced, code) in document order
    for m in _FENCE.finditer(text):
        parts.append((False, _keep_code(text[last:m.start()])))
        if m.group(1).lower() in _PYTHON_FENCES:
            parts.append((True, _keep_code(m.group(2))))
        last = m.end()
    parts.append((False, _keep_code(text[last:])))
    if any(fenced and code for fenced, code in parts):
        parts = [(fenced, code) for fenced, code in parts if fenced or _DEFINES.search(code)]
    code = "\n\n".join(code.strip("\n") for _, code in parts if code)
    return code + "\n" if code else ""


def _keep_code(text: str) -> str:
    """The code in unfenced text: runs of lines that parse (grown greedily from each line), and lines that look
    like broken code; prose lines dropped. A run indented as a whole (code under a list item) is dedented when
    the code does not parse as it stands."""
    lines = [re.sub(r"^[ \t]+", lambda m: m.group().expandtabs(4), line) for line in text.split("\n")]
    depth = [len(line) - len(line.lstrip()) if line.strip() else -1 for line in lines]
    stop = _next_shallower(depth)
    budget = [_PARSE_BUDGET * len(lines) + 1000]
    kept: dict[int, int] = {}  # line -> columns to strip when runs are dedented
    i = 0
    while i < len(lines):
        if depth[i] < 0:
            i += 1
            continue
        end = _longest_parse(lines, i, depth[i], stop[i], budget)
        if end == i:
            if not _is_prose(lines[i]):
                kept[i] = 0  # broken code stays, so the syntax check sees it
            i += 1
            continue
        drop = _prose_statements(_parse("\n".join(line[depth[i]:] for line in lines[i:end])))
        kept.update((k, depth[i]) for k in range(i, end) if k - i + 1 not in drop)
        i = end
    code = _join(lines, depth, kept, dedent=False)
    tree = _parse(code)
    if tree is None and any(kept.values()):
        dedented = _join(lines, depth, kept, dedent=True)
        dedented_tree = _parse(dedented)
        if dedented_tree is not None:
            code, tree = dedented, dedented_tree
    return "" if tree is not None and not tree.body else code  # nothing, or only comments


def _join(lines: list[str], depth: list[int], kept: dict[int, int], dedent: bool) -> str:
    """The kept lines and the blank lines between them, each kept line dedented by its run's indent or not."""
    out = [k for k in range(len(lines)) if k in kept or depth[k] < 0]
    while out and depth[out[-1]] < 0:
        out.pop()
    first = next((n for n, k in enumerate(out) if depth[k] >= 0), len(out))
    return "".join((lines[k][kept[k]:] if dedent and k in kept else lines[k]) + "\n" for k in out[first:])


def _next_shallower(depth: list[int]) -> list[int]:
    """For each line, the index of the next non-blank line indented less (len(depth) if none): where a run that
    starts there, indented, must end."""
    stop, stack = [len(depth)] * len(depth), []
    for k in range(len(depth) - 1, -1, -1):
        if depth[k] < 0:
            continue
        while stack and depth[stack[-1]] >= depth[k]:
            stack.pop()
        stop[k] = stack[-1] if stack else len(depth)
        stack.append(k)
    return stop


def _longest_parse(lines: list[str], start: int, indent: int, end: int, budget: list[int]) -> int:
    """The end of the longest run lines[start:end'] that parses (dedented by `indent`), or `start` when none
    does. The window grows by doubling while it parses or fails only where it was cut (an open bracket or
    string, a block without its body); then it shrinks to just before the line the parser blames. Each parse is
    charged to `budget`."""
    good, size, hi = start, _WINDOW, min(end, start + _WINDOW)
    growing = True
    while hi > good and budget[0] > 0:
        budget[0] -= hi - start
        bad, cut = _syntax_error(lines[start:hi], indent)
        if bad is None:
            good = hi
            if not growing or hi == end:
                return hi
        elif not (growing and hi < end and cut):
            growing = False
            hi = min(start + bad, hi - 1)
            continue
        size *= 2
        hi = min(end, start + size)
    return good


def _syntax_error(lines: list[str], indent: int) -> tuple[int | None, bool]:
    """(None when the lines parse, else the 0-based line the parser blames; whether the error may only come from
    where the lines end)."""
    try:
        ast.parse("\n".join(line[indent:] for line in lines))
        return None, False
    except SyntaxError as e:
        bad = min(max((e.lineno or 1) - 1, 0), len(lines))
        return bad, bad >= len(lines) - 1 or any(m in (e.msg or "") for m in _CUT_ERRORS)
    except (ValueError, RecursionError, MemoryError):  # null bytes; nesting too deep for the parser
        return 0, False


def _is_prose(line: str) -> bool:
    """Whether a line that starts no parsable run reads as prose (dropped) rather than broken code (kept):
    markdown, backticks, mostly words, or code followed by words; an indented statement keyword, or a line shaped
    like code (`x = `, `f(`, a closing bracket, a keyword, or any indented line) is code."""
    s = line.strip()
    if _MARKDOWN.match(s) or "`" in s:
        return True
    indented = line[0].isspace()
    if indented and _STARTS_STATEMENT.match(s):
        return False
    tokens = s.split()
    words = [bool(_WORD.fullmatch(t)) and re.sub(r"[^A-Za-z]", "", t) not in keyword.kwlist for t in tokens]
    if sum(words) >= 0.6 * len(tokens):
        return True
    if len(s) <= 200 and any(words[k] and _parse(" ".join(tokens[:k])) is not None
                             for k in range(min(len(tokens), 12) - 1, 0, -1)):
        return True  # code, then words: "print(f(3)) will output 4"
    return not (indented or _CODE_LINE.match(s))


def _prose_statements(tree: ast.Module | None) -> set[int]:
    """Lines (1-based) holding one top-level statement that is prose which parses: a lone name ("Output",
    "assistant"), a lone number (an example's output) or an annotation without a value ("Example: f(3)",
    "Input: [1, 2]"). None does anything in a program but evaluate a name that may not exist."""
    if tree is None:
        return set()
    per_line: dict[int, int] = {}
    for node in tree.body:
        for k in range(node.lineno, node.end_lineno + 1):
            per_line[k] = per_line.get(k, 0) + 1
    return {node.lineno for node in tree.body
            if node.lineno == node.end_lineno and per_line[node.lineno] == 1
            and ((isinstance(node, ast.Expr) and (isinstance(node.value, ast.Name) or _is_number(node.value)))
                 or (isinstance(node, ast.AnnAssign) and node.value is None and node.simple))}


def _is_number(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex))


def parse_error(code: str) -> SyntaxError | None:
    """Why `code` does not parse (None when it does), as the code task's syntax level reads it: the parser's
    SyntaxError (its msg, lineno and the line's text), or one saying that it holds a null byte or nests too deeply
    to parse."""
    try:
        ast.parse(code)
    except SyntaxError as e:
        return e
    except ValueError as e:  # a null byte (SyntaxError on newer Pythons), a lone surrogate (UnicodeEncodeError)
        return SyntaxError("the code holds a null byte" if "\x00" in code else f"the code cannot be parsed: {e}")
    except (RecursionError, MemoryError):
        return SyntaxError("too deeply nested to parse")
    return None


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: null bytes; deep nesting
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
            cut.update(_lines_of(node))
    return "\n".join(line for i, line in enumerate(lines) if i not in cut)


def top_functions(code: str) -> dict[str, str]:
    """The top-level function definitions of `code` (decorators included), name -> source, the last of a name; {} if
    it does not parse."""
    tree = _parse(code)
    if tree is None:
        return {}
    lines = code.split("\n")
    return {node.name: "\n".join(lines[i] for i in _lines_of(node))
            for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _lines_of(node: ast.AST) -> range:
    """The 0-based line numbers of a definition, its decorators included."""
    return range(min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, node.end_lineno)


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
    of the scheme detector (kit/analysis/schemes.py)."""
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
