"""Environments and tools (issue 52), the built-in environments: KeyHalves, CodeTests (visible examples only),
the Board, and the code task's tool prefills (tool, board, discussion).

Run: python -m pytest tests/test_env_builtin.py
"""

import pytest

from env_helpers import (Scripted, team, CallsFirst, coder_act, CallsThenFinishes, PostsThenReads,
                         PostsThenReadsThenAnswers, PostsThenRambles)

from kit.engine import tools
from kit.engine.rollout import SamplingParams
from kit.run.config import ConfigError, load_config
from kit.sandbox.envhost import EnvHost
from kit.tasks import TaskArgError
from kit.tasks.code import READ_START
from kit.tasks.environments import KeyHalves, visible_examples


def test_the_key_game_scores_its_exact_optimum():
    env = KeyHalves()
    env.reset(key="123456")
    assert env.get_reward() == 0.0
    env.read_left(), env.read_right()
    env.submit_left("123"), env.submit_right("456")
    assert env.get_reward() == 1.0
    env.reset(key="123456")
    env.read_left()
    env.submit_left("123")
    assert env.get_reward() == pytest.approx(0.25 + 0.25)
    assert env.submit_left("submitted").startswith("already submitted (123)")  # the first submission is final
    assert env.get_reward() == pytest.approx(0.25 + 0.25)
    assert env.get_agent_rewards() == {"left": 1.0, "right": 0.0}  # left read and placed its digits; right nothing
    env.reset(key="123456")
    env.read_right(), env.submit_right("450")
    assert env.get_agent_rewards() == pytest.approx({"left": 0.0, "right": 0.5 + 0.5 * 2 / 3})
    assert env.get_reward() == pytest.approx((0.0 + 0.5 + 0.5 * 2 / 3) / 2)  # the team's: the two shares' mean


def test_visible_examples_are_the_docstrings_not_the_hidden_tests():
    prompt = 'def add(a, b):\n    """Add.\n    >>> add(1, 2)\n    3\n    """\n'
    assert visible_examples(prompt) == ["assert add(1, 2) == 3"]


def test_visible_examples_read_humanevals_one_line_forms_and_only_calls_on_literals():
    prompt = ('def f(xs, k=0):\n    """Examples.\n'
              '    f([1, 2]) == 3\n    f([]) ==> 0\n    f("a->b") => true\n    for f((1,), k=2) ➞ -1.5\n'
              '    f([5])   # returns "x"\n    f(\'q\') returns None.\n    f([9]) -> 9\n'
              '    f(a) => False\n    f([2]) -> 2 - 1 = 1\n    g(1) == 2\n    xf(1) == 2\n    f(*xs) == 1\n'
              '    f([1, 2]) == 3\n    >>> f([7])\n    7\n    """\n')
    assert visible_examples(prompt, "f") == [
        "assert f([7]) == 7",  # the doctest first
        "assert f([1, 2]) == 3", "assert f([]) == 0", 'assert f("a->b") == True',  # a separator inside a string is no split
        "assert f((1,), k=2) == -1.5", 'assert f([5]) == "x"', "assert f('q') == None", "assert f([9]) == 9"]
    # a variable argument, a value that is no literal, another function, a starred call: dropped; the repeat: once
    assert visible_examples(prompt) == ["assert f([7]) == 7"]  # without the entry point, the doctests alone


def test_humanevals_visible_examples_hold_for_its_reference_solutions():
    """Two thirds of HumanEval's training problems show their examples only in the one-line forms; every example
    read is right for the problem's canonical solution, but the two the dataset itself gets wrong."""
    from kit.tasks.code import humaneval_problems

    problems = humaneval_problems()
    shown = [visible_examples(p["prompt"], p["entry_point"]) for p in problems]
    assert sum(map(bool, shown[33:133])) == 77 and sum(map(bool, (visible_examples(p["prompt"]) for p in
                                                                  problems[33:133]))) == 36
    wrong = []
    for problem, asserts in zip(problems, shown):
        space = {}
        exec(problem["reference"], space)  # the dataset's own solution (trusted), not generated code
        for test in asserts:
            try:
                exec(test, space)
            except AssertionError:
                wrong.append(test)
    assert sum(map(len, shown)) == 370 and wrong == [
        "assert median([-10, 4, 6, 1000, 10, 20]) == 15.0",  # HumanEval/47's doctest (the median is 8.0)
        'assert bf("Earth", "Mercury") == ("Venus")']  # HumanEval/148: a string in parentheses, meant as a tuple


