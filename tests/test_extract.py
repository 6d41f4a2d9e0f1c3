"""extract_code on completions shaped the way instruction-tuned coders answer (issue 20, item 5): module-level
Python stays, prose goes, and a reference solution wrapped in prose and fences comes back with the same AST.

Run: python -m pytest tests/test_extract.py
"""

import ast
import textwrap

import pytest

from kit.tasks import codeparse
from kit.tasks.codeparse import extract_code
from kit.tasks.code import coop_problems, humaneval_problems

# (id, completion, what must be kept, prose that must be gone)
SHAPES = [
    ("prose_fence_code_prose",
     "Here's a Python function that solves the problem:\n\n```python\ndef sum_of_squares(nums):\n"
     "    return sum(x * x for x in nums)\n```\n\n### Explanation:\n- The function iterates over `nums` once.\n\n"
     "This approach runs in O(n) time.",
     ["def sum_of_squares(nums):", "return sum(x * x for x in nums)"], ["Here's", "Explanation", "O(n)"]),
    ("constants_and_imports_before_def",
     "```python\nMOD = 10**9 + 7\nLIMIT = 100\nimport math\n\ndef count_pairs(n):\n"
     "    return math.comb(min(n, LIMIT), 2) % MOD\n```",
     ["MOD = 10**9 + 7", "LIMIT = 100", "import math", "def count_pairs(n):"], []),
    ("top_level_try_except_import",
     "```python\ntry:\n    from math import isqrt\nexcept ImportError:\n    def isqrt(n):\n"
     "        return int(n ** 0.5)\n\ndef is_square(n):\n    r = isqrt(n)\n    return r * r == n\n```",
     ["try:\n    from math import isqrt", "except ImportError:", "def is_square(n):"], []),
    ("main_block_with_prints",
     "Sure! Here's the implementation:\n\n```python\ndef add(a, b):\n    return a + b\n\n\n"
     "if __name__ == \"__main__\":\n    print(add(2, 3))  # 5\n    print(add(-1, 1))  # 0\n```\n\nOutput:\n"
     "```\n5\n0\n```",
     ["def add(a, b):", "if __name__ == \"__main__\":", "print(add(2, 3))", "print(add(-1, 1))"],
     ["Sure", "Output"]),
    ("module_level_for_loop_builds_a_table",
     "```python\nSQUARES = {}\nfor k in range(100):\n    SQUARES[k * k] = k\n\ndef is_square(n):\n"
     "    return n in SQUARES\n```\nThe table is built once, at import.",
     ["SQUARES = {}", "for k in range(100):", "SQUARES[k * k] = k", "def is_square(n):"], ["The table"]),
    ("with_statement",
     "```python\nimport io\n\nwith io.StringIO(\"a b c\") as fh:\n    WORDS = fh.read().split()\n\n"
     "def count_words():\n    return len(WORDS)\n```",
     ["import io", "with io.StringIO(\"a b c\") as fh:", "WORDS = fh.read().split()", "def count_words():"], []),
    ("several_blocks_with_example_usage",
     "Here is the helper:\n```python\ndef aux(x):\n    return x * 2\n```\nAnd the main function:\n```python\n"
     "def double_all(xs):\n    return [aux(x) for x in xs]\n```\nExample usage:\n```python\n"
     "print(double_all([1, 2]))  # [2, 4]\n```\nThe output is `[2, 4]`.",
     ["def aux(x):", "def double_all(xs):", "print(double_all([1, 2]))"],
     ["Here is", "And the main", "Example usage", "The output"]),
    ("unfenced_with_prose_before_and_after",
     "Sure! Below is the implementation.\n\nimport math\n\nMOD = 7\n\ndef f(x):\n    return math.floor(x) % MOD\n\n"
     "This function floors x and reduces it modulo 7.\nLet me know if you need anything else!",
     ["import math", "MOD = 7", "def f(x):"], ["Sure", "Below", "This function", "Let me know"]),
    ("chat_end_marker_then_garbage",
     "```python\nLIMIT = 10\n\ndef clip(x):\n    return min(x, LIMIT)\n```<|im_end|>\n<|im_start|>user\n"
     "thanks ```python\nimport os\nos.system('ls')\n```",
     ["LIMIT = 10", "def clip(x):"], ["import os", "os.system", "thanks", "user"]),
    ("prose_line_between_two_defs",
     "def aux(x):\n    return x + 1\n\nNow the main function, which calls the helper:\n\ndef main(x):\n"
     "    return aux(x) * 2\n",
     ["def aux(x):", "def main(x):", "return aux(x) * 2"], ["Now the main"]),
    ("code_indented_under_a_list_item",
     "Steps:\n\n1. Define the helper:\n   def aux(x):\n       return x + 1\n\n2. Then the main function:\n"
     "   def main(x):\n       return aux(x) * 2\n\nThat's it.",
     ["def aux(x):\n    return x + 1", "def main(x):\n    return aux(x) * 2"], ["Steps", "Define", "That's"]),
    ("fence_indented_under_a_list_item",
     "1. The helper:\n\n    ```python\n    RATE = 3\n\n    def aux(x):\n        return x * RATE\n    ```\n\n"
     "2. The main function:\n\n    ```python\n    def main(x):\n        return aux(x) + 1\n    ```\n",
     ["RATE = 3", "def aux(x):\n    return x * RATE", "def main(x):\n    return aux(x) + 1"], ["The helper"]),
    ("unfenced_def_outside_fences",
     "Here is aux:\n\ndef aux(x):\n    return x + 1\n\nAnd how to use it:\n```python\nprint(aux(1))\n```\nDone.",
     ["def aux(x):", "print(aux(1))"], ["Here is", "how to use", "Done"]),
    ("only_a_closing_fence",  # the prompt opened the fence; the model closes it and explains
     "def aux(x):\n    return x + 1\n```\n\nThis adds one to x.",
     ["def aux(x):"], ["This adds"]),
    ("prose_that_parses",  # a lone word, an annotation-shaped line and an example's output are no code
     "def f(x):\n    return x * 2\n\nExplanation\nExample: f(3)\nInput: [1, 2]\n6\n",
     ["def f(x):"], ["Explanation", "Example", "Input", "6"]),
    ("code_then_words",  # a line that starts as code and goes on in English is prose
     "def f(x):\n    return x * 2\n\nprint(f(3)) will output 6\nf(2) returns 4\n",
     ["def f(x):"], ["will output", "returns 4"]),
    ("module_docstring_comments_and_decorators",
     "```python\n\"\"\"Counting helpers.\n\nNothing here runs at import.\n\"\"\"\nimport functools\n\n# memoized\n"
     "@functools.lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\n"
     "class Counter:\n    total = 0\n```",
     ["\"\"\"Counting helpers.", "# memoized", "@functools.lru_cache(maxsize=None)", "class Counter:"], []),
]


