"""Cooperation schemes: how main uses the helper's functions, read from the AST (the paper's Appendix B).

    classify(helper_code, main_code, entry_point) -> Schemes(found={...}, primary="...")
    python -m kit schemes --run-dir checkpoints/colab_a100        # shares per training step from rollouts.jsonl

    fallback         main calls aux inside a try whose handler does the work itself, or checks aux's result
                     for failure (`is None`, `not r`, isinstance) and then computes it another way
    decorator        main trusts aux for the core and adds around it: guards or early returns before the call,
                     arguments prepared for it, or aux's result transformed before it is returned
    coordinator      main calls aux in a loop or comprehension (or hands it to map/filter/sorted/min/max) and
                     aggregates the results
    strategy_filter  aux's result decides which branch main takes (an if/while/ternary/comprehension test)
    wrapper          main's body only returns aux's result, its arguments passed straight through
    no_use           main never reaches a helper function (or shadows the name locally)
    unparseable      main's code or the helper's code does not parse (the joint program never runs, so no scheme
                     is exercised; the reward's syntax level agrees)
A program can show several schemes; `primary` is the first of fallback, coordinator, strategy_filter, decorator
in that order (the most specific first). Helper functions are every function the helper defines (`aux`,
`aux1`, `aux2`, ...), followed through aliases (`h = aux`) and lambdas; comments and docstrings are never read.

Rules for the cases in between:
- A local function of main that calls a helper (`def each(w): return aux(w)`, or `f = lambda v: aux(v)`) relays
  it: the relay's call sites count as uses of the helper, so `[each(w) for w in words]` is a coordinator. What
  happens to aux's result inside the relay still counts too (`return aux(w).upper()` there adds decorator).
- Collecting aux's result into a container (`out.append(aux(v))`, `.add`, `.extend`, `.insert`, `.appendleft`)
  is storage, not a transformation: in a loop it is how a coordinator aggregates, and it adds no decorator.
"""

from __future__ import annotations

import ast
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kit.tasks.codeparse import (AUX, body_without_docstring, calls_one_of, extract_code, helper_aliases, helper_uses,
                           is_wrapper)
from kit.run.rundir import ROLLOUTS, read_jsonl

SCHEMES = ("fallback", "decorator", "coordinator", "strategy_filter", "wrapper", "no_use", "unparseable")
PRIORITY = ("fallback", "coordinator", "strategy_filter", "decorator")
_HIGHER_ORDER = {"map", "filter", "sorted", "min", "max", "sum", "any", "all", "reduce"}
_COLLECT = {"append", "add", "extend", "insert", "appendleft"}  # storing a result in a container


@dataclass
class Schemes:
    found: set[str] = field(default_factory=set)
    primary: str = "no_use"


def helper_names(helper_code: str, entry_point: str) -> set[str]:
    """Functions the helper defines (aux and any siblings such as aux1/aux2), never the entry point."""
    names = {AUX}
    try:
        tree = ast.parse(helper_code)
    except (SyntaxError, ValueError):
        return names
    names |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names.discard(entry_point)
    return names


