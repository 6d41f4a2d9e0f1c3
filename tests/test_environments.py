"""Environments and tools (issue 52): TRL-style environment classes in a child process, tool calls in the joint
rollout, tool-result tokens off the loss, rows as a task; a scripted engine plays fixed tool calls on the tiny model.

Run: python -m pytest tests/test_environments.py
"""

import json
import re
import time
from pathlib import Path

import pytest
import torch

from kit.engine import tools
from kit.engine.rollout import SamplingParams
from kit.run.config import ConfigError, load_config
from kit.sandbox.envhost import EnvHost, EnvironmentClassError
from kit.tasks import TaskArgError
from kit.tasks.code import READ_START
from kit.tasks.environments import KeyHalves, key_rows, visible_examples

QUIET = dict(log=lambda *_: None)
HERE = Path(__file__).parent


# --- parsing and the host ---------------------------------------------------------------------------------------

def test_tool_calls_are_parsed_from_the_text():
    text = ('I will look. <tool_call>\n{"name": "read_left", "arguments": {}}\n</tool_call>'
            '<tool_call>{"name": "submit_left", "arguments": "{\\"digits\\": \\"123\\"}"}</tool_call>')
    assert tools.parse_calls(text) == [{"name": "read_left", "arguments": {}},
                                       {"name": "submit_left", "arguments": {"digits": "123"}}]
    assert "not valid JSON" in tools.parse_calls("<tool_call>{oops</tool_call>")[0]["error"]
    assert tools.parse_calls("no calls here") == []
    # code written as it reads: a literal newline inside a JSON string is read, in a call of several arguments too
    draft = '<tool_call>\n{"name": "post", "arguments": {"text": "def f():\n    return 1", "tag": "helper"}}\n</tool_call>'
    assert tools.parse_calls(draft) == [{"name": "post", "arguments": {"text": "def f():\n    return 1",
                                                                       "tag": "helper"}}]


@pytest.fixture(scope="module")
def recorder():
    host = EnvHost("scripted_envs:Recorder", timeout_s=2.0)
    yield host
    host.close()


def test_reset_gets_the_row_and_tools_answer_in_the_child(recorder):
    import os

    assert sorted(recorder.tools) == ["boom", "echo", "slow"] and recorder.has_reward
    assert recorder.tools["boom"]["function"]["parameters"]["properties"]["why"]["type"] == "string"
    assert recorder.reset([{"id": "a", "x": 1}, {"id": "b", "x": 2}]) == ["row a is ready", "row b is ready"]
    assert json.loads(recorder.call(1, "echo", {})) == {"id": "b", "x": 2}
    assert recorder.rewards([0, 1]) == [0.0, 1.0]
    assert recorder._proc.pid != os.getpid()  # never in this process


def test_a_tool_error_is_a_message_and_a_slow_tool_is_cut_and_the_world_comes_back(recorder):
    recorder.reset([{"id": "a"}])
    assert json.loads(recorder.call(0, "boom", {"why": "bad input"})) == {"error": "ValueError: bad input"}
    assert "unknown tool" in json.loads(recorder.call(0, "nope", {}))["error"]
    assert "timed out after 2s" in json.loads(recorder.call(0, "slow", {"seconds": 30}))["error"]
    assert json.loads(recorder.call(0, "echo", {})) == {"id": "a"}  # restarted and reset with its row


def test_a_class_that_cannot_be_used_is_refused_clearly():
    with pytest.raises(EnvironmentClassError, match="module.path:ClassName"):
        EnvHost("no_colon_here")
    with pytest.raises(EnvironmentClassError, match="cannot be imported"):
        EnvHost("scripted_envs:Missing", start_timeout_s=60)


def test_the_class_is_built_with_the_configs_arguments_in_every_world(monkeypatch):
    host = EnvHost("scripted_envs:Sized", timeout_s=5, args={"size": 5, "label": "big", "deck": [1, 2, 3],
                                                            "blob": "x" * 300_000})  # past a command line's limit
    try:
        host.reset([{"id": "a"}, {"id": "b"}])
        assert [json.loads(host.call(w, "size", {})) for w in (0, 1)] == [{"blob": 300_000, "label": "big",
                                                                           "size": 5}] * 2
        assert [host.call(w, "draw", {}) for w in (0, 1)] == ["3", "3"]  # each world its own deck, not one list
    finally:
        host.close()
    with pytest.raises(EnvironmentClassError, match="with arguments .*colour.*unexpected keyword"):
        EnvHost("scripted_envs:Sized", args={"colour": "red"}, start_timeout_s=60)
    with pytest.raises(EnvironmentClassError, match="must be a mapping of names to JSON values"):
        EnvHost("scripted_envs:Sized", args={"size": object()})
    with pytest.raises(ConfigError, match="environment_args"):  # refused before any model loads
        load_config("tiny_cpu", overrides=["environment=scripted_envs:Sized", "environment_args={size: .nan}"])
    seen = {}  # the run's config reaches the host: environment_args are the constructor's arguments

    class Host:
        def __init__(self, spec, timeout_s, args):
            seen.update(spec=spec, args=args)
            self.tools, self.by_role, self.has_reward, self.has_agent_rewards = {}, {}, False, False

    monkeypatch.setattr("kit.sandbox.envhost.EnvHost", Host)
    cfg = load_config("tiny_cpu", overrides=["environment=scripted_envs:Sized", "environment_args={size: 3}"])
    tools.sampler_for(type("Team", (), {"roles": ["a", "b"]})(), cfg, log=lambda *_: None)
    assert seen == {"spec": "scripted_envs:Sized", "args": {"size": 3}}


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


# --- the joint rollout with a scripted engine ---------------------------------------------------------------------

