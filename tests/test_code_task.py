"""The code task: extraction, aux-use analysis, every reward level, data, feedback, and a short training run.

Run: python -m pytest tests/test_code_task.py
"""

from concurrent.futures import ThreadPoolExecutor

import pytest

from kit.tasks.codeparse import aux_use, drop_function, extract_code, function_info, parse_error
from kit.tasks import get_task
from kit.tasks.code import CodeTask, coop_problems, humaneval_problems, split_check

# --- extraction from messy completions

GOOD = "def aux(x):\n    return x + 1\n"


@pytest.mark.parametrize("text", [
    GOOD,
    "```python\n" + GOOD + "```",
    "Here is the helper you asked for:\n\n```python\n" + GOOD + "```\n\nIt adds one to x.",
    "```py\n" + GOOD + "```\n<|im_end|>\nuser: thanks",
    "<|im_start|>assistant\n" + GOOD + "<|im_end|>",
    "Sure! Here it is.\n" + GOOD + "\nThis function returns x plus one.\nHope it helps!",
    "```python\n" + GOOD,  # the fence never closed (cut by max_new_tokens)
    "```\n" + GOOD + "```\nand some words after",
])
def test_extract_code_recovers_the_function_from_messy_text(text):
    assert extract_code(text).strip() == GOOD.strip()


def test_extract_code_joins_several_python_blocks_and_skips_other_languages():
    text = ("First:\n```python\nimport math\n```\nThen:\n```bash\npip install x\n```\n```python\n" + GOOD + "```")
    assert extract_code(text) == "import math\n\n" + GOOD


def test_extract_code_keeps_top_level_code_lines_and_comments():
    text = "import re\n\n# a comment\n" + GOOD + "\nresult = aux(1)\nprint(result)\n"
    assert extract_code(text) == text


def test_extract_code_of_pure_prose_is_empty():
    assert extract_code("I am not able to write this function, sorry.") == ""


def test_function_info_on_parsable_and_broken_code():
    assert function_info(GOOD, "aux") == (True, True)
    assert function_info("def aux(x):\n    print(x)\n", "aux") == (True, False)
    assert function_info("def aux(x):\n    return x +\n", "aux") == (True, True)  # broken: read by lines
    assert function_info("def main(x):\n    return x\n", "aux") == (False, False)


def test_drop_function_removes_decorated_definitions_only():
    code = "import math\n@staticmethod\ndef aux(x):\n    return x\n\ndef f(y):\n    return aux(y)\n"
    assert drop_function(code, "aux") == "import math\n\ndef f(y):\n    return aux(y)\n"


# --- how main uses aux (AST)

def _use(body: str):
    return aux_use("def solve(xs):\n" + body, "solve")


@pytest.mark.parametrize("body, calls, wrapper, ignored", [
    ("    return aux(xs)\n", 1, True, False),  # thin wrapper
    ('    """doc"""\n    r = aux(xs)\n    return r\n', 1, True, False),  # still a wrapper
    ("    return aux(sorted(xs))\n", 1, False, False),  # computes before handing over
    ("    aux(xs)\n    return len(xs)\n", 1, False, True),  # result thrown away
    ("    unused = aux(xs)\n    return len(xs)\n", 1, False, True),  # variable never read
    ("    try:\n        return aux(xs)\n    except Exception:\n        return sorted(xs)\n", 1, False, False),
    ("    total = 0\n    for x in xs:\n        total += aux(x)\n    return total\n", 1, False, False),  # loop
    ("    if aux(xs):\n        return 1\n    return 0\n", 1, False, False),  # condition
    ("    h = aux\n    return [h(x) for x in xs]\n", 1, False, False),  # alias
    ("    return list(map(aux, xs))\n", 1, False, False),  # passed as a value
    ("    f = lambda x: aux(x) * 2\n    return f(xs)\n", 1, False, False),  # through a lambda
    ("    return sorted(xs)\n", 0, False, False),  # no use
])
def test_aux_use_cases(body, calls, wrapper, ignored):
    use = _use(body)
    assert (use.calls, use.wrapper, use.ignored) == (calls, wrapper, ignored)


def test_aux_use_sees_a_local_rebinding_as_shadowing():
    assert _use("    aux = sorted\n    return aux(xs)\n").uses is False
    assert aux_use("def solve(xs, aux):\n    return aux(xs)\n", "solve").uses is False