def test_the_code_test_tool_runs_a_draft_on_the_visible_examples_only():
    from kit.tasks.environments import DONE, FIX, CodeTests

    env = CodeTests()
    prompt = 'def add(a, b):\n    """Add two numbers.\n    >>> add(1, 2)\n    3\n    >>> add(2, 2)\n    4\n    """\n'
    told = env.reset(prompt=prompt, entry_point="add", tests=["assert add(5, 5) == 10", "assert add(0, 0) == 0"])
    assert "run_tests(code)" in told and "2 example(s)" in told  # the agents are told of the tool
    assert env.reset(prompt='def f():\n    """No examples."""\n', entry_point="f") is None
    env.reset(prompt=prompt, entry_point="add", tests=["assert add(5, 5) == 10", "assert add(0, 0) == 0"])
    good = env.run_tests("def add(a, b):\n    return a + b\n")
    assert good.count("ok: ") == 2 and "FAILED" not in good and "add(5, 5)" not in good
    bad = env.run_tests("def add(a, b):\n    return a * b\n")
    assert "ok: assert add(2, 2) == 4" in bad and "FAILED: assert add(1, 2) == 3" in bad
    # each result ends with the next step: answer when every example passes, else fix (a final answer is what counts)
    assert good.endswith(DONE) and bad.endswith(FIX) and env.run_tests("def add(a, b):\n    return (").endswith(FIX)
    env.reset(prompt='def f():\n    """No examples."""\n', entry_point="f")
    assert env.run_tests("def f():\n    return 1\n").endswith(DONE)
    assert env.run_tests("def f():\n    return 1 +\n").endswith(FIX)


def test_a_code_draft_runs_after_the_problems_imports_and_with_the_teams_latest_functions():
    from kit.tasks.code import humaneval_problems
    from kit.tasks.environments import FIX, CodeTests

    env = CodeTests()
    item = humaneval_problems()[0]  # has_close_elements(numbers: List[float], ...): `List` comes from its context
    env.reset(**item)
    typed = ("def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n")
    assert env.run_tests(typed).count("ok: ") == 2
    # main's draft calls aux: before the helper tested one it is not defined; then it runs with the helper's latest
    main = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    return aux(numbers) < threshold\n"
    assert "NameError" in env.run_tests(main)
    env.run_tests("def aux(xs):\n    return 0.0\n")  # a wrong aux first, then a right one: the latest counts
    assert "FAILED: assert has_close_elements([1.0, 2.0, 3.0], 0.5) == False" in env.run_tests(main)
    env.run_tests("```python\ndef aux(xs):\n    s = sorted(xs)\n    return min(b - a for a, b in zip(s, s[1:]))\n```")
    assert env.run_tests(main).count("ok: ") == 2
    own = "def aux(xs):\n    return 99.0\n\n" + main  # a draft's own aux wins over the team's
    assert env.run_tests(own).count("ok: ") == 1
    env.reset(**item)  # a new row forgets the drafts
    assert "NameError" in env.run_tests(main)
    env.reset(**item)  # the helper's aux before any draft of the entry point: it only runs (no example can call it)
    said = env.run_tests("def aux(xs):\n    return 0.0\n")
    assert said.startswith("the examples call has_close_elements, which no tested draft defines yet; the code ran\n")
    assert env.run_tests("def aux(xs):\n    return (").endswith(FIX)
    # a draft that does not parse is said to, with its own line (not the program's, after the problem's imports)
    said = env.run_tests("import math\ndef aux(0):\n    return 0\n")
    assert said.startswith("the code does not parse: SyntaxError: ") and said.endswith(f" (line 2: def aux(0):)\n{FIX}")