class Scripted:
    """An engine that plays the key game: read its half, submit the digits it read, then answer. A subclass scripts
    another player by its `answer(context, adapter)`: the text a row writes next, given all it has read."""

    name, compile_seconds, logp = "scripted", 0.0, -0.25

    def __init__(self, tok, eos):
        self.tok, self.eos = tok, eos

    def sync(self):
        pass

    def answer(self, context: str, adapter: str) -> str:
        side = "left" if adapter == "agent_0" else "right"
        answers = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S)
        if not answers:
            return f'<tool_call>{{"name": "read_{side}", "arguments": {{}}}}</tool_call>'
        if len(answers) == 1:
            return f'<tool_call>{{"name": "submit_{side}", "arguments": {{"digits": "{answers[0]}"}}}}</tool_call>'
        return "done"

    def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
        rows = [self.tok(self.answer(self.tok.decode(ids[mask.bool()].tolist()), adapter),
                         add_special_tokens=False).input_ids + [self.eos]
                for ids, mask, adapter in zip(input_ids, attention_mask, adapters)]
        width = max(map(len, rows))
        comp = torch.tensor([r + [self.tok.pad_token_id] * (width - len(r)) for r in rows])
        return comp, torch.full(comp.shape, self.logp)


@pytest.fixture(scope="module")
def team():
    from kit.engine.models import build_team

    team = build_team(load_config("tiny_cpu"), **QUIET)
    team.engines[0] = Scripted(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    team.roles = ["left", "right"]
    return team


@pytest.fixture(scope="module")
def keys():
    host = EnvHost("kit.tasks.environments:KeyHalves", timeout_s=10)
    yield host
    host.close()


def play(team, host, worlds, G=2, max_calls=4):
    requests = [(a, f"Item {w['id']}: hand in the key.") for w in worlds for a in range(2)]
    params = SamplingParams(max_new_tokens=200, temperature=1.0)
    keys_ = [("t", i, a) for i in range(len(worlds)) for a in range(2)]
    return tools.act(team, requests, G, params, worlds=worlds, host=host, roles=team.roles,
                     max_tool_calls=max_calls, keys=keys_, seed=0), requests


def test_a_call_with_wrong_arguments_says_what_the_tool_takes(keys):
    keys.reset([{"key": "123456"}])
    wrong = json.loads(keys.call(0, "read_left", {"digits": "999"}))["error"]
    assert "unexpected keyword argument 'digits'" in wrong and 'read_left takes no arguments' in wrong
    missing = json.loads(keys.call(0, "submit_left", {}))["error"]
    assert "missing a required argument: 'digits'" in missing and "submit_left takes digits" in missing
    assert keys.call(0, "read_left", {}) == "123"  # the refused calls changed nothing; a right one runs
    assert keys.call(0, "submit_left", {"digits": "123"}) == "submitted"


def test_the_team_plays_the_key_game_through_its_tools(team, keys):
    worlds = [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}]
    ro, _ = play(team, keys, worlds)
    assert ro.world_rewards == [[1.0, 1.0], [1.0, 1.0]]
    assert ro.reset_texts[1][0].startswith("The key has six digits.")  # what reset added, per world
    assert ro.texts[0][0] == "done" and ro.tool_calls == 2 * 2 * 2 * 2
    assert "<tool_response>\n123\n</tool_response>" in ro.transcripts[0][1]
    assert "<tool_response>\n654\n</tool_response>" in ro.transcripts[3][0]  # world k1, the right agent
    assert tools.NO_CALLS_LEFT not in ro.transcripts[0][0]  # 2 of its 4 calls made: nothing said


def test_on_several_environment_processes_the_team_plays_as_on_one(team, keys):
    from kit.sandbox.envpool import EnvPool

    worlds = [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}, {"id": "k2", "key": "555111"}]
    one, _ = play(team, keys, worlds)
    pool = EnvPool("kit.tasks.environments:KeyHalves", workers=2, timeout_s=10)
    try:
        two, _ = play(team, pool, worlds)
    finally:
        pool.close()
    assert two.transcripts == one.transcripts and two.world_rewards == one.world_rewards == [[1.0] * 2] * 3
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.completion_mask, b.completion_mask)
               for a, b in zip(two.segments, one.segments)) and two.tool_calls == one.tool_calls


def test_the_ids_are_extended_without_retokenizing_and_tool_tokens_are_off_the_mask(team, keys):
    tok = team.tokenizers[0]
    ro, requests = play(team, keys, [{"id": "k0", "key": "123456"}], G=1)
    seg = ro.segments[0]
    row = int((seg.sample == 0).nonzero()[0])  # the left agent
    eos = tok.eos_token_id
    # a round stops at its call's </tool_call> (the EOS the script wrote after it is dropped), so the template's
    # end of the assistant turn opens the tool turn
    gen = [tok(t, add_special_tokens=False).input_ids for t in (
        '<tool_call>{"name": "read_left", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "submit_left", "arguments": {"digits": "123"}}</tool_call>')]
    gen.append(tok("done", add_special_tokens=False).input_ids + [eos])
    turns = [tok(tools.tool_turn_text(tok, [r], "", native=False), add_special_tokens=False).input_ids
             for r in ("123", "submitted")]
    expected = gen[0] + turns[0] + gen[1] + turns[1] + gen[2]
    mask = [1] * len(gen[0]) + [0] * len(turns[0]) + [1] * len(gen[1]) + [0] * len(turns[1]) + [1] * len(gen[2])
    comp = seg.input_ids[row, seg.prompt_len:]
    assert comp[: len(expected)].tolist() == expected
    assert seg.completion_mask[row, : len(mask)].tolist() == mask and seg.completion_mask[row, len(mask):].sum() == 0
    assert seg.attention_mask[row, seg.prompt_len: seg.prompt_len + len(expected)].all()
    lp = seg.sampler_logprobs[row, : len(mask)]
    assert (lp[torch.tensor(mask) == 0] == 0).all() and (lp[torch.tensor(mask) == 1] == -0.25).all()
    assert ro.num_tokens == int(seg.completion_mask.sum())