def classify(helper_code: str, main_code: str, entry_point: str) -> Schemes:
    try:
        ast.parse(helper_code)
        tree = ast.parse(main_code)
    except (SyntaxError, ValueError, RecursionError):
        return Schemes({"unparseable"}, "unparseable")
    fn = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            fn = node
    if fn is None:
        return Schemes({"no_use"}, "no_use")
    names, _ = helper_aliases(fn, helper_names(helper_code, entry_point))
    if not names:
        return Schemes({"no_use"}, "no_use")
    parents = {id(child): node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
    uses = helper_uses(fn, names)
    if not uses:
        return Schemes({"no_use"}, "no_use")
    body = body_without_docstring(fn)
    if is_wrapper(body, names):
        return Schemes({"wrapper"}, "wrapper")
    relays, inside = _relays(fn, names, uses)
    sites = [u for u in uses if id(u) not in inside] + helper_uses(fn, relays)  # where main reaches a helper
    results = _result_names(fn, names | relays)
    found = set()
    for use in uses + [s for s in sites if s.id in relays]:
        chain = _ancestors(use, parents, fn)
        call = parents.get(id(use)) if isinstance(parents.get(id(use)), ast.Call) and \
            parents[id(use)].func is use else None
        if any(isinstance(a, ast.Try) and _in_try_body(use, a, parents) and _handler_does_work(a) for a in chain):
            found.add("fallback")
        lam = next((a for a in chain if isinstance(a, ast.Lambda)), None)
        if _repeated(use, parents, fn) or (call is None and _passed_to_higher_order(use, parents)) \
                or (lam is not None and _passed_to_higher_order(lam, parents)):
            found.add("coordinator")
        if call is not None and _in_test(call, parents, fn):
            found.add("strategy_filter")
        if call is not None and _transformed(call, parents):
            found.add("decorator")
    found |= _result_checks(fn, results, parents)
    if _guards_before_first_use(body, sites, parents, fn):
        found.add("decorator")
    if not found:
        found.add("decorator")  # aux does the core; main prepares its arguments or adds steps around it
    primary = next(s for s in PRIORITY if s in found)
    return Schemes(found, primary)


# --- helpers over the AST


def _relays(fn, names, uses) -> tuple[set[str], set[int]]:
    """(main's local functions that reach a helper, followed to a fixed point; the ids of the nodes inside them).
    A relay is a nested def, or a name assigned a lambda, whose body uses a helper or another relay."""
    local = {}
    for node in ast.walk(fn):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is not fn:
            local[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            local.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
    local = {name: node for name, node in local.items() if name not in names}
    relays: set[str] = set()
    reached = {id(u) for u in uses}
    changed = True
    while changed:
        changed = False
        for name, node in local.items():
            if name not in relays and any(id(n) in reached or (isinstance(n, ast.Name) and n.id in relays)
                                          for n in ast.walk(node)):
                relays.add(name)
                changed = True
    inside = {id(n) for name in relays for n in ast.walk(local[name])}
    return relays, inside


def _ancestors(node, parents, stop) -> list[ast.AST]:
    out = []
    while id(node) in parents and node is not stop:
        node = parents[id(node)]
        out.append(node)
    return out


def _in_try_body(node, try_node: ast.Try, parents) -> bool:
    body_ids = {id(n) for stmt in try_node.body for n in ast.walk(stmt)}
    return id(node) in body_ids


def _handler_does_work(try_node: ast.Try) -> bool:
    """A handler that computes something, not one that only re-raises, passes or returns None."""
    for handler in try_node.handlers:
        for stmt in handler.body:
            if isinstance(stmt, (ast.Pass, ast.Raise)):
                continue
            if isinstance(stmt, ast.Return) and (stmt.value is None or (
                    isinstance(stmt.value, ast.Constant) and stmt.value.value is None)):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            return True
    return False


def _repeated(node, parents, fn) -> bool:
    """The node runs once per iteration: in a loop's body or a comprehension's element or filter (not in a
    while test or the iterable, which run once or decide the loop)."""
    while id(node) in parents and node is not fn:
        parent = parents[id(node)]
        if isinstance(parent, (ast.For, ast.AsyncFor, ast.While)) and (node in parent.body or node in parent.orelse):
            return True
        if isinstance(parent, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and node is parent.elt:
            return True
        if isinstance(parent, ast.DictComp) and node in (parent.key, parent.value):
            return True
        if isinstance(parent, ast.comprehension) and node in parent.ifs:
            return True
        node = parent
    return False


def _passed_to_higher_order(node, parents) -> bool:
    """aux (or a lambda calling it) handed to map/filter/sorted/... or given as a key=."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.keyword) and parent.arg == "key":
        return True
    return isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Name) \
        and parent.func.id in _HIGHER_ORDER


def _in_test(call, parents, fn) -> bool:
    """The call's value is (part of) the test of an if, while, ternary or comprehension filter."""
    node = call
    while id(node) in parents and node is not fn:
        parent = parents[id(node)]
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and parent.test is node:
            return True
        if isinstance(parent, ast.comprehension) and node in parent.ifs:
            return True
        if isinstance(parent, (ast.stmt, ast.comprehension, ast.Lambda)):
            return False
        node = parent
    return False


def _transformed(call, parents) -> bool:
    """aux's result feeds another expression (arithmetic, another call, an index, an attribute, a format)."""
    parent = parents.get(id(call))
    if isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Attribute, ast.FormattedValue)):
        return True
    return isinstance(parent, ast.Call) and call in parent.args and not (
        isinstance(parent.func, ast.Name) and parent.func.id in _HIGHER_ORDER | {"list", "tuple", "set"}) and not (
        isinstance(parent.func, ast.Attribute) and parent.func.attr in _COLLECT)


def _result_names(fn, names) -> set[str]:
    out = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and calls_one_of(node.value, names):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def _is_failure_check(test, results) -> bool:
    """`r is None`, `r is not None`, `r == None`, `not r`, `isinstance(r, ...)` on an aux result."""
    def is_result(n):
        return isinstance(n, ast.Name) and n.id in results

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return is_result(test.operand) or _is_failure_check(test.operand, results)
    if isinstance(test, ast.Compare) and is_result(test.left) and any(
            isinstance(c, ast.Constant) and c.value is None for c in test.comparators):
        return True
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance" \
        and test.args and is_result(test.args[0])


def _result_checks(fn, results, parents) -> set[str]:
    """Tests on a stored aux result: a failure check means fallback; any other test, strategy_filter."""
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = node.test
            if _is_failure_check(test, results):
                found.add("fallback")
            elif any(isinstance(n, ast.Name) and n.id in results for n in ast.walk(test)):
                found.add("strategy_filter")
    for node in ast.walk(fn):  # r = aux(x) ... return r * 2: a transformed result
        if isinstance(node, (ast.BinOp, ast.Subscript, ast.Attribute)) and any(
                isinstance(n, ast.Name) and n.id in results for n in ast.iter_child_nodes(node)):
            found.add("decorator")
    return found


def _guards_before_first_use(body, uses, parents, fn) -> bool:
    """An `if ...: return/raise` at the top of main's body before the statement that first uses aux."""
    use_ids = {id(u) for u in uses}
    for stmt in body:
        if any(id(n) in use_ids for n in ast.walk(stmt)):
            return False
        if isinstance(stmt, ast.If) and any(isinstance(s, (ast.Return, ast.Raise)) for s in stmt.body):
            return True
    return False


# --- over a run's rollouts


def scheme_of_completions(helper_text: str, main_text: str, entry_point: str) -> Schemes:
    return classify(extract_code(helper_text), extract_code(main_text), entry_point)


def scheme_shares(run_dir: str | Path, entry_points: dict[str, str] | None = None, turn: int = 0) -> list[dict]:
    """Per training step: the share of each primary scheme among the joint actions in rollouts.jsonl.

    `entry_points` maps item ids to entry points; by default it is read from the run's task."""
    run_dir = Path(run_dir)
    if entry_points is None:
        entry_points = _entry_points(run_dir)
    counts: dict[int, Counter] = defaultdict(Counter)
    for row in read_jsonl(run_dir / ROLLOUTS):
        if row.get("turn", 0) != turn or row["item"] not in entry_points:
            continue
        helper, main = row["completions"][:2]
        counts[row["step"]][scheme_of_completions(helper, main, entry_points[row["item"]]).primary] += 1
    rows = []
    for step in sorted(counts):
        total = sum(counts[step].values())
        rows.append({"step": step, "count": total, **{s: counts[step][s] / total for s in SCHEMES}})
    return rows


def _entry_points(run_dir: Path) -> dict[str, str]:
    from kit.run.rundir import open_run

    task = open_run(run_dir).task
    out = {}
    for split in ("train", "eval"):
        for item in task.load(split):
            if "entry_point" in item:
                out[item["id"]] = item["entry_point"]
    if not out:
        raise ValueError(f"task {task.name!r} has no entry points: schemes apply to the code task")
    return out


def examples(run_dir: str | Path, entry_points: dict[str, str] | None = None, per_scheme: int = 1,
             turn: int = 0) -> dict[str, list[dict]]:
    """Example joint actions from rollouts.jsonl for each primary scheme, newest steps first."""
    run_dir = Path(run_dir)
    entry_points = entry_points or _entry_points(run_dir)
    found: dict[str, list[dict]] = defaultdict(list)
    rows = read_jsonl(run_dir / ROLLOUTS)
    for row in reversed(rows):
        if row.get("turn", 0) != turn or row["item"] not in entry_points:
            continue
        helper, main = (extract_code(t) for t in row["completions"][:2])
        primary = classify(helper, main, entry_points[row["item"]]).primary
        if len(found[primary]) < per_scheme:
            found[primary].append({"step": row["step"], "item": row["item"], "reward": row["reward"],
                                   "helper": helper, "main": main})
    return dict(found)


def examples_markdown(run_dir: str | Path, entry_points: dict[str, str] | None = None, turn: int = 0) -> str:
    """One example program per scheme (the newest), as markdown: what 04_schemes shows."""
    parts = []
    for scheme, found in examples(run_dir, entry_points, turn=turn).items():
        ex = found[0]
        parts.append(f"**{scheme}** (step {ex['step']}, {ex['item']}, reward {ex['reward']:.2f})\n\n"
                     f"```python\n{ex['helper']}\n{ex['main']}\n```")
    return "\n\n".join(parts) or "(no code-task joint actions in rollouts.jsonl yet)"


def shares_of(programs: list[tuple[str, str, str]]) -> dict[str, float]:
    """Share of each primary scheme among (helper_code, main_code, entry_point) programs."""
    counts = Counter(classify(h, m, e).primary for h, m, e in programs)
    total = sum(counts.values()) or 1
    return {s: counts[s] / total for s in SCHEMES}


def passing_shares(task, items: list[dict], rewards: list[list]) -> dict:
    """{"num_passing", "schemes/passing"}: the primary schemes of the passing joint actions among rewards[item][g]
    (a code task's: details hold helper_code and main_code, the items an entry_point); {} when none passes or the
    task is not one."""
    if not callable(getattr(task, "is_pass", None)) or not all("entry_point" in item for item in items):
        return {}
    passing = [(r.details.get("helper_code", ""), r.details["main_code"], item["entry_point"])
               for item, per in zip(items, rewards) for r in per
               if "main_code" in (r.details or {}) and task.is_pass(r)]
    return {"num_passing": len(passing), "schemes/passing": shares_of(passing)} if passing else {}


def fresh_shares(run_dir: str | Path, n: int = 8, step: int | None = None, num_items: int | None = None,
                 log=print) -> dict[str, float]:
    """Scheme shares on fresh samples: n joint actions per held-out item from checkpoint `step` (default: the
    newest saved adapters; the base when there are none)."""
    from kit.analysis.evaluate import RunContext, sample_joint
    from kit.analysis.progress import decoding_bar, say_estimate

    _entry_points(Path(run_dir))  # another task: the cell above's clear error, before any model loads
    ctx = RunContext(run_dir, num_items=num_items, log=log)
    try:
        if step is None:  # the newest saved adapters (taken again if a run still training prunes them); the base
            step = ctx.use_team_step("newest", log=lambda *_: None) or 0
            if step == 0:
                ctx.use_step(0)
        else:
            ctx.use_step(step)
        say_estimate(ctx, 1, n, log)
        with decoding_bar():
            _, rewards, _, _ = sample_joint(ctx.sampler, ctx.task, ctx.items, n, ctx.scorer)
    finally:
        ctx.close()
    programs = [(r.details.get("helper_code", ""), r.details.get("main_code", ""), item["entry_point"])
                for item, per in zip(ctx.items, rewards) for r in per]
    log(f"[kit] schemes of {len(programs)} fresh joint actions from step {step}")
    return shares_of(programs)