def test_aux_use_ignores_comments_and_docstrings_that_mention_aux():
    assert _use('    """Calls aux(xs) in spirit."""\n    # aux(xs)\n    return xs\n').calls == 0


# --- reward levels on hand-written pairs

ITEM = {"id": "t/double_all", "prompt": 'def double_all(xs: list) -> list:\n    """Double every number."""\n',
        "entry_point": "double_all", "context": "", "setup": "",
        "tests": ["assert double_all([1, 2]) == [2, 4]", "assert double_all([]) == []",
                  "assert double_all([0, -3]) == [0, -6]", "assert double_all([5]) == [10]"]}
AUX_OK = "def aux(x):\n    return 2 * x\n"
MAIN_COOP = "def double_all(xs):\n    out = []\n    for x in xs:\n        out.append(aux(x))\n    return out\n"


@pytest.fixture(scope="module")
def task():
    return CodeTask(dataset="coop", test_timeout=2.0)


@pytest.mark.parametrize("helper, main, parts", [
    ("", "", (0.0, 0.0, 0.0, 0.0)),  # nothing
    (AUX_OK, "print('no function')", (0.4, 0.0, 0.0, 0.0)),  # aux only: stop at structure
    ("def aux(x):\n    print(x)\n", MAIN_COOP, (0.6, 0.5, 0.25, 0.0)),  # aux returns nothing; [] still passes
    (AUX_OK, "def double_all(xs):\n    return [aux(x) for x in xs\n", (1.0, 0.0, 0.0, 0.0)),  # syntax error
    (AUX_OK, MAIN_COOP, (1.0, 0.5, 1.0, 1.5)),  # full marks: loop over aux
    (AUX_OK, "def double_all(xs):\n    return [x + x for x in xs]\n", (1.0, 0.5, 1.0, 0.0)),  # aux unused
    ("def aux(xs):\n    return [2 * x for x in xs]\n", "def double_all(xs):\n    return aux(xs)\n",
     (1.0, 0.5, 1.0, 0.5)),  # thin wrapper
    (AUX_OK, "def double_all(xs):\n    aux(1)\n    return [x * 2 for x in xs]\n", (1.0, 0.5, 1.0, 1.0)),  # ignored
    ("def aux(x):\n    if x < 0:\n        raise ValueError(x)\n    return 2 * x\n",
     "def double_all(xs):\n    try:\n        return [aux(x) for x in xs]\n    except ValueError:\n"
     "        return [x * 2 for x in xs]\n", (1.0, 0.5, 1.0, 1.5)),  # fallback with try/except
    ("def aux(x):\n    return x > 0\n",
     "def double_all(xs):\n    return [2 * x if aux(x) else x + x for x in xs]\n", (1.0, 0.5, 1.0, 1.5)),  # condition
    (AUX_OK, "def double_all(xs):\n    return [aux(x) + 1 for x in xs]\n", (1.0, 0.5, 0.25, 1.5)),  # 1 test passes
    (AUX_OK, "def double_all(xs):\n    return [aux(x) + 1 for x in xs] or None\n", (1.0, 0.5, 0.0, 0.0)),  # none pass
])
def test_reward_levels(task, helper, main, parts):
    r = task.reward(ITEM, (helper, main))
    got = tuple(r.parts[k] for k in ("structure", "syntax", "tests", "cooperation"))
    assert got == pytest.approx(parts)
    assert r.total == pytest.approx(sum(parts)) and r.total <= 4.0


def test_main_redefining_aux_uses_the_helpers_aux(task):
    main = "def aux(x):\n    return 0\n\n" + MAIN_COOP
    assert task.reward(ITEM, (AUX_OK, main)).parts["tests"] == 1.0


def test_reward_runs_each_assert_under_its_own_timeout(task):
    main = "def double_all(xs):\n    while not xs:\n        pass\n    return [aux(x) for x in xs]\n"
    r = task.reward(ITEM, (AUX_OK, main))
    assert r.parts["tests"] == 0.75
    assert any("timeout" in why for _, why in r.details["failures"])


def test_identical_joint_actions_are_scored_once(task, monkeypatch):
    calls = []
    monkeypatch.setattr(task, "_score", lambda item, h, m: calls.append(1) or CodeTask._score(task, item, h, m))
    helper, main = AUX_OK + "# cached\n", MAIN_COOP
    first = task.reward(ITEM, (helper, main))
    second = task.reward(ITEM, ("```python\n" + helper + "```", main))  # same code after extraction
    assert first.total == second.total and len(calls) == 1