def test_tool_result_tokens_get_no_gradient(team, keys):
    from kit.engine.forward import completion_logprobs
    from kit.maths import losses

    ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=1)
    seg = ro.segments[0]
    model = team.models[0]
    logp = completion_logprobs(model, seg, 1.0)
    logp.retain_grad()
    loss, _ = losses.policy_loss(logp, seg.completion_mask.float(), torch.tensor([1.0, -1.0]), "sum")
    loss.backward()
    off = seg.completion_mask == 0
    assert logp.grad[off].abs().max() == 0 and logp.grad[~off].abs().max() > 0


def test_a_role_cannot_use_another_roles_tools(team, keys):
    class Greedy(Scripted):  # the right agent tries the left agent's reader
        def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
            out = super().generate(input_ids, attention_mask, ["agent_0"] * len(adapters), generation_config)
            return out

    saved = team.engines[0]
    team.engines[0] = Greedy(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=1)
    finally:
        team.engines[0] = saved
    assert "is not one of right's tools" in ro.transcripts[1][0]
    assert "<tool_response>\n123\n</tool_response>" in ro.transcripts[0][0]  # each answer on its own call: the
    assert "is not one of" not in ro.transcripts[0][0]  # left agent's read ran, the refusal is the right agent's


# --- rows as a task, and a training run with an environment --------------------------------------------------------