@pytest.mark.parametrize("text, keep, drop", [case[1:] for case in SHAPES], ids=[case[0] for case in SHAPES])
def test_extract_keeps_the_python_and_drops_the_prose(text, keep, drop):
    code = extract_code(text)
    ast.parse(code)
    for kept in keep:
        assert kept in code, f"{kept!r} was dropped from:\n{code}"
    for prose in drop:
        assert prose not in code, f"{prose!r} was kept in:\n{code}"


@pytest.mark.parametrize("text", [
    "I am sorry, I cannot help with that.",
    "The answer is 42.\nIt follows from the definition of the sequence.",
    "Explanation:\n- first, sort the list\n- then, take the middle element",
    "",
    "<|im_end|>def f():\n    pass\n",  # code only after the end of the turn
    "```bash\npip install numpy\n```",
    "### Explanation\nThe function sorts the list first.",  # a heading parses, as a comment, but is no code
])
def test_extract_of_text_without_code_is_empty(text):
    assert extract_code(text) == ""


def test_extract_keeps_a_truncated_function_broken():
    """A completion cut by max_new_tokens must fail the syntax check, not be trimmed into code that parses."""
    text = "```python\ndef main(xs):\n    ys = sorted(xs)\n    return [y for y in"
    code = extract_code(text)
    assert "return [y for y in" in code
    with pytest.raises(SyntaxError):
        ast.parse(code)