# --- feedback for turn 2

def test_feedback_reports_syntax_error_with_line_to_both_agents(task):
    main = "def double_all(xs):\n    return [aux(x) for x in xs\n"
    helper_prompt, main_prompt = task.feedback(ITEM, (AUX_OK, main), task.reward(ITEM, (AUX_OK, main)))
    assert "Syntax error in main" in main_prompt and "line 2" in main_prompt
    assert "return [aux(x) for x in xs" in main_prompt and AUX_OK.strip() in helper_prompt


def test_feedback_reports_failing_asserts_with_got_and_expected(task):
    main = "def double_all(xs):\n    return [aux(x) + 1 for x in xs]\n"
    _, prompt = task.feedback(ITEM, (AUX_OK, main), task.reward(ITEM, (AUX_OK, main)))
    assert "Tests: 1 of 4 passed" in prompt
    assert "`assert double_all([1, 2]) == [2, 4]` -> AssertionError: [3, 5] != [2, 4]" in prompt


def test_feedback_names_missing_functions_and_unused_aux(task):
    _, prompt = task.feedback(ITEM, (AUX_OK, "x = 1\n"), task.reward(ITEM, (AUX_OK, "x = 1\n")))
    assert "`double_all` is not defined" in prompt
    main = "def double_all(xs):\n    return [x + x for x in xs]\n"
    _, prompt = task.feedback(ITEM, ("", main), task.reward(ITEM, ("", main)))
    assert "`aux` is not defined" in prompt


# --- data

def test_humaneval_loads_offline_with_the_papers_splits():
    problems = humaneval_problems()
    assert len(problems) == 164
    task = CodeTask(dataset="humaneval")
    train, held_out = task.load("train"), task.load("eval")
    assert len(train) == 100 and len(held_out) == 32
    assert train[0]["id"] == "HumanEval/33" and held_out[0]["id"] == "HumanEval/0"


def test_split_check_keeps_setup_and_loops_together():
    setup, tests = split_check("METADATA = {}\n\ndef check(candidate):\n    import math\n"
                               "    assert candidate(1) == 1\n    x = 2\n    for i in range(3):\n"
                               "        assert candidate(i) == i\n")
    assert setup == "METADATA = {}"
    assert tests == ["import math\nassert candidate(1) == 1", "x = 2\nfor i in range(3):\n    assert candidate(i) == i"]


def test_split_check_drops_asserts_that_do_not_test_the_candidate():
    _, tests = split_check("def check(candidate):\n    assert True, 'debugging'\n    assert candidate(1) == 1\n")
    assert tests == ["assert candidate(1) == 1"]
    assert all("candidate" in t for p in humaneval_problems() for t in p["tests"])


def test_every_humaneval_canonical_solution_passes_its_split_asserts():
    task = CodeTask(dataset="humaneval")
    problems = humaneval_problems()
    with ThreadPoolExecutor(2) as pool:
        rewards = list(pool.map(lambda p: task.reward(p, (AUX_OK, p["reference"])), problems))
    assert [p["id"] for p, r in zip(problems, rewards) if r.parts["tests"] != 1.0] == []


def test_cooperative_problems_are_well_formed():
    problems = coop_problems()
    assert len(problems) >= 40
    assert len({p["id"] for p in problems}) == len(problems)
    assert all(len(p["tests"]) >= 5 for p in problems)
    assert all(function_info(p["reference_pair"][0], "aux") == (True, True) for p in problems)


def test_every_cooperative_reference_earns_full_reward_and_wrong_solutions_fail(task):
    def check(p):
        helper, main = p["reference_pair"]
        wrong_main = f"def {p['entry_point']}(*args, **kwargs):\n    return None\n"
        broken_aux = "def aux(*args, **kwargs):\n    return None\n"
        return (p["id"], task.reward(p, (helper, main)).total, task.reward(p, (helper, wrong_main)).parts["tests"],
                task.reward(p, (broken_aux, main)).parts["tests"])

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(check, coop_problems()))
    assert [pid for pid, full, _, _ in results if full != 4.0] == []
    assert [pid for pid, _, wrong, _ in results if wrong == 1.0] == []
    assert [pid for pid, _, _, broken in results if broken == 1.0] == []  # main really depends on aux


def test_get_task_builds_the_code_task_and_rejects_bad_arguments():
    assert get_task("code", 2, dataset="coop").roles == ["helper", "main"]
    with pytest.raises(ValueError, match="dataset='apps'"):
        get_task("code", 2, dataset="apps")
    with pytest.raises(ValueError, match="two agents"):
        get_task("code", 3)