def test_rows_are_a_task_and_bad_rows_are_named(tmp_path):
    from kit.tasks import DataError, get_task

    path = key_rows(tmp_path / "rows.jsonl", 5)
    task = get_task("rows", 2, file=str(path), num_eval=2, roles=["left", "right"])
    train, held = task.load("train"), task.load("eval")
    assert len(train) == 3 and len(held) == 2 and train[0]["reset_row"]["key"] == train[0]["key"]
    assert task.prompts(train[0])[1].startswith("You are the right, one of a team of 2 agents: left, right.")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    first = get_task("rows", 2, file=str(chat), num_eval=0).prompts(get_task("rows", 2, file=str(chat),
                                                                               num_eval=0).load("train")[0])[0]
    assert first.messages[0]["role"] == "system" and first.messages[1] == {"role": "user", "content": "hi"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    with pytest.raises(DataError, match="line 2, field 'prompt'"):
        get_task("rows", 2, file=str(bad)).load("train")


def test_the_config_refuses_what_an_environment_cannot_do():
    with pytest.raises(ConfigError, match="environment"):
        load_config("tiny_cpu", overrides=["environment=nocolon"])
    with pytest.raises(ConfigError, match="joint_mode"):
        load_config("tiny_cpu", overrides=["environment=a.b:C", "joint_mode=cross"])
    with pytest.raises(ConfigError, match="environment_args"):
        load_config("tiny_cpu", overrides=["environment_args={size: 3}"])  # arguments for no environment


def key_cfg(tmp_path, run_dir, *overrides):
    rows = key_rows(tmp_path / "rows.jsonl", 12)
    return load_config("tiny_cpu", overrides=[
        f"run_dir={run_dir}", "progress=false", "task=rows", f"task_args={{file: {rows}, num_eval: 2, "
        "roles: [left, right]}", "environment=kit.tasks.environments:KeyHalves", "max_tool_calls=2",
        "max_new_tokens=24", "num_steps=4", "save_every=2", "batch_size=2", "num_generations=2", "eval_every=0",
        *overrides])


def test_a_run_with_an_environment_trains_logs_tool_time_and_resumes_exactly(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    def perfless(rows):
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    done = Trainer(key_cfg(tmp_path, tmp_path / "ref"), **QUIET)
    done.train()
    done.close()
    stopped = Trainer(key_cfg(tmp_path, tmp_path / "run"), **QUIET)
    stopped.train(max_steps=2)
    stopped.close()
    again = Trainer(key_cfg(tmp_path, tmp_path / "run"), resume=True, **QUIET)
    again.train()
    again.close()
    ref = rundir.read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert perfless(rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")) == perfless(ref)
    assert all("perf/tool_s" in r and "reward/environment" in r for r in ref)
    logged = rundir.read_jsonl(tmp_path / "ref" / "rollouts.jsonl")
    assert logged and all(len(r["transcripts"]) == 2 for r in logged)
    assert all(r["reset"].startswith("The key has six digits.") for r in logged)  # what reset added to prompts


def test_each_joint_action_gets_its_own_worlds_reward():
    import types

    from kit.trainers.trainer import Trainer

    ro = types.SimpleNamespace(world_rewards=[[0.1, 0.7], [0.4, 0.2]])
    rewards = Trainer.score(types.SimpleNamespace(), ro, [None] * 4, [(0, 0), (1, 1)])
    assert [r.total for r in rewards] == [0.1, 0.7, 0.4, 0.2]
    assert rewards[1].parts == {"environment": 0.7}


def test_each_agents_own_share_of_its_world_is_a_local_part():
    import types

    from kit.trainers.trainer import Trainer

    ro = types.SimpleNamespace(world_rewards=[[0.5, 0.7], [0.4, 0.2]],
                               agent_rewards=[[[1.0, 0.0], [0.9, 0.5]], [[0.3, 0.5], [0.0, 0.4]]])
    rewards = Trainer.score(types.SimpleNamespace(), ro, [None] * 4, [(0, 0), (1, 1)])
    assert [r.total for r in rewards] == [0.5, 0.7, 0.4, 0.2]
    assert rewards[1].parts == {"environment": 0.7, "local_0": 0.9, "local_1": 0.5}  # world 0's sample 1
    assert rewards[2].parts == {"environment": 0.4, "local_0": 0.3, "local_1": 0.5}  # world 1's sample 0


def test_agent_rewards_come_from_the_child_and_bad_ones_are_named():
    host = EnvHost("scripted_envs:Shares", timeout_s=5)
    try:
        assert host.has_agent_rewards and "get_agent_rewards" not in host.tools
        host.reset([{"id": "a"}, {"id": "b"}])
        host.call(1, "set_shares", {"shares": "[0.5, 1]"})
        assert host.agent_rewards([0, 1], ["x", "y"]) == [[0.25, 0.75], [0.5, 1.0]]  # a list: the team's order
        host.call(1, "set_shares", {"shares": '{"y": 0.5, "x": 1}'})
        assert host.agent_rewards([1], ["x", "y"]) == [[1.0, 0.5]]  # a dict: by role, whatever its order
        assert host.agent_rewards([1], ["y", "x"]) == [[0.5, 1.0]]
        with pytest.raises(EnvironmentClassError, match=r"world 1: .*no share for role\(s\) \['z'\]"):
            host.agent_rewards([1], ["x", "z"])
        with pytest.raises(EnvironmentClassError, match=r"world 0: .*a list of 3 numbers"):
            host.agent_rewards([0], ["x", "y", "z"])
        host.call(0, "set_shares", {"shares": "[0.5, NaN]"})
        with pytest.raises(EnvironmentClassError, match="finite"):
            host.agent_rewards([0], ["x", "y"])
    finally:
        host.close()
    plain = EnvHost("scripted_envs:Recorder", timeout_s=5)
    plain.close()
    assert not plain.has_agent_rewards


@pytest.mark.parametrize("task", ["rows", "toy"])
def test_a_local_reward_weight_needs_the_environments_own_shares(tmp_path, task):
    """An environment that owns the reward must give the shares too, whether or not the task has a reward of its
    own (get_reward replaces it)."""
    from kit.trainers.trainer import Trainer

    rows = key_rows(tmp_path / "rows.jsonl", 6)
    args = [f"task_args={{file: {rows}, num_eval: 2}}"] if task == "rows" else []
    with pytest.raises(ValueError, match="gives no share per agent: give the class a get_agent_rewards"):
        Trainer(load_config("tiny_cpu", overrides=[
            f"run_dir={tmp_path / 'r'}", f"task={task}", *args, "environment=scripted_envs:Recorder",
            "local_reward_weight=0.5"]), **QUIET)


class Skipper(Scripted):
    """Reads its half, then submits it or not as its row's seed says: the shares differ by world, sample and agent."""

    def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
        comp, logp = super().generate(input_ids, attention_mask, adapters, generation_config)
        for i, (ids, mask) in enumerate(zip(input_ids, attention_mask)):
            context = self.tok.decode(ids[mask.bool()].tolist())
            read = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S)
            if len(read) == 1 and int(row_seeds[i]) % 2:  # it has read its half; it skips the submission
                done = self.tok("done", add_special_tokens=False).input_ids + [self.eos]
                comp[i] = torch.tensor(done + [self.tok.pad_token_id] * (comp.shape[1] - len(done)))
        return comp, logp


def test_each_worlds_shares_reach_each_agents_return(team, keys, tmp_path):
    """act -> score -> returns with local_reward_weight w: agent i's return is (1 - w) get_reward() + w share_i of
    its own world and sample, the shares read from what each row did (a submission in its transcript)."""
    from kit.trainers.trainer import Trainer

    saved = team.engines[0]
    team.engines[0] = Skipper(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}], G=2)
        assert ro.agent_rewards is None  # not asked for: local_reward_weight is 0
        trainer = Trainer(key_cfg(tmp_path, tmp_path / "run", "local_reward_weight=0.25", "batch_size=2",
                                  "max_new_tokens=200", "max_tool_calls=4"), team=team, **QUIET)
        levels = trainer.sample(trainer.batch_items(0))
        trainer.close()
    finally:
        team.engines[0] = saved
    level, N, G = levels[0], 2, 2
    own = level.rollout.agent_rewards
    shares = [[[0.5 + 0.5 * ("<tool_response>\nsubmitted\n" in level.rollout.transcripts[n * N + a][g])
                for a in range(N)] for g in range(G)] for n in range(len(level.nodes))]
    assert own == shares and len({s for node in shares for per in node for s in per}) == 2  # both kinds happen
    for n in range(len(level.nodes)):
        for j, idx in enumerate(level.joints):
            team_reward = level.rewards[n][j].total
            assert team_reward == pytest.approx(sum(shares[n][idx[0]]) / N)
            assert level.per_agent[n, :, idx[0]] == pytest.approx(
                [0.75 * team_reward + 0.25 * shares[n][idx[0]][a] for a in range(N)])


def test_01s_parameters_take_an_environment_and_rows(tmp_path):
    from kit import colab

    rows = key_rows(tmp_path / "rows.jsonl", 6)
    cfg = colab.notebook_config("tiny_cpu", "rows", {"file": str(rows), "roles": ["left", "right"]}, "keys",
                                environment="kit.tasks.environments:KeyHalves", **QUIET)
    assert cfg.environment == "kit.tasks.environments:KeyHalves" and cfg.task == "rows"


