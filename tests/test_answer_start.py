"""Prompts whose answer is started for the model (`kit.tasks.Prompt`), and the code task's `prefill`.
Run: python -m pytest tests/test_answer_start.py"""

import pickle

import pytest
import torch

from kit.analysis.baselines import discussion_prompt, sequential_prompt
from kit.engine.models import Team, attach_adapters, build_tiny_model, lora_config
from kit.engine.rollout import encode_prompt, format_prompt, generate
from kit.tasks import Prompt, TaskArgError, answer_start
from kit.tasks.code import HELPER_START, make_task


def tiny_team():
    model, tok = build_tiny_model(0)
    return Team([attach_adapters(model, ["agent_0"], lora_config(8, 16, 0.0, "all-linear"))], [tok], [0], ["agent_0"])


def test_a_prompt_is_its_text_everywhere_and_keeps_its_start_through_pickle():
    p = Prompt("write aux", "def aux(")
    assert p == "write aux" and isinstance(p, str) and f"{p}!" == "write aux!"
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is Prompt and q.answer_start == "def aux(" and answer_start(q) == "def aux("
    assert answer_start("plain") == ""
    # both starts, of a Prompt and of a Chat (the rows task's messages), through a process pool
    from kit.engine.prompts import Chat, final_start

    assert final_start(pickle.loads(pickle.dumps(Prompt("t", "<call", "def aux(")))) == "def aux("
    chat = Chat([{"role": "user", "content": "hi"}], "<call", "def aux(")
    back = pickle.loads(pickle.dumps(chat))
    assert type(back) is Chat and back.messages == chat.messages and (answer_start(back), final_start(back)) == \
        ("<call", "def aux(")


def test_the_model_sees_the_start_after_the_assistant_header_and_the_text_has_it_in_front():
    team = tiny_team()
    tok = team.tokenizers[0]
    p = Prompt("sum 7", "12")
    assert tok.decode(encode_prompt(tok, p)) == format_prompt(tok, "sum 7") + "12"
    ro = generate(team, [(0, p), (0, "sum 7")], 2, max_new_tokens=6, temperature=0)
    seg = ro.segments[0]
    assert all(t.startswith("12") for t in ro.texts[0])
    # the update scores only sampled tokens: the start is in the prompt part of the segment
    first = tok.decode(seg.input_ids[0, :seg.prompt_len], skip_special_tokens=False).replace(tok.pad_token, "")
    assert first.endswith(format_prompt(tok, "sum 7") + "12")
    assert ro.texts[0][0] == "12" + tok.decode(seg.input_ids[0, seg.prompt_len:][seg.completion_mask[0].bool()],
                                               skip_special_tokens=True)


def test_a_cut_prompt_keeps_its_start_at_the_end():
    _, tok = build_tiny_model(0)
    p = Prompt("task " + "x" * 200 + " end", "go")
    ids = encode_prompt(tok, p, max_tokens=40)
    assert len(ids) == 40 and tok.decode(ids).endswith(format_prompt(tok, "\x00").split("\x00")[1] + "go")


@pytest.mark.parametrize("prefill, starts", [
    ("none", ["", ""]), ("helper", [HELPER_START, ""]), ("both", [HELPER_START, "```python\ndef {entry}("]),
    ("tool", ['<tool_call>\n{{"name": "run_tests", "arguments": {{"code": "```python\ndef aux(',
              '<tool_call>\n{{"name": "run_tests", "arguments": {{"code": "```python\ndef {entry}(']),
    ("board", ['<tool_call>\n{{"name": "post", "arguments": {{"text": "```python\ndef aux(',
               '<tool_call>\n{{"name": "read", "arguments": {{']),
    ("discussion", ['<tool_call>\n{{"name": "post", "arguments": {{"text": "```python\ndef aux(',
                    '<tool_call>\n{{"name": "post", "arguments": {{"text": "```python\ndef {entry}('])])
def test_the_code_task_starts_the_answers_prefill_names_in_every_turn_and_baseline(prefill, starts):
    task = make_task(dataset="coop", prefill=prefill)
    item = task.load("eval")[0]
    want = [s.format(entry=item["entry_point"]) for s in starts]
    # `discussion` schedules a second round, a read of the board, for both agents (Prompt.round_starts)
    rounds = [('<tool_call>\n{"name": "read", "arguments": {',)] * 2 if prefill == "discussion" else [(), ()]
    reward = task.reward(item, ("def aux(x):\n    return x", "def f(): pass"))
    for prompts in (task.prompts(item), task.feedback(item, ("", ""), reward),
                    [sequential_prompt(task, item, a, ("x",) * a) for a in range(2)],
                    [discussion_prompt(task, item, a, ("x", "y")) for a in range(2)]):
        assert [answer_start(p) for p in prompts] == want
        assert [getattr(p, "round_starts", ()) for p in prompts] == rounds
    assert answer_start(task.single_prompt(item)) == {"none": "", "tool": want[0]}.get(prefill, HELPER_START)


@pytest.mark.parametrize("rounds", ["read", ("read", 1)])
def test_round_starts_are_a_tuple_of_strings(rounds):
    with pytest.raises(TypeError, match="round_starts=.*a tuple of strings"):
        Prompt("task", round_starts=rounds)


def test_a_bad_prefill_names_the_choices():
    with pytest.raises(TaskArgError, match="prefill.*none, helper, both"):
        make_task(dataset="coop", prefill="yes")


def test_a_started_helper_answer_is_scored_whole():
    task = make_task(dataset="coop", prefill="helper")
    item = task.load("eval")[0]
    helper = task.prompts(item)[0].answer_start + "x):\n    return x\n```"
    assert task.reward(item, (helper, "")).parts["structure"] == pytest.approx(0.4)