def test_prompts_name_aux_and_the_entry_point(task):
    helper, main = task.prompts(ITEM)
    assert "`aux`" in helper and "Do not write `double_all`" in helper
    assert "Do not define `aux`" in main and ITEM["prompt"].strip() in main


# --- end to end

def test_tiny_model_trains_on_the_code_task_for_two_turns(tmp_path):
    """A few real steps: batched generation, sandboxed rewards in a thread pool, turn-2 feedback, updates.

    The random tiny model writes no code, so the code reward is 0 everywhere; a small length reward is added so
    advantages are not all zero and both agents' gradients flow.
    """
    import json

    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    def shorter_is_better(item, completions):
        return -0.01 * sum(len(c) for c in completions)

    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={tmp_path / 'code'}", "progress=false", "task=code", "task_args={dataset: coop}", "num_steps=2",
        "batch_size=2", "num_generations=2", "max_new_tokens=12", "num_turns=2", "eval_every=2",
        "num_eval_items=2", "save_every=2", "reward_workers=2"])
    trainer = Trainer(cfg, reward_funcs=[shorter_is_better], log=lambda *_: None)
    trainer.train()
    trainer.close()
    rows = [json.loads(line) for line in open(tmp_path / "code" / "metrics.jsonl")]
    last = rows[-1]
    assert last["step"] == 2
    assert {"reward/structure", "reward/syntax", "reward/tests", "reward/cooperation", "reward/code",
            "reward/shorter_is_better", "eval/tests"} <= set(last)
    assert all(r.get("grad_norm/agent_0", 1) > 0 and r.get("grad_norm/agent_1", 1) > 0 for r in rows)
    rollouts = [json.loads(line) for line in open(tmp_path / "code" / "rollouts.jsonl")]
    assert {r["turn"] for r in rollouts} == {0, 1}
    second = [r for r in rollouts if r["turn"] == 1][0]
    assert all("Your previous code:" in p and "What happened when the team's program ran" in p
               for p in second["prompts"])
    from kit.analysis.schemes import scheme_shares

    shares = scheme_shares(tmp_path / "code")  # entry points read from the run's own task
    assert [s["step"] for s in shares] == [1, 2]
    assert all(sum(s[k] for k in ("fallback", "decorator", "coordinator", "strategy_filter", "wrapper", "no_use",
                                  "unparseable")) == pytest.approx(1.0) for s in shares)


def test_hub_loader_converts_humaneval_format_rows(monkeypatch):
    """The Colab path (hub:OpenMLRL/CoopHumanEval) with `datasets.load_dataset` faked: no network here."""
    datasets = pytest.importorskip("datasets")
    row = {"task_id": "Coop/0", "prompt": "def f(x):\n    \"\"\"Double x.\"\"\"\n", "entry_point": "f",
           "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"}
    fake = datasets.Dataset.from_list([row] * 20)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: fake)
    task = CodeTask(dataset="hub:OpenMLRL/CoopHumanEval")
    assert len(task.load("eval")) == 16 and len(task.load("train")) == 4
    item = task.load("eval")[0]
    assert item["tests"] == ["assert candidate(2) == 4", "assert candidate(0) == 0"]
    assert task.reward(item, (AUX_OK, "def f(x):\n    return aux(x)\n")).parts["tests"] == 1.0
    monkeypatch.setattr(datasets, "load_dataset", lambda name, split: datasets.Dataset.from_list([{"q": "?"}]))
    with pytest.raises(ValueError, match="missing"):
        CodeTask(dataset="hub:someone/other").load("train")


# --- hostile completions through the training path (issue 20)


def _prime_fib():
    return next(it for it in coop_problems() if it["id"] == "coop/prime_fib")


FRAME_ATTACK = ("import sys\n"
                "f = sys._getframe()\n"
                "while f is not None:\n"
                "    for d in (f.f_locals, f.f_globals):\n"
                "        for v in list(d.values()):\n"
                "            if isinstance(v, dict) and 'tests' in v:\n"
                "                v['tests'][:] = ['pass'] * len(v['tests'])\n"
                "    f = f.f_back\n\n"
                "def prime_fib(n):\n    return aux(0)\n")