def test_an_agents_rows_keep_every_generated_token_after_its_tool_turns(team, keys):
    ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=2)
    seg = ro.segments[0]
    for agent in (0, 1):
        sub = seg.rows([agent])
        mine = seg.agent == agent
        assert int(sub.completion_mask.sum()) == int(seg.completion_mask[mine].sum())
        assert int(sub.attention_mask.sum()) == int(seg.attention_mask[mine].sum())


def test_a_json_object_naming_a_known_tool_is_a_call_without_tags():
    text = 'Sure:\n```json\n{"name": "read_left", "arguments": {}}\n```\n{"name": "other", "arguments": {}} {"x": 1}'
    assert tools.parse_calls(text, ["read_left", "submit_left"]) == [{"name": "read_left", "arguments": {}}]
    assert tools.parse_calls(text) == []  # without the known tools: only <tool_call> blocks count


def test_a_call_of_one_string_argument_that_is_not_valid_json_is_read_as_meant():
    # how the 0.5B coder writes a draft into a call: a docstring's quotes unescaped, a \' escape JSON lacks, a
    # newline as written or as \n, the last brace missing
    draft = 'def f(x):\n    """Doc."""\n    return x == \'a\' + "\\\\n"'
    written = draft.replace("'", "\\'").replace("\\\\", "\\\\\\\\")
    assert tools.parse_calls('<tool_call>\n{"name": "run_tests", "arguments": {"code": "' + written + '"}}\n</tool_call>') \
        == [{"name": "run_tests", "arguments": {"code": draft}}]
    assert tools.parse_calls('<tool_call>{"name": "run_tests", "arguments": {"code": "def f():\\n    return 1"}') \
        == [{"name": "run_tests", "arguments": {"code": "def f():\n    return 1"}}]
    bare = '```json\n{"name": "run_tests", "arguments": {"code": "s = """a""""}}\n```'
    assert tools.parse_calls(bare, ["run_tests"]) == [{"name": "run_tests", "arguments": {"code": 's = """a"""'}}]
    assert tools.parse_calls(bare, ["read_left"]) == []  # bare: only a known tool's
    two = '<tool_call>{"name": "f", "arguments": {"a": "x", "b": "y"</tool_call>'  # not one string argument
    assert "not valid JSON" in tools.parse_calls(two)[0]["error"]


def test_a_started_call_left_open_is_read_to_the_end_of_the_text():
    """The 0.5B coder, its run_tests call started with a newline in the string, writes its draft as a code block and
    ends its turn without closing the string or the call: the draft is the text to its end, less the fence."""
    head = '<tool_call>\n{"name": "run_tests", "arguments": {"code": "\ndef aux(xs):\n'
    body = '    """Doc."""\n    return sorted(xs)\n'
    assert tools.parse_calls(head + body + "```") == [{"name": "run_tests", "arguments": {
        "code": '\ndef aux(xs):\n    """Doc."""\n    return sorted(xs)'}}]
    assert tools.parse_calls(head + body)[0]["arguments"]["code"].endswith("return sorted(xs)")
    # closed by </tool_call>, a string that never ends is still an error; so is an open call of several arguments
    assert "error" in tools.parse_calls(head + body + "</tool_call>")[0]
    assert "error" in tools.parse_calls('<tool_call>{"name": "f", "arguments": {"a": "x", "b": "y')[0]
    # code written as it reads is taken as written: its own escapes stay, a dict literal is not a next argument
    code = '    d = {"a": "x", "b": "y"}\n    return \'\\n\'.join(xs)'
    assert tools.parse_calls(head + code + "\n```")[0]["arguments"]["code"].endswith(code)
    # a complete call followed by prose (no </tool_call>): the call
    assert tools.parse_calls('<tool_call>{"name": "f", "arguments": {"a": "x"}} hope that works') == \
        [{"name": "f", "arguments": {"a": "x"}}]


def test_an_open_call_over_a_long_run_of_blank_lines_is_read_in_linear_time():
    """A degenerate draft (thousands of blank lines before its fence) must not stall the trainer's process: a regex
    with two optional blank runs around an optional fence backtracks cubically (20k lines: hours)."""
    started = time.perf_counter()
    call = tools.parse_calls('<tool_call>{"name": "run_tests", "arguments": {"code": "x' + "\n" * 20000 + "```")
    assert call == [{"name": "run_tests", "arguments": {"code": "x"}}]
    assert time.perf_counter() - started < 5


def test_a_tool_that_prints_and_reads_stdin_cannot_touch_the_protocol():
    host = EnvHost("scripted_envs:Noisy", timeout_s=5)
    try:
        assert host.reset([{"id": "a"}]) == [None]
        assert host.call(0, "chatty", {}) == "stdin='' ok"
        assert host.call(0, "chatty", {}) == "stdin='' ok"
    finally:
        host.close()


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


def test_a_built_in_task_runs_with_an_environment(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={tmp_path / 'run'}", "progress=false", "task=code", "task_args={dataset: coop}",
        "environment=kit.tasks.environments:CodeTests", "max_new_tokens=16", "num_steps=1", "batch_size=1",
        "num_generations=2", "eval_every=1", "num_eval_items=1", "save_every=0"])
    trainer = Trainer(cfg, **QUIET)
    trainer.train()
    trainer.close()
    rows = rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert "eval/reward_mean" in rows[-1] and "reward/structure" in rows[-1]  # the task's level reward
    assert all("transcripts" in r for r in rundir.read_jsonl(tmp_path / "run" / "rollouts.jsonl"))


