"""The package's shape: no import loop between kit's modules, counting imports inside functions.

Run: python -m pytest tests/test_structure.py
"""

import ast
from pathlib import Path

KIT = Path(__file__).resolve().parent.parent / "kit"


def module_name(path: Path) -> str:
    parts = path.relative_to(KIT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kit_imports(path: Path, modules: set[str]) -> set[str]:
    """The kit modules a file imports anywhere (top level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kit"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
    return found & modules


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in KIT.rglob("*.py")}
    modules = set(files)
    return {name: kit_imports(path, modules) - {name, "kit"} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_loop():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_kit_has_no_import_loop():
    graph = import_graph()
    assert {"kit.trainers.trainer", "kit.colab", "kit.env", "kit.run.rundir", "kit.tasks.code"} <= set(graph)
    assert "kit.run.rundir" in graph["kit.trainers.trainer"] and "kit.env" in graph["kit.judge.judge"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_environment_helpers_import_no_other_kit_module():
    assert import_graph()["kit.env"] == set()


def test_the_sandbox_processes_import_only_the_standard_library_and_no_kit_module():
    import sys

    for name in ("wire.py", "runner.py", "checker.py"):
        tree = ast.parse((KIT / "sandbox" / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= set(sys.stdlib_module_names), (name, imported - set(sys.stdlib_module_names))


# The layers, bottom to top: a module may import its own layer and those before it, never one after it.
LAYERS = [("kit.env", "kit.maths"), ("kit.sandbox", "kit.judge"), ("kit.engine",), ("kit.tasks",), ("kit.run",),
          ("kit.analysis",), ("kit.trainers",), ("kit.colab", "kit.__main__")]


def layer_of(module: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to the README's map)")


def test_imports_point_down_the_layers():
    upward = [f"{m} -> {d}" for m, deps in import_graph().items() if m != "kit" for d in deps
              if layer_of(d) > layer_of(m)]
    assert not upward, upward


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("kit.engine.rollout") < layer_of("kit.trainers.trainer")
    assert layer_of("kit.maths.losses") == layer_of("kit.env")


def test_every_subpackage_says_what_it_is_for_and_what_it_may_import():
    for init in KIT.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in doc, init


def test_a_module_past_400_lines_says_why_at_its_top():
    long = {p.relative_to(KIT.parent).as_posix(): len(p.read_text().splitlines()) for p in KIT.rglob("*.py")
            if len(p.read_text().splitlines()) > 420}
    silent = [f"{name} ({n} lines)" for name, n in long.items()
              if "Past 400 lines" not in (ast.get_docstring(ast.parse((KIT.parent / name).read_text())) or "")]
    assert not silent, f"split these by concept, or say at the top why not: {silent}"
