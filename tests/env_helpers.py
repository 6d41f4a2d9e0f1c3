"""What the environment tests share (tests/test_env_*.py): the scripted engines that play fixed tool calls on the
tiny model, the team and hosts as fixtures, and small runners."""

import re
from pathlib import Path

import pytest
import torch

from kit.engine import tools
from kit.engine.rollout import SamplingParams
from kit.run.config import load_config
from kit.sandbox.envhost import EnvHost
from kit.tasks.environments import KeyHalves, key_rows

QUIET = dict(log=lambda *_: None)
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def recorder():
    host = EnvHost("scripted_envs:Recorder", timeout_s=2.0)
    yield host
    host.close()


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


def key_cfg(tmp_path, run_dir, *overrides):
    rows = key_rows(tmp_path / "rows.jsonl", 12)
    return load_config("tiny_cpu", overrides=[
        f"run_dir={run_dir}", "progress=false", "task=rows", f"task_args={{file: {rows}, num_eval: 2, "
        "roles: [left, right]}", "environment=kit.tasks.environments:KeyHalves", "max_tool_calls=2",
        "max_new_tokens=24", "num_steps=4", "save_every=2", "batch_size=2", "num_generations=2", "eval_every=0",
        *overrides])


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


class CallsThenFinishes(CallsFirst):
    """CallsFirst, its final answer going on from the start `code_after_tools` puts after the results (`def <name>(`):
    the same rest as its draft's, then the block's end."""

    def answer(self, context, adapter):
        rest, _ = self.DRAFTS[adapter]
        final = context.endswith(("```python\ndef aux(", "```python\ndef has_close_elements(")) and \
            not context.endswith(('"code": "```python\ndef aux(', '"code": "```python\ndef has_close_elements('))
        return rest + "\n```" if final else super().answer(context, adapter)


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


class PostsThenRambles(PostsThenReadsThenAnswers):
    """PostsThenReadsThenAnswers, but after the read's start it writes on without closing the call."""

    def answer(self, context, adapter):
        return "x" * 300 if context.endswith('"arguments": {') else super().answer(context, adapter)


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