def test_kit_eval_and_the_baselines_of_a_run_with_an_environment_act_as_in_training(tmp_path):
    from kit.analysis import baselines
    from kit.analysis.evaluate import evaluate_run
    from kit.trainers.trainer import Trainer

    cfg = key_cfg(tmp_path, tmp_path / "run", "num_steps=2")
    trainer = Trainer(cfg, **QUIET)
    trainer.train()
    trainer.close()
    rows = evaluate_run(tmp_path / "run", "newest", n=2, **QUIET)
    assert "reward/environment" in rows[0]
    said = []
    table = baselines.compare(tmp_path / "run", None, n=2, log=said.append)  # every method asked for
    assert [r["method"] for r in table] == ["naive", "magrpo"] and all("reward/environment" in r for r in table)
    assert any("skipped" in s and "get_reward" in s for s in said), said


def test_the_browser_shows_each_agents_tool_calls_and_results():
    from kit.analysis.explore import render_joint

    row = {"item": "k0", "step": 1, "prompts": ["p0", "p1"], "completions": ["done", "done"], "reward": 1.0,
           "parts": {"environment": 1.0},
           "transcripts": ['<tool_call>{"name": "read_left"}</tool_call><tool_response>\n123\n</tool_response>done',
                           "done"], "reset": "The key has <six> digits."}
    page = render_joint(row, ["left", "right"])
    assert "left's tool calls and results" in page and "&lt;tool_response&gt;" in page and "123" in page
    assert "reset added to each prompt</b>: The key has &lt;six&gt; digits." in page


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


@pytest.mark.parametrize("workers", [1, 2])
def test_an_environment_with_a_caller_attribute_is_told_whose_call_runs(workers):
    """The kit's `caller`: set to the calling role before each call, on one process or a pool; the Board labels
    posts with it and marks the reader's own; a class without the attribute never gets one."""
    from kit.sandbox.envpool import EnvPool

    host = EnvHost("kit.tasks.environments:Board", timeout_s=10) if workers == 1 else \
        EnvPool("kit.tasks.environments:Board", workers, timeout_s=10)
    try:
        host.reset([{"id": "a"}, {"id": "b"}])
        host.call_many([(0, "post", {"text": "h"}, "helper"), (1, "post", {"text": "x"}, "main"),
                        (0, "post", {"text": "m"}, "main")])
        assert host.call(0, "read", {}, "main") == "[helper]\nh\n\n[main (you)]\nm"
        assert host.call(0, "read", {}, "helper") == "[helper (you)]\nh\n\n[main]\nm"
        assert host.call(1, "read", {}, "helper") == "[main]\nx"  # each world its own board
        assert "unexpected keyword argument 'author'" in host.call(0, "post", {"text": "t", "author": "me"}, "main")
    finally:
        host.close()
    plain = EnvHost("kit.tasks.environments:Board", timeout_s=10)  # no caller given: posts in order
    try:
        plain.reset([{"id": "a"}])
        plain.call(0, "post", {"text": "h"})
        assert plain.call(0, "read", {}) == "[agent 1]\nh"
    finally:
        plain.close()
    recorder = EnvHost("scripted_envs:Recorder", timeout_s=2.0)  # a TRL class has no caller: none is set on it
    try:
        recorder.reset([{"id": "a", "x": 1}])
        assert json.loads(recorder.call(0, "echo", {}, "helper")) == {"id": "a", "x": 1}
        with pytest.raises(AttributeError):
            recorder.view(0).caller
    finally:
        recorder.close()


def test_a_forked_answer_is_dropped_and_a_reset_that_kills_the_child_is_an_error_not_a_loop():
    host = EnvHost("scripted_envs:Hostile", timeout_s=3)
    try:
        host.reset([{"id": "a"}])
        assert host.call(0, "fork_and_answer", {}) == "parent"
        assert host.call(0, "ping", {}) == "pong"  # not the forked copy's stale answer
        with pytest.raises(EnvironmentClassError, match="reset"):
            host.reset([{"id": "a"}, {"id": "die"}])
        assert host.restarts <= 2
    finally:
        host.close()


def test_degenerate_calls_and_odd_results_never_crash_the_rollout():
    assert "error" in tools.parse_calls("<tool_call>" + "[" * 5000 + "</tool_call>")[0]
    assert tools.parse_calls("{" * 3000, ["read_left"]) == []
    from kit.sandbox.envhost import as_text

    assert as_text("file\udcff.txt").encode("utf-8")  # a stray byte in a file name: encodable


def test_the_reward_reads_the_answer_start_only_on_a_first_round_answer(team, keys):
    from kit.engine.prompts import Prompt

    worlds = [{"id": "k0", "key": "123456"}]
    requests = [(a, Prompt("hand in the key", "I say: ")) for a in range(2)]
    ro = tools.act(team, requests, 1, SamplingParams(max_new_tokens=200), worlds=worlds, host=keys,
                   roles=team.roles, max_tool_calls=4, keys=[("t", a) for a in range(2)])
    assert ro.texts[0][0] == "done"  # the last round's answer: the prompt's start was before the first round
    assert ro.transcripts[0][0].startswith("I say: <tool_call>")


class CallsFirst(Scripted):
    """An engine that goes on from the code task's `prefill: tool` start (a ```python block in the JSON string): the
    rest of a run_tests call on its draft (newlines written as they read), then after the results its final answer.
    The helper leaves its call open, as the 0.5B coder does (its block closed, then the end of its turn); main closes
    its string and call."""

    DRAFTS = {"agent_0": ("xs):\n    s = sorted(xs)\n    return min(b - a for a, b in zip(s, s[1:]))",
                          "def aux(xs):\n    s = sorted(xs)\n    return min(b - a for a, b in zip(s, s[1:]))"),
              "agent_1": ("numbers, threshold):\n    return aux(numbers) < threshold",
                          "def has_close_elements(numbers, threshold):\n    return aux(numbers) < threshold")}

    def answer(self, context, adapter):
        rest, final = self.DRAFTS[adapter]
        tested = rest in context  # its call is in its context
        if tested:
            return f"```python\n{final}\n```"
        return rest + "\n```" if adapter == "agent_0" else rest + '\n```"}}\n</tool_call>'