def test_extract_keeps_a_broken_function_and_drops_the_prose_around_it():
    code = extract_code("Sure! Here it is.\ndef aux(x):\n    return x +\nHope it helps!")
    assert code == "def aux(x):\n    return x +\n"


# --- the property: a correct program in prose and fences comes back unchanged (same AST)

WRAPPERS = {
    "fenced": "Here is the solution:\n\n```python\n{code}```\n\nThis function works as follows: it does the job.\n"
              "Let me know if you have questions!",
    "unfenced": "Sure! Here is the code.\n\n{code}\n\nThe function above solves the problem in linear time.",
    "chat": "<|im_start|>assistant\n```py\n{code}```<|im_end|>\n<|im_start|>user\nnow do it in ```python\nx = 1\n```",
    "list_item": "1. The solution:\n\n{indented}\n\n2. That is all.",
}


def _references():
    for item in coop_problems():
        helper, main = item["reference_pair"]
        yield item["id"] + ":helper", helper
        yield item["id"] + ":main", main
        yield item["id"] + ":both", item["reference"]
    for item in humaneval_problems()[::4]:
        yield item["id"], item["reference"]


def test_extract_gives_back_every_reference_solution_wrapped_in_prose():
    checked = 0
    for name, code in _references():
        want = ast.dump(ast.parse(code))
        fenced = "```python\n" + code.rstrip("\n") + "\n```"
        for how, wrapper in WRAPPERS.items():
            text = wrapper.format(code=code.rstrip("\n") + "\n", indented=textwrap.indent(fenced, "    ", lambda line: True))
            got = extract_code(text)
            assert ast.dump(ast.parse(got)) == want, f"{name} wrapped {how}:\n{got}"
            checked += 1
    assert checked >= 4 * (3 * 12 + 40)


# --- bounded work

def test_extract_parses_a_bounded_number_of_lines_per_input_line(monkeypatch):
    """Pathological inputs (prose everywhere, broken code everywhere, one huge statement) cost at most
    _PARSE_BUDGET parsed lines per input line, plus a few whole-text parses."""
    parsed = [0]

    class CountingAst:
        def __getattr__(self, name):
            return getattr(ast, name)

        def parse(self, source, *args, **kwargs):
            parsed[0] += source.count("\n") + 1
            return ast.parse(source, *args, **kwargs)

    monkeypatch.setattr(codeparse, "ast", CountingAst())
    num_lines = 3_000
    for text in ["This is a line of prose, it says things.\n" * num_lines,
                 "".join("    " * (i % 40) + "if x:\n" for i in range(num_lines)),
                 "".join("def f%d(x):\n    return x +\n" % i for i in range(num_lines // 2)),
                 "".join("def f%d(x):\n    return x\nSome prose here.\n" % i for i in range(num_lines // 3)),
                 "x = [\n" + "1,\n" * num_lines]:
        parsed[0] = 0
        extract_code(text)
        assert parsed[0] <= (codeparse._PARSE_BUDGET + 8) * num_lines, parsed[0]


def test_a_correct_team_in_chat_shape_scores_full_tests():
    """The reward path: a helper that needs its module constant, and a main with a __main__ block, both wrapped
    the way instruction-tuned coders answer, pass every test."""
    from kit.tasks.code import CodeTask

    task = CodeTask(dataset="coop", test_timeout=2.0)
    item = next(item for item in task.problems() if item["id"] == "coop/prime_fib")
    helper = ("Here is the helper:\n\n```python\nSMALLEST_PRIME = 2\n\ndef aux(x):\n    if x < SMALLEST_PRIME:\n"
              "        return False\n    return all(x % d for d in range(2, int(x ** 0.5) + 1))\n```\n\n"
              "It checks divisors up to the square root.")
    main = ("```python\ndef prime_fib(n):\n    a, b, found = 0, 1, 0\n    while True:\n        a, b = b, a + b\n"
            "        if aux(a):\n            found += 1\n            if found == n:\n                return a\n\n\n"
            "if __name__ == \"__main__\":\n    print(prime_fib(4))  # 13\n```\n\nThis walks the Fibonacci numbers.")
    assert task.reward(item, (helper, main)).parts["tests"] == 1.0
