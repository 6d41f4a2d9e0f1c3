"""Cooperation-scheme detection on hand-written, labelled helper/main programs.

Run: python -m pytest tests/test_schemes.py
"""

import json

import pytest

from kit.analysis.schemes import classify, examples_markdown, scheme_shares

AUX = "def aux(x):\n    return x\n"
AUX12 = "def aux1(x):\n    return x\n\ndef aux2(x):\n    return x > 0\n"


def main(body: str, args: str = "x") -> str:
    return f"def solve({args}):\n" + "".join(f"    {line}\n" for line in body.split("\n"))


# (name, helper code, main code, primary, schemes that must also be found)
CASES = [
    # wrapper
    ("return", AUX, main("return aux(x)"), "wrapper", set()),
    ("docstring wrapper", AUX, main('"""Doc mentions aux."""\nreturn aux(x, y)', "x, y"), "wrapper", set()),
    ("assign then return", AUX, main("r = aux(x)\nreturn r"), "wrapper", set()),
    ("star args", AUX, main("return aux(*args)", "*args"), "wrapper", set()),
    ("alias then return", AUX, main("h = aux\nreturn h(x)"), "wrapper", set()),
    ("nested helper wrapper", AUX12, main("return aux1(x)"), "wrapper", set()),
    # no use
    ("direct", AUX, main("return x * 2"), "no_use", set()),
    ("comment mentions aux", AUX, main("# aux(x) would also work\nreturn x + 1"), "no_use", set()),
    ("docstring mentions aux", AUX, main('"""Unlike aux(x), direct."""\nreturn x'), "no_use", set()),
    ("shadowed by nested def", AUX, main("def aux(y):\n    return y\nreturn aux(x) + 1"), "no_use", set()),
    ("shadowed by parameter", AUX, main("return aux(x) + 1", "x, aux=abs"), "no_use", set()),
    ("shadowed by assignment", AUX, main("aux = len\nreturn aux(x) * 2"), "no_use", set()),
    ("entry point missing", AUX, "def other(x):\n    return aux(x)\n", "no_use", set()),
    ("string, not a call", AUX, main("return 'aux(x)'"), "no_use", set()),
    # unparseable
    ("missing colon", AUX, "def solve(x)\n    return aux(x)\n", "unparseable", set()),
    ("open paren", AUX, main("return aux(x"), "unparseable", set()),
    # fallback
    ("try returns alternative", AUX, main("try:\n    return aux(x)\nexcept Exception:\n    return sorted(x)"),
     "fallback", set()),
    ("try assigns alternative", AUX, main("try:\n    r = aux(x)\nexcept ValueError:\n    r = x * 2\nreturn r"),
     "fallback", set()),
    ("is None check", AUX, main("r = aux(x)\nif r is None:\n    r = x * 2\nreturn r"), "fallback", set()),
    ("falsy check", AUX, main("r = aux(x)\nif not r:\n    return [v for v in x if v]\nreturn r"), "fallback",
     set()),
    ("isinstance check", AUX, main("r = aux(x)\nif not isinstance(r, list):\n    return list(x)\nreturn r"),
     "fallback", set()),
    ("fallback in a loop", AUX,
     main("out = []\nfor v in x:\n    try:\n        out.append(aux(v))\n    except Exception:\n        out.append(0)"
          "\nreturn out"), "fallback", {"coordinator"}),
    ("re-raise is not fallback", AUX, main("try:\n    v = aux(x)\nexcept ValueError:\n    raise\nreturn v + 1"),
     "decorator", set()),
    # decorator
    ("guard before", AUX, main("if not x:\n    return 0\nreturn aux(x)"), "decorator", set()),
    ("raise guard", AUX, main("if x < 0:\n    raise ValueError(x)\nreturn aux(x)"), "decorator", set()),
    ("add to result", AUX, main("return aux(x) + 1"), "decorator", set()),
    ("sorted result", AUX, main("return sorted(aux(x))"), "decorator", set()),
    ("index result", AUX, main("return aux(x)[0]"), "decorator", set()),
    ("transform stored result", AUX, main("r = aux(x)\nreturn r * 2"), "decorator", set()),
    ("prepared argument", AUX, main("return aux(x.strip().lower())"), "decorator", set()),
    ("format result", AUX, main('return f"{aux(x)}!"'), "decorator", set()),
    ("method on result", AUX, main("return aux(x).upper()"), "decorator", set()),
    ("through a lambda", AUX, main("f = lambda v: aux(v) * 2\nreturn f(x)"), "decorator", set()),
    ("main also defines aux at top", AUX, "def aux(x):\n    return 0\n\n" + main("return aux(x) + 1"),
     "decorator", set()),
    # coordinator
    ("for loop", AUX, main("total = 0\nfor v in x:\n    total += aux(v)\nreturn total"), "coordinator", set()),
    ("list comprehension", AUX, main("return [aux(v) for v in x]"), "coordinator", set()),
    ("map", AUX, main("return list(map(aux, x))"), "coordinator", set()),
    ("sorted key", AUX, main("return sorted(x, key=aux)"), "coordinator", set()),
    ("max key lambda", AUX, main("return max(x, key=lambda v: aux(v))"), "coordinator", set()),
    ("while loop", AUX, main("out = []\nwhile x:\n    out.append(aux(x.pop()))\nreturn out"), "coordinator",
     set()),
    ("sum of generator", AUX, main("return sum(aux(v) for v in x)"), "coordinator", set()),
    ("alias in comprehension", AUX, main("h = aux\nreturn [h(v) for v in x]"), "coordinator", set()),
    ("loop with filter", AUX, main("count = 0\nfor v in x:\n    if aux(v):\n        count += 1\nreturn count"),
     "coordinator", {"strategy_filter"}),
    ("comprehension filter", AUX, main("return [v for v in x if aux(v)]"), "coordinator", {"strategy_filter"}),
    ("nested helpers", AUX12, main("return [aux1(v) for v in x if aux2(v)]"), "coordinator",
     {"strategy_filter"}),
    # strategy filter
    ("if on call", AUX, main("if aux(x):\n    return x\nreturn -x"), "strategy_filter", set()),
    ("ternary", AUX, main("return x if aux(x) else 0"), "strategy_filter", set()),
    ("while test", AUX, main("while aux(x):\n    x -= 1\nreturn x"), "strategy_filter", set()),
    ("stored result in test", AUX, main("ok = aux(x)\nif ok:\n    return 1\nreturn 2"), "strategy_filter",
     set()),
    ("compare in test", AUX, main("if aux(x) > 3:\n    return 'big'\nreturn 'small'"), "strategy_filter", set()),
    # the rules for cases in between (kit/analysis/schemes.py's docstring); EXACT below pins their whole label sets
    ("unparseable helper, main only calls it", "def aux(x)\n    return x\n", main("return aux(x)"),
     "unparseable", set()),
    ("unparseable helper, main loops over it", "def aux(x):\nreturn x\n", main("return [aux(v) for v in x]"),
     "unparseable", set()),
    ("nested def relays aux, called in a comprehension", AUX,
     main("def each(w):\n    return aux(w)\nreturn [each(w) for w in x]"), "coordinator", set()),
    ("lambda relays aux, called in a loop", AUX,
     main("f = lambda v: aux(v)\nout = []\nfor v in x:\n    out.append(f(v))\nreturn out"), "coordinator", set()),
    ("nested def relays aux into a test", AUX, main("def ok(v):\n    return aux(v)\nif ok(x):\n    return 1\nreturn 2"),
     "strategy_filter", set()),
    ("relay transforms inside, called in a loop", AUX,
     main("def each(w):\n    return aux(w).upper()\nreturn [each(w) for w in x]"), "coordinator", {"decorator"}),
    ("relay of a relay", AUX,
     main("def one(w):\n    return aux(w)\ndef two(w):\n    return one(w)\nreturn list(map(two, x))"),
     "coordinator", set()),
    ("append in a for loop", AUX, main("out = []\nfor i in x:\n    out.append(aux(i))\nreturn out"),
     "coordinator", set()),
    ("add to a set in a loop", AUX, main("seen = set()\nfor i in x:\n    seen.add(aux(i))\nreturn seen"),
     "coordinator", set()),
]