def coder_act(engine, prefill: str, environment: str, args: dict | None = None, max_tool_calls: int = 1,
              max_new_tokens: int = 400, **task_args):
    """One joint rollout of a helper and main scripted by `engine` on HumanEval's first held-out problem
    (has_close_elements: 2 docstring examples), started as `prefill` asks, one call each unless `max_tool_calls`:
    (task, item, prompts, rollout, tokenizer)."""
    from kit.engine.models import build_team
    from kit.tasks.code import CodeTask

    team = build_team(load_config("tiny_cpu"), **QUIET)
    team.engines[0] = engine(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    team.roles = ["helper", "main"]
    task = CodeTask(dataset="humaneval", prefill=prefill, **task_args)
    item = task.load("eval")[0]
    prompts = task.prompts(item)
    host = EnvHost(environment, timeout_s=30, args=args)
    try:
        ro = tools.act(team, [(a, prompts[a]) for a in range(2)], 1, SamplingParams(max_new_tokens=max_new_tokens), worlds=[item],
                       host=host, roles=team.roles, max_tool_calls=max_tool_calls, keys=[("t", a) for a in range(2)])
    finally:
        host.close()
    return task, item, prompts, ro, team.tokenizers[0]


def test_prefill_tool_starts_each_answer_as_a_test_call_and_main_tests_with_the_helpers_aux():
    task, item, prompts, ro, _ = coder_act(CallsFirst, "tool", "kit.tasks.environments:CodeTests")
    assert prompts[1].answer_start.endswith('{"code": "```python\ndef has_close_elements(')
    assert ro.tool_calls == 2
    assert ro.transcripts[1][0].count("ok: assert has_close_elements") == 2  # main's draft ran with the helper's aux
    # its one call spent, each agent is told that its next text is its answer
    assert all(f"{tools.NO_CALLS_LEFT}\n</tool_response>" in ro.transcripts[a][0] for a in range(2))
    assert all(ro.texts[a][0].startswith("```python\ndef ") for a in range(2))  # the reward reads the final answers
    assert task.reward(item, (ro.texts[0][0], ro.texts[1][0])).parts["tests"] == pytest.approx(1.0)


class CallsThenFinishes(CallsFirst):
    """CallsFirst, its final answer going on from the start `code_after_tools` puts after the results (`def <name>(`):
    the same rest as its draft's, then the block's end."""

    def answer(self, context, adapter):
        rest, _ = self.DRAFTS[adapter]
        final = context.endswith(("```python\ndef aux(", "```python\ndef has_close_elements(")) and \
            not context.endswith(('"code": "```python\ndef aux(', '"code": "```python\ndef has_close_elements('))
        return rest + "\n```" if final else super().answer(context, adapter)


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


class PostsThenReads(Scripted):
    """An engine that goes on from the code task's `prefill: board` start: the helper the rest of a post of its aux
    draft, main the rest of a read call; after the results, each its final code (main's calls the aux it read)."""

    FINAL = {adapter: final for adapter, (_, final) in CallsFirst.DRAFTS.items()}

    def answer(self, context, adapter):
        if not context.endswith(('"text": "```python\ndef aux(', '"arguments": {')):  # after the results: the answer
            return f"```python\n{self.FINAL[adapter]}\n```"
        if adapter == "agent_0":
            return 'xs):\\n    s = sorted(xs)\\n    return min(b - a for a, b in zip(s, s[1:]))"}}\n</tool_call>'
        return '}}\n</tool_call>'


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


class PostsThenReadsThenAnswers(Scripted):
    """An engine that goes on from the code task's `prefill: discussion` starts: in round 0 each agent the rest of a
    post of its own draft, in round 1 the rest of the read its round is started with; after the read's results, its
    final code."""

    POSTS = {"agent_0": 'xs):\\n    s = sorted(xs)\\n    return min(b - a for a, b in zip(s, s[1:]))"}}\n</tool_call>',
             "agent_1": 'numbers, threshold):\\n    return aux(numbers) < threshold"}}\n</tool_call>'}

    def answer(self, context, adapter):
        if context.endswith(('"text": "```python\ndef aux(', '"text": "```python\ndef has_close_elements(')):
            return self.POSTS[adapter]
        if context.endswith('"arguments": {'):
            return '}}\n</tool_call>'
        return f"```python\n{PostsThenReads.FINAL[adapter]}\n```"


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


class PostsThenRambles(PostsThenReadsThenAnswers):
    """PostsThenReadsThenAnswers, but after the read's start it writes on without closing the call."""

    def answer(self, context, adapter):
        return "x" * 300 if context.endswith('"arguments": {') else super().answer(context, adapter)


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


@pytest.mark.parametrize("where", ["answer", "round"])
def test_an_answer_started_as_a_call_of_another_roles_tool_is_refused(team, keys, where):
    from kit.engine.prompts import Prompt

    call = '<tool_call>{"name": "read_right", "arguments": {}}'  # a start of its first round, or of a later one
    prompt = Prompt("Hand in the key.", call) if where == "answer" else Prompt("Hand in the key.", round_starts=(call,))
    requests = [(0, prompt), (1, "Go.")]
    part = "answer" if where == "answer" else "round 1"
    with pytest.raises(ValueError, match=f"left's {part} is started as a call of 'read_right', and "
                                         "kit.tasks.environments:KeyHalves gives it to another role"):
        tools.act(team, requests, 1, SamplingParams(max_new_tokens=20), worlds=[{"id": "k", "key": "123456"}],
                  host=keys, roles=team.roles, max_tool_calls=1)


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


def test_evaluation_leaves_no_environment_process_behind(tmp_path, monkeypatch):
    from kit.analysis import baselines
    from kit.analysis.evaluate import evaluate_run
    from kit.sandbox import envhost
    from kit.trainers.trainer import Trainer

    trainer = Trainer(key_cfg(tmp_path, tmp_path / "run", "num_steps=1", "save_every=1"), **QUIET)
    trainer.train()
    trainer.close()
    hosts = []
    real = envhost.EnvHost.__init__

    def track(self, *args, **kwargs):
        real(self, *args, **kwargs)
        hosts.append(self)

    monkeypatch.setattr(envhost.EnvHost, "__init__", track)
    evaluate_run(tmp_path / "run", "newest", n=1, num_items=1, **QUIET)
    baselines.compare(tmp_path / "run", ["naive"], n=1, num_items=1, **QUIET)
    assert len(hosts) == 2 and all(h._proc is None for h in hosts)


def test_a_reward_function_reads_the_world_its_joint_action_acted_on(tmp_path):
    import pickle

    from kit.analysis.evaluate import Acted, score
    from kit.tasks.rewards import RewardModel, Scorer

    host = EnvHost("scripted_envs:Ledger", timeout_s=10)
    try:
        host.reset([{"id": "a"}, {"id": "b"}])
        host.call(1, "note", {"text": "hi"})
        world = host.view(1)
        assert world.row == {"id": "b"} and world.notes == ["hi"] and host.view(0).notes == []
        assert world.shout("yes") == "YES"  # any method, not only the tools
        with pytest.raises(AttributeError, match="no attribute 'missing'"):
            world.missing
        with pytest.raises(TypeError, match="reward_pool=thread"):
            pickle.dumps(world)

        def ids(item, completions, environment):
            return float(environment.row["id"] == item["id"]) + len(environment.notes)

        model = RewardModel(None, [ids, lambda item, completions: 0.5], [1.0, 1.0])
        joints = [[Acted(("x", "y"), None, host.view(0))], [Acted(("x", "y"), None, host.view(1))]]
        for workers in (0, 2):  # in the trainer's thread and in reward threads
            got = score(Scorer(model, workers), [{"id": "a"}, {"id": "b"}], joints)
            assert [[r.total for r in per] for per in got] == [[1.5], [2.5]]
        assert pickle.loads(pickle.dumps(joints[0][0])) == ("x", "y")  # an Acted travels without its world
    finally:
        host.close()


def test_training_gives_each_joint_actions_world_to_the_reward_functions(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    seen = []

    def same_world(item, completions, environment):
        seen.append((item["id"], environment.row["id"], environment.number))
        return float(environment.row["id"] == item["id"])

    cfg = key_cfg(tmp_path, tmp_path / "run", "environment=scripted_envs:Ledger", "num_steps=1")
    trainer = Trainer(cfg, reward_funcs=[same_world], **QUIET)
    trainer.train()
    trainer.close()
    assert len(seen) == 2 * 2 and all(a == b for a, b, _ in seen)  # 2 items x G=2 joint actions,
    assert len({world for _, _, world in seen}) == 4  # each its own world
    assert rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]["reward/mean"] == 1.0


class Parallel(Scripted):
    """Writes both of its calls in its first round, one block after the other, then a stray call after some text;
    answers "done" once results came back."""

    def answer(self, context, adapter):
        side, half = ("left", "123") if adapter == "agent_0" else ("right", "456")
        if re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S):
            return "done"
        return (f'<tool_call>{{"name": "read_{side}", "arguments": {{}}}}</tool_call>\n'
                f'<tool_call>{{"name": "submit_{side}", "arguments": {{"digits": "{half}"}}}}</tool_call>'
                f' and then <tool_call>{{"name": "read_{side}", "arguments": {{}}}}</tool_call>')


