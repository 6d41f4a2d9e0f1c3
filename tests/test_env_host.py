"""Environments and tools (issue 52), the parsing and the host: tool calls read from a model's text, and an
environment class in its child process (reset, calls, errors, time limits, seeding, what crosses the pipe).

Run: python -m pytest tests/test_env_host.py
"""

import json
import time

import pytest

from env_helpers import recorder

from kit.engine import tools
from kit.run.config import ConfigError, load_config
from kit.sandbox.envhost import EnvHost, EnvironmentClassError


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


def parse_seconds(text: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):  # the best of a few: what the machine's load adds is not the parser's work
        started = time.perf_counter()
        tools.parse_calls(text)
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("closed", [False, True])
def test_a_call_over_a_long_run_of_blank_lines_is_read_in_linear_time(closed):
    """A degenerate draft (thousands of blank lines before its fence) must not stall the trainer's process. Measured
    by the work, not a clock bound: twice the blank lines take about twice the time (a quadratic reader: 4x; review
    7 found 4.5 s at 20,000 lines and 16.8 s at 40,000), held to under 3x."""
    def text(n):
        return ('<tool_call>{"name": "run_tests", "arguments": {"code": "x' + "\n" * n + "```"
                + ("</tool_call>" if closed else ""))

    assert tools.parse_calls(text(10)) == [{"name": "run_tests", "arguments": {"code": "x"}}] or closed
    small, large = parse_seconds(text(40_000)), parse_seconds(text(80_000))
    assert large < 3 * small + 0.05, (small, large)


def test_a_tool_that_prints_and_reads_stdin_cannot_touch_the_protocol():
    host = EnvHost("scripted_envs:Noisy", timeout_s=5)
    try:
        assert host.reset([{"id": "a"}]) == [None]
        assert host.call(0, "chatty", {}) == "stdin='' ok"
        assert host.call(0, "chatty", {}) == "stdin='' ok"
    finally:
        host.close()


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



# --- review 7: what crosses the pipe, seeded worlds, errors said as they are ---------------------------------------

def test_a_call_nested_past_the_stack_is_that_calls_error_and_only_that_worlds(recorder):
    """A call nested just under Python's recursion limit (parse_calls reads it) must become the call's error: no
    RecursionError in the trainer, no child killed, every world as it was."""
    import sys

    recorder.reset([{"id": "a"}, {"id": "b"}])
    restarts = recorder.restarts
    deep: list = []
    for _ in range(sys.getrecursionlimit() - 50):
        deep = [deep]
    said = json.loads(recorder.call(0, "boom", {"why": deep}))["error"]
    assert "nested more than" in said
    assert recorder.restarts == restarts and json.loads(recorder.call(1, "echo", {})) == {"id": "b"}
    # a line the child cannot read (sent past the parent's checks) is answered as that request's error
    with recorder._lock:
        recorder._number += 1
        recorder._proc.stdin.write(f'[{recorder._number}, "call", 0, "echo", ' + "[" * 100_000 + "]" * 100_000
                                   + ', null]\n')
        recorder._proc.stdin.flush()
        answer = recorder._read(10, recorder._number)
    assert answer[1] == "error" and "could not be read" in answer[2]
    assert recorder.restarts == restarts and json.loads(recorder.call(0, "echo", {})) == {"id": "a"}


def test_an_error_result_is_cut_as_a_result_is(recorder):
    """A tool exception that echoes a 100 KB argument: its message is cut to MAX_RESULT_CHARS."""
    from kit.sandbox.envclass import MAX_RESULT_CHARS

    recorder.reset([{"id": "a"}])
    said = json.loads(recorder.call(0, "boom", {"why": "x" * 100_000}))["error"]
    assert said.startswith("ValueError: xxx") and len(said) <= MAX_RESULT_CHARS + len(" ...[cut]")


def test_a_child_that_crashed_is_said_to_have_died_not_timed_out():
    host = EnvHost("scripted_envs:Crasher", timeout_s=30)
    try:
        host.reset([{"id": "a"}])
        said = json.loads(host.call(0, "crash", {}))["error"]
        assert "died (exit code 3" in said and "timed out" not in said
        assert json.loads(host.call(0, "echo", {})) == {"id": "a"}  # restarted, its world reset
    finally:
        host.close()


def test_each_world_of_a_restarted_child_is_reset_with_its_own_row(recorder):
    recorder.reset([{"id": "a"}, {"id": "b"}, {"id": "c"}])
    assert "timed out" in json.loads(recorder.call(1, "slow", {"seconds": 30}))["error"]
    assert [json.loads(recorder.call(w, "echo", {})) for w in range(3)] == [{"id": "a"}, {"id": "b"}, {"id": "c"}]


def test_a_seeded_world_draws_the_same_whatever_else_runs_and_wherever():
    """Seeded at reset, each world draws from its own stream (Python's random and numpy's): two hosts, a pool of two
    children, and a world whose neighbour draws in between all see the same numbers; another seed, others."""
    from kit.sandbox.envpool import EnvPool

    rows, seeds = [{"id": "a"}, {"id": "b"}], [11, 22]
    one, other, pool = EnvHost("scripted_envs:Dice"), EnvHost("scripted_envs:Dice"), EnvPool("scripted_envs:Dice", 2)
    try:
        dealt = one.reset(rows, seeds)
        assert dealt == other.reset(rows, seeds) == pool.reset(rows, seeds) and dealt[0] != dealt[1]
        first = [one.call(0, "roll", {}), one.call(0, "roll", {})]
        other.call(1, "roll", {})  # the neighbour draws first here, and between
        second = [other.call(0, "roll", {}), other.call(1, "roll", {}) and other.call(0, "roll", {})]
        assert first == second == [pool.call(0, "roll", {}), pool.call(0, "roll", {})] and first[0] != first[1]
        assert one.reset(rows, [12, 22])[0] != dealt[0]  # the seed decides
        assert one.reset(rows, seeds) == dealt  # a resume re-seeds: the same worlds again
        # a restarted child resets each world with its own row and seed: the same deal
        one.timeout_s = 1.0
        assert "timed out" in json.loads(one.call(1, "slow", {"seconds": 30}))["error"]
        assert [one.call(w, "show", {}) for w in range(2)] == [d.removeprefix("dealt ") for d in dealt]
    finally:
        one.close(), other.close(), pool.close()


def test_a_closed_call_of_two_arguments_with_broken_json_is_an_error_not_one_argument():
    both = '<tool_call>{"name": "post", "arguments": {"text": "say "hi" now", "tag": "x"}}</tool_call>'
    assert "error" in tools.parse_calls(both)[0]
    for middle in ('"n": 5', '"tags": ["a", "b"]', '"ok": true'):  # three arguments, one not a string (review)
        three = '<tool_call>{"name": "post", "arguments": {"text": "say "hi" now", ' + middle + ', "tag": "x"}}</tool_call>'
        assert "error" in tools.parse_calls(three)[0], middle
    last = '<tool_call>{"name": "post", "arguments": {"text": "say "hi" now", "n": 5}}</tool_call>'
    assert "error" in tools.parse_calls(last)[0]  # a last argument that is not a string
    code = '<tool_call>{"name": "post", "arguments": {"text": "d = {"a": "x", "b": 2}\nprint(d)"}}</tool_call>'
    assert tools.parse_calls(code) == [{"name": "post", "arguments": {"text": 'd = {"a": "x", "b": 2}\nprint(d)'}}]