# label sets that must be exactly these (nothing extra): the mislabels of issue 23
EXACT = [
    ("unparseable helper, main only calls it", "def aux(x)\n    return x\n", main("return aux(x)"), {"unparseable"}),
    ("nested def relays aux, called in a comprehension", AUX,
     main("def each(w):\n    return aux(w)\nreturn [each(w) for w in x]"), {"coordinator"}),
    ("append in a for loop", AUX, main("out = []\nfor i in x:\n    out.append(aux(i))\nreturn out"),
     {"coordinator"}),
    ("append then transform in a loop", AUX,
     main("out = []\nfor i in x:\n    out.append(aux(i) + 1)\nreturn out"), {"coordinator", "decorator"}),
]


@pytest.mark.parametrize("name, helper, code, found", EXACT, ids=[c[0] for c in EXACT])
def test_the_whole_label_set_of_cases_in_between(name, helper, code, found):
    assert classify(helper, code, "solve").found == found


@pytest.mark.parametrize("name, helper, code, primary, also", CASES, ids=[c[0] for c in CASES])
def test_scheme_of_labelled_program(name, helper, code, primary, also):
    result = classify(helper, code, "solve")
    assert result.primary == primary, result.found
    assert primary in result.found and also <= result.found


@pytest.mark.parametrize("name, helper, code, primary, also", [c for c in CASES if c[1] == AUX],
                         ids=[c[0] for c in CASES if c[1] == AUX])
