"""tools/mutate.py: its list of mutations fits the current tree, and a mutation runs in a copy, never in the tree.

Run: python -m pytest tests/test_mutations.py      (the whole mutation run: python tools/mutate.py)
"""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_mutate():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = module  # its dataclass looks its own module up
    spec.loader.exec_module(module)
    return module


def test_every_mutation_edits_text_found_exactly_once_in_the_current_tree():
    mutate = load_mutate()
    assert mutate.check(mutate.MUTATIONS) == []
    assert len(mutate.MUTATIONS) >= 30
    assert all(m.tests for m in mutate.MUTATIONS)


def test_the_check_names_text_found_twice_or_not_at_all(tmp_path):
    mutate = load_mutate()
    (tmp_path / "m.py").write_text("x = 1\nx = 1\n")
    (tmp_path / "test_m.py").write_text("")
    twice = mutate.Mutation("twice", "m.py", "x = 1", "x = 2", ("test_m.py",))
    never = mutate.Mutation("never", "m.py", "y = 1", "y = 2", ("test_m.py::test_a", "missing.py"))
    assert mutate.check([twice, never], tmp_path) == ["twice: `old` occurs 2 times in m.py (exactly once needed)",
                                                       "never: `old` occurs 0 times in m.py (exactly once needed)",
                                                       "never: no test file missing.py"]


def test_a_mutation_is_applied_in_the_copy_then_undone(tmp_path):
    mutate = load_mutate()
    (tmp_path / "m.py").write_text("def f():\n    return 1\n")
    (tmp_path / "test_m.py").write_text("from m import f\n\n\ndef test_f():\n    assert f() == 1\n")
    caught = mutate.Mutation("returns 2", "m.py", "return 1", "return 2", ("test_m.py",))
    equivalent = mutate.Mutation("same value", "m.py", "return 1", "return 2 - 1", ("test_m.py",))
    assert mutate.run(caught, tmp_path, timeout=120)[0] == "caught by test_f"
    assert mutate.run(equivalent, tmp_path, timeout=120)[0] == "SURVIVED"
    assert (tmp_path / "m.py").read_text() == "def f():\n    return 1\n"