def test_rewriting_the_harness_from_the_program_earns_no_test_credit():
    item = _prime_fib()
    helper = item["reference_pair"][0]
    r = CodeTask(dataset="coop").reward(item, (helper, FRAME_ATTACK))
    assert r.parts["tests"] == 0.0 and r.parts["cooperation"] == 0.0 and r.total == 1.5


def test_a_refused_attempt_followed_by_correct_code_earns_no_test_credit_and_is_recorded():
    item = _prime_fib()
    helper, main = item["reference_pair"]
    attack = "import os\ntry:\n    os.system('id')\nexcept BaseException:\n    pass\n\n" + main
    task = CodeTask(dataset="coop")
    honest, tried = task.reward(item, (helper, main)), task.reward(item, (helper, attack))
    assert honest.total == 4.0 and honest.parts["violation"] == 0.0
    assert tried.parts["tests"] == 0.0 and tried.parts["violation"] == 1.0 and tried.total == 1.5
    assert "os.system" in tried.details["violation"]
    assert "os.system" in task.feedback(item, (helper, attack), tried)[1]


def test_the_problem_context_is_trusted_and_the_program_cannot_replace_it():
    # HumanEval/32's tests call the prompt's own `poly`: a program that redefines poly must not pass
    item = next(it for it in humaneval_problems() if it["id"] == "HumanEval/32")
    cheat = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return aux(xs)\n"
    helper = "def aux(xs):\n    return 0.0\n"
    r = CodeTask().reward(item, (helper, cheat))
    assert r.parts["syntax"] == 0.5 and r.parts["tests"] == 0.0


def test_code_nested_too_deep_for_the_parser_is_a_syntax_failure_not_a_crash():
    item = _prime_fib()
    deep = "def prime_fib(n):\n    return " + "-" * 20000 + "1\n"
    r = CodeTask(dataset="coop").reward(item, (item["reference_pair"][0], deep))
    assert r.parts["syntax"] == 0.0 and "too deeply nested" in r.details["syntax_errors"][0]
    # a null byte is said as one (the parser raises SyntaxError or, on older Pythons, ValueError for it), and a lone
    # surrogate (a JSON "\\ud83d" escape in a tool call's code: UnicodeEncodeError, a ValueError) as what it is
    task = CodeTask(dataset="coop")
    null = task.reward(item, (item["reference_pair"][0], "def prime_fib(n):\n    return 1\x00\n"))
    assert null.parts["syntax"] == 0.0 and "null byte" in null.details["syntax_errors"][0]
    assert "null byte" in str(parse_error_as_older_pythons("x = 1\x00"))
    surrogate = str(parse_error("def aux(s):\n    return s + '\ud83d'\n"))
    assert "cannot be parsed" in surrogate and "surrogate" in surrogate and "null" not in surrogate


def parse_error_as_older_pythons(code):
    """codeparse.parse_error where ast.parse raises ValueError for a null byte (Python < 3.11.4 or so)."""
    import ast
    from unittest import mock

    with mock.patch.object(ast, "parse", side_effect=ValueError("source code string cannot contain null bytes")):
        return parse_error(code)


def test_a_violation_reaches_the_rollout_log_and_the_metrics(tmp_path):
    # what a sandbox refusal looks like downstream, with a task whose reward reports one for agent 1's odd digits
    import json

    from kit.run.config import load_config
    from kit.tasks.rewards import Reward
    from kit.tasks.toy import DigitSum
    from kit.trainers.trainer import Trainer

    class Tries(DigitSum):
        def reward(self, item, completions):
            tried = (self.digit(completions[1]) or 0) % 2 == 1
            return Reward(0.0 if tried else 1.0, {"tests": 0.0 if tried else 1.0, "violation": float(tried)},
                          {"violation": "refused: os.system" if tried else ""})

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path}", "progress=false", "num_steps=1",
                                             "eval_every=0", "save_every=0"])
    Trainer(cfg, task=Tries(), log=lambda *_: None).train()
    rows = [json.loads(line) for line in open(tmp_path / "rollouts.jsonl")]
    tried = [r for r in rows if r["parts"]["violation"] == 1.0]
    assert tried and all(r["violation"] == "refused: os.system" for r in tried)
    assert all("violation" not in r for r in rows if r["parts"]["violation"] == 0.0)
    metrics = json.loads(open(tmp_path / "metrics.jsonl").readline())
    assert metrics["reward/violation"] == pytest.approx(len(tried) / len(rows))


# --- what main is told of aux (issue 78: the lever that lets main call it), and main's calls counted at every level