def test_the_reward_and_the_scheme_detector_agree_on_whether_main_uses_aux(name, helper, code, primary, also):
    from kit.tasks.codeparse import aux_use

    assert aux_use(code, "solve").uses == (primary not in ("no_use", "unparseable")), name


def test_chained_aliases_are_one_rule_for_the_reward_and_the_schemes():
    from kit.tasks.codeparse import aux_use

    code = main("a = b = aux\nreturn a(x) + 1")
    assert aux_use(code, "solve").calls == 1 and aux_use(code, "solve").uses
    assert classify(AUX, code, "solve").primary == "decorator"
    later = main("g = h\nh = aux\nreturn g(x) + 1")  # an alias of an alias defined later in the source
    assert aux_use(later, "solve").uses and classify(AUX, later, "solve").primary == "decorator"


def test_at_least_forty_labelled_programs_cover_every_scheme():
    assert len(CASES) >= 40
    assert {c[3] for c in CASES} == {"fallback", "decorator", "coordinator", "strategy_filter", "wrapper",
                                     "no_use", "unparseable"}


def test_scheme_shares_per_step_from_rollouts(tmp_path):
    rows = [
        {"step": 1, "item": "p", "turn": 0, "completions": [AUX, main("return aux(x)")]},
        {"step": 1, "item": "p", "turn": 0, "completions": [AUX, main("return [aux(v) for v in x]")]},
        {"step": 1, "item": "p", "turn": 1, "completions": [AUX, main("return x")]},  # other turn: skipped
        {"step": 2, "item": "p", "turn": 0, "completions": [AUX, "```python\n" + main("return x") + "```"]},
    ]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    shares = scheme_shares(tmp_path, entry_points={"p": "solve"})
    assert [s["step"] for s in shares] == [1, 2]
    assert shares[0]["wrapper"] == 0.5 and shares[0]["coordinator"] == 0.5 and shares[0]["count"] == 2
    assert shares[1]["no_use"] == 1.0


def test_example_programs_render_as_markdown_one_per_scheme(tmp_path):
    rows = [{"step": 1, "item": "p", "turn": 0, "reward": 1.5, "completions": [AUX, main("return aux(x)")]},
            {"step": 2, "item": "p", "turn": 0, "reward": 0.5, "completions": [AUX, main("return x")]}]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = examples_markdown(tmp_path, entry_points={"p": "solve"})
    assert "**wrapper** (step 1, p, reward 1.50)" in text and "**no_use** (step 2, p, reward 0.50)" in text
    assert text.count("```python") == 2 and "return aux(x)" in text