def test_a_code_test_tool_reads_humanevals_one_line_examples():
    from kit.tasks.code import humaneval_problems
    from kit.tasks.environments import DONE, FIX, CodeTests

    item = next(p for p in humaneval_problems() if p["id"] == "HumanEval/69")  # search(): `search([...]) == 2` lines
    env = CodeTests()
    assert "3 example(s)" in env.reset(**item)  # without them: no example, and the agents not told of the tool
    right = env.run_tests(item["reference"])  # the problem's stub and its canonical body
    assert right.count("ok: assert search(") == 3 and right.endswith(DONE)
    wrong = env.run_tests("def search(lst):\n    return -1\n")
    assert "FAILED: assert search([4, 1, 2, 2, 3, 1]) == 2" in wrong and wrong.endswith(FIX)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_board_carries_a_draft_from_one_agent_to_another_in_the_same_round(team, workers):
    """The sequential schedule as an environment: the helper's post runs before main's read (agent order), on one
    environment process or on two (each world's calls in order in its own)."""
    from kit.engine.tools import act
    from kit.sandbox.envpool import EnvPool

    class Poster(Scripted):
        logp = -0.5

        def answer(self, context, adapter):
            if "<tool_response>" in context.split("team shares a board")[-1]:
                return "done"
            if adapter == "agent_0":
                return '<tool_call>{"name": "post", "arguments": {"text": "def aux(): return 1"}}</tool_call>'
            return '<tool_call>{"name": "read", "arguments": {}}</tool_call>'

    host = EnvHost("kit.tasks.environments:Board", timeout_s=10) if workers == 1 else \
        EnvPool("kit.tasks.environments:Board", workers, timeout_s=10)
    saved = team.engines[0]
    team.engines[0] = Poster(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        ro = act(team, [(0, "write aux"), (1, "write main")], 2, SamplingParams(max_new_tokens=200),
                 worlds=[{"id": "p"}], host=host, roles=["helper", "main"], max_tool_calls=2)
    finally:
        team.engines[0] = saved
        host.close()
    # labelled with the poster's role (the kit's `caller`), in worlds 0 and 1
    assert all("[helper]\ndef aux(): return 1" in ro.transcripts[1][g] for g in range(2))


def test_prefill_tool_starts_each_answer_as_a_test_call_and_main_tests_with_the_helpers_aux():
    task, item, prompts, ro, _ = coder_act(CallsFirst, "tool", "kit.tasks.environments:CodeTests")
    assert prompts[1].answer_start.endswith('{"code": "```python\ndef has_close_elements(')
    assert ro.tool_calls == 2
    assert ro.transcripts[1][0].count("ok: assert has_close_elements") == 2  # main's draft ran with the helper's aux
    # its one call spent, each agent is told that its next text is its answer
    assert all(f"{tools.NO_CALLS_LEFT}\n</tool_response>" in ro.transcripts[a][0] for a in range(2))
    assert all(ro.texts[a][0].startswith("```python\ndef ") for a in range(2))  # the reward reads the final answers
    assert task.reward(item, (ro.texts[0][0], ro.texts[1][0])).parts["tests"] == pytest.approx(1.0)


def test_code_after_tools_starts_the_answer_after_the_last_call_as_code_off_the_mask():
    task, item, prompts, ro, tok = coder_act(CallsThenFinishes, "tool", "kit.tasks.environments:CodeTests",
                                             code_after_tools=True)
    assert [p.final_start for p in prompts] == ["```python\ndef aux(", "```python\ndef has_close_elements("]
    for a, (rest, final) in enumerate(CallsFirst.DRAFTS.values()):
        assert ro.texts[a][0] == f"```python\n{final}\n```"  # what the reward reads: the start, then the sampled rest
        assert f"{tools.NO_CALLS_LEFT}\n</tool_response>" in ro.transcripts[a][0]
    assert task.reward(item, (ro.texts[0][0], ro.texts[1][0])).parts["tests"] == pytest.approx(1.0)
    seg = ro.segments[0]  # the helper's row first: the start is in its ids, off the mask (it was not sampled)
    ids = seg.input_ids[0, seg.prompt_len:]
    sampled = ids[seg.completion_mask[0].bool()]
    assert "```python" in tok.decode(ids) and "```python" not in tok.decode(sampled)
    # with calls left after the first, the answer is the agent's own, not started (it might have called again)
    _, _, _, ro, _ = coder_act(CallsFirst, "tool", "kit.tasks.environments:CodeTests", max_tool_calls=2,
                               code_after_tools=True)
    assert ro.texts[0][0] == f"```python\n{CallsFirst.DRAFTS['agent_0'][1]}\n```" and ro.tool_calls == 2


def test_code_after_tools_only_with_a_calling_prefill():
    from kit.tasks.code import CodeTask

    with pytest.raises(TaskArgError, match="code_after_tools"):
        CodeTask(dataset="coop", prefill="both", code_after_tools=True)


def test_prefill_board_is_the_sequential_schedule_main_reads_the_helpers_posted_aux():
    then = "Now give your final code in a ```python block, without a call."
    task, item, _, ro, _ = coder_act(PostsThenReads, "board", "kit.tasks.environments:Board", {"next_step": then})
    assert ro.tool_calls == 2
    assert f"posted (1 on the board)\n{then}\n{tools.NO_CALLS_LEFT}" in ro.transcripts[0][0]
    # the calls of a round run in agent order: main reads the draft the helper posted in the same round, whole
    read = ro.transcripts[1][0].split("<tool_response>")[1]
    assert read.lstrip().startswith("[helper]\n```python\ndef aux(xs):\n    s = sorted(xs)\n")  # labelled by its role
    assert f"zip(s, s[1:]))\n{then}\n{tools.NO_CALLS_LEFT}" in read  # the next step ends the result, once
    assert all(f"{tools.NO_CALLS_LEFT}\n</tool_response>" in ro.transcripts[a][0] for a in range(2))
    assert task.reward(item, (ro.texts[0][0], ro.texts[1][0])).parts["tests"] == pytest.approx(1.0)


def test_prefill_discussion_posts_both_drafts_then_each_agent_reads_both():
    task, item, prompts, ro, tok = coder_act(PostsThenReadsThenAnswers, "discussion", "kit.tasks.environments:Board",
                                             max_tool_calls=2)
    assert [p.round_starts for p in prompts] == [(READ_START,), (READ_START,)]
    assert prompts[1].answer_start.endswith('"arguments": {"text": "```python\ndef has_close_elements(')
    assert ro.tool_calls == 4  # a post and a read each
    for a in range(2):
        post, read = ro.transcripts[a][0].split("<tool_response>")[1:]
        assert post.lstrip().startswith("posted (") and tools.NO_CALLS_LEFT not in post  # a call left: the read
        assert ro.transcripts[a][0].count(READ_START) == 1  # round 1 started as the read, once
        # both drafts were posted in round 0, before either agent read in round 1: each reads both, whole
        # each post labelled with its author's role, the reader's own marked
        helper, main = ("[helper (you)]", "[main]") if a == 0 else ("[helper]", "[main (you)]")
        assert f"{helper}\n```python\ndef aux(xs):\n    s = sorted(xs)\n" in read
        assert f"{main}\n```python\ndef has_close_elements(numbers, threshold):\n    return aux(numbers) < threshold" \
            in read
        assert f"{tools.NO_CALLS_LEFT}\n</tool_response>" in read
    assert task.reward(item, (ro.texts[0][0], ro.texts[1][0])).parts["tests"] == pytest.approx(1.0)
    seg = ro.segments[0]  # the starts are in every row's ids, off the mask (they were not sampled)
    for row in range(2):
        ids = seg.input_ids[row, seg.prompt_len:]
        assert '"name": "read"' in tok.decode(ids)
        assert '"name"' not in tok.decode(ids[seg.completion_mask[row].bool()])


def test_a_round_cut_by_the_budget_is_read_with_its_start():
    _, _, _, ro, _ = coder_act(PostsThenRambles, "discussion", "kit.tasks.environments:Board", max_tool_calls=2,
                               max_new_tokens=200)
    assert ro.tool_calls == 2  # the posts; the reads were cut before their calls closed
    for a in range(2):
        assert ro.texts[a][0].startswith(READ_START + "xxx")  # the reward reads what the row wrote, its start first


@pytest.mark.parametrize("prefill, environment", [("board", "kit.tasks.environments:CodeTests"),
                                                   ("tool", "kit.tasks.environments:Board")])
def test_an_answer_started_as_a_call_of_a_tool_the_environment_lacks_is_refused(prefill, environment):
    with pytest.raises(ValueError, match=f"helper's answer is started as a call of '(post|run_tests)', and "
                                         f"{environment} has no such tool"):
        coder_act(CallsFirst, prefill, environment)


@pytest.mark.parametrize("prefill", ["tool", "board", "discussion"])
def test_a_tool_prefill_needs_an_environment(prefill):
    with pytest.raises(ConfigError, match="prefill: tool, board or discussion only with an environment"):
        load_config("tiny_cpu", overrides=["task=code", f"task_args={{dataset: coop, prefill: {prefill}}}"])


@pytest.mark.parametrize("calls", [1, 3])
def test_prefill_discussion_needs_two_calls(calls):
    board = ["task=code", "task_args={dataset: coop, prefill: discussion}", "environment=kit.tasks.environments:Board"]
    with pytest.raises(ConfigError, match="max_tool_calls.*2 with prefill: discussion"):
        load_config("tiny_cpu", overrides=[*board, f"max_tool_calls={calls}"])
    assert load_config("tiny_cpu", overrides=[*board, "max_tool_calls=2"]).max_tool_calls == 2