@pytest.mark.parametrize("prompt, params", [
    ('def f(a: int, b: List[int]) -> int:\n    """Doc."""\n', "a, b"),
    ("from typing import Dict\n\ndef f(d: Dict[str, int], n: int) -> bool:\n    \"\"\"\n\tdef f(x) in a docstring\n\t\"\"\"\n",
     "d, n"),
    ("def f(a,\n      b: Tuple[int, int] = (1, 2), *args, c=3, **kw):\n    pass\n", "a, b, *args, c, **kw"),
    ("def f(a, *, key):\n    pass\n", "a, *, key"),
    ("def g(x):\n    pass\n", None),  # no def of the entry point
    ("def f(a:\n", None),  # a signature that never closes
    ("def f(a): return a\n", "a"),  # a one-line def
    ('def g(x):\n    """Unlike\n    def f(x) below, it\n    """\n\ndef f(a, b):\n    pass\n',
     "a, b"),  # a docstring's line that starts like the def comes first
    ("def f(a, /, b):\n    pass\n", "a, b"),
])
def test_entry_params_reads_the_signature_by_the_ast(prompt, params):
    from kit.tasks.signatures import entry_params

    assert entry_params(prompt, "f") == params


def test_aux_signature_entry_tells_both_agents_the_entry_points_arguments():
    free = CodeTask(dataset="coop").prompts(ITEM)
    entry = CodeTask(dataset="coop", aux_signature="entry").prompts(ITEM)
    assert "`aux(xs)`, taking the same arguments as `double_all`" in entry[0]
    assert "Call `aux(xs)` where it helps" in entry[1]
    assert "aux(xs)" not in free[0] + free[1] and "Write one function named `aux`" in free[0]
    unreadable = {**ITEM, "prompt": "Double every number (no signature here)."}  # falls back to the free prompts
    assert CodeTask(dataset="coop", aux_signature="entry").prompts(unreadable)[1] == \
        CodeTask(dataset="coop").prompts(unreadable)[1]
    with pytest.raises(ValueError, match="aux_signature"):
        CodeTask(dataset="coop", aux_signature="typed")


def test_aux_signature_reaches_the_training_prompts_through_the_config():
    from kit.run.config import load_config
    from kit.tasks import task_for

    cfg = load_config("coder_mbpp", overrides=["task_args={dataset: mbpp, prefill: helper, aux_signature: entry}"])
    task = task_for(cfg)
    item = task.load("train")[0]
    assert "taking the same arguments as" in str(task.prompts(item)[1])


@pytest.mark.parametrize("helper, main, calls", [
    ("", MAIN_COOP, True),  # no aux at all: stops at structure, yet main's call is seen
    (AUX_OK, "def double_all(xs):\n    return [aux(x) + 1 for x in xs] or None\n", True),  # no test passes
    (AUX_OK, "def double_all(xs):\n    return [x + x for x in xs]\n", False),
    (AUX_OK, "def double_all(xs):\n    aux = len\n    return [aux(x) for x in xs]\n", False),  # shadowed
])
def test_main_calls_aux_is_recorded_at_every_level(task, helper, main, calls):
    assert task.reward(ITEM, (helper, main)).details["main_calls_aux"] is calls


def test_each_training_step_logs_how_often_main_calls_aux(task):
    """reward_log/main_calls_aux in a step's metrics: the rate on that step's own samples, a cached score too."""
    from kit.tasks.rewards import RewardModel

    model = RewardModel(task=task)
    alone = "def double_all(xs):\n    return [x + x for x in xs]\n"
    for _ in range(2):  # the second time from the task's cache
        assert model(ITEM, (AUX_OK, MAIN_COOP)).details["logged"] == {"main_calls_aux": 1.0}
        assert model(ITEM, (AUX_OK, alone)).details["logged"] == {"main_calls_aux": 0.0}


@pytest.mark.parametrize("params, call", [("a, b", "a, b"), ("a, *, key", "a, key=key"), ("", ""),
                                          ("a, *xs, key, **kw", "a, *xs, key=key, **kw")])
def test_the_call_main_is_shown_passes_keyword_only_arguments_by_keyword(params, call):
    from kit.tasks.signatures import call_form

    assert call_form(params) == call
    item = {**ITEM, "prompt": "def double_all(xs, *, times=2):\n    pass\n"}
    main = CodeTask(dataset="coop", aux_signature="entry").prompts(item)[1]
    assert "`aux(xs, *, times)`" in main and "Call `aux(xs, times=times)`" in main