def test_parallel_calls_in_one_round_all_run_and_answer_in_one_tool_turn(team, keys):
    tok = team.tokenizers[0]
    ids = tok('x<tool_call>{"a": 1}</tool_call> \n<tool_call>{"b": 2}</tool_call> then <tool_call>{}</tool_call>',
              add_special_tokens=False).input_ids
    kept = tok.decode(ids[: tools.call_end(tok, ids)])
    assert kept.endswith('{"b": 2}</tool_call>') and "then" not in kept  # the run of calls, not the stray one
    scripted = team.engines[0]
    team.engines[0] = Parallel(tok, tok.eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=1)
    finally:
        team.engines[0] = scripted
    assert ro.world_rewards == [[1.0]] and ro.tool_calls == 2 * 2  # read and submit, per agent, in one round
    left = ro.transcripts[0][0]
    assert left.count("<tool_response>") == 2 and "and then" not in left
    assert left.index("</tool_response>") < left.index("<tool_response>\nsubmitted")  # both results in one turn
    assert ro.texts[0][0] == "done"


def test_the_baselines_report_how_often_the_agents_called_a_tool(team, keys, tmp_path):
    from kit.analysis.baselines import run_method
    from kit.tasks import get_task

    task = get_task("rows", 2, file=str(key_rows(tmp_path / "rows.jsonl", 4)), num_eval=2, roles=["left", "right"])
    sampler = tools.ToolSampler(team, SamplingParams(max_new_tokens=200, temperature=1.0), keys, team.roles, 4)
    row = run_method("naive", sampler, task, load_config("tiny_cpu"), task.load("eval"), 2, scorer=None)
    assert row["tools/calls_per_completion"] == 2.0  # the scripted agents read their half, then submit it
    assert row["reward/mean"] == 1.0 and sampler.completions == 2 * 2 * 2  # items x agents x samples
