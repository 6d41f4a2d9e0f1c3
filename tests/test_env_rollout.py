"""Environments and tools (issue 52), the joint rollout: a scripted engine plays fixed tool calls on the tiny
model; ids extended without re-tokenizing, tool tokens off the mask, roles, rounds and budgets.

Run: python -m pytest tests/test_env_rollout.py
"""

import json
import re

import pytest
import torch

from env_helpers import Scripted, team, keys, play, Parallel

from kit.engine import tools
from kit.sandbox.envhost import EnvHost
from kit.engine.rollout import SamplingParams
from kit.tasks.environments import KeyHalves


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


def test_an_agents_rows_keep_every_generated_token_after_its_tool_turns(team, keys):
    ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=2)
    seg = ro.segments[0]
    for agent in (0, 1):
        sub = seg.rows([agent])
        mine = seg.agent == agent
        assert int(sub.completion_mask.sum()) == int(seg.completion_mask[mine].sum())
        assert int(sub.attention_mask.sum()) == int(seg.attention_mask[mine].sum())


def test_the_reward_reads_the_answer_start_only_on_a_first_round_answer(team, keys):
    from kit.engine.prompts import Prompt

    worlds = [{"id": "k0", "key": "123456"}]
    requests = [(a, Prompt("hand in the key", "I say: ")) for a in range(2)]
    ro = tools.act(team, requests, 1, SamplingParams(max_new_tokens=200), worlds=worlds, host=keys,
                   roles=team.roles, max_tool_calls=4, keys=[("t", a) for a in range(2)])
    assert ro.texts[0][0] == "done"  # the last round's answer: the prompt's start was before the first round
    assert ro.transcripts[0][0].startswith("I say: <tool_call>")


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



# --- review 7: what the rollout guarantees, each with a test that fails on the bug ---------------------------------

class Verbose(Scripted):
    """A long call each round (it eats most of the budget), then an answer of 200 tokens' worth."""

    def answer(self, context, adapter):
        side = "left" if adapter == "agent_0" else "right"
        if not re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S):  # the prompt names the tag
            pad = "x" * (60 if adapter == "agent_0" else 5)
            return f'<tool_call>{{"name": "read_{side}", "arguments": {{}}}}</tool_call>{pad}'
        return "y " * 200


def test_no_row_keeps_more_tokens_than_max_new_tokens_over_its_rounds(team, keys):
    """Each round is cut to each row's own remaining room (the rows' rooms differ after their first round)."""
    team.engines[0] = Verbose(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        requests = [(a, "Item k0: hand in the key.") for a in range(2)]
        ro = tools.act(team, requests, 2, SamplingParams(max_new_tokens=120, temperature=1.0),
                       worlds=[{"id": "k0", "key": "123456"}], host=keys, roles=team.roles, max_tool_calls=4,
                       keys=[("t", 0, a) for a in range(2)], seed=0)
    finally:
        team.engines[0] = Scripted(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    generated = ro.segments[0].completion_mask.sum(-1)
    assert int(generated.max()) == 120 and (generated <= 120).all()


def test_several_calls_in_one_block_never_run_past_the_calls_left(team, keys):
    """Parallel writes three calls in its first round; with max_tool_calls=2 only two run per row."""
    team.engines[0] = Parallel(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=2, max_calls=1)
    finally:
        team.engines[0] = Scripted(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    assert ro.tool_calls == 4  # 2 agents x G=2 rows, one call each


class BareCaller(Scripted):
    """Calls with a bare JSON object ended by EOS (no </tool_call>), then answers."""

    def answer(self, context, adapter):
        side = "left" if adapter == "agent_0" else "right"
        if not re.findall(r"<tool_response>\n(.*?)\n</tool_response>", context, re.S):
            return f'{{"name": "read_{side}", "arguments": {{}}}}'
        return "done"


def test_a_call_ended_by_eos_gets_one_end_of_turn(team, keys):
    """The round's EOS is the assistant turn's end: the tool turn that follows does not add the template's again."""
    tok = team.tokenizers[0]
    team.engines[0] = BareCaller(tok, tok.eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}], G=1)
    finally:
        team.engines[0] = Scripted(tok, tok.eos_token_id)
    seg = ro.segments[0]
    row = int((seg.sample == 0).nonzero()[0])
    text = tok.decode(seg.input_ids[row, seg.prompt_len:].tolist())
    between = text[text.index('"arguments": {}}'):text.index("<tool_response>\n")]
    assert between.count(tok.eos_token) == 1, between
    assert ro.tool_calls == 2


def test_a_worlds_randomness_is_seeded_from_the_rollouts_keys(team):
    """act seeds each world from (seed, its group's key, sample): the same keys deal the same worlds, another
    sample or another step others (kit/sandbox/envhost.py keeps each world's stream apart)."""
    host = EnvHost("scripted_envs:Dice")
    try:
        def dealt(step, seed=0):
            requests = [(a, "roll") for a in range(2)]
            ro = tools.act(team, requests, 2, SamplingParams(max_new_tokens=8, temperature=1.0), worlds=[{"id": "d"}],
                           host=host, roles=team.roles, max_tool_calls=1, keys=[("t", step, a) for a in range(2)],
                           seed=seed)
            return ro.reset_texts[0]
        first = dealt(1)
        assert dealt(1) == first and first[0] != first[1]  # G samples: their own worlds
        assert dealt(2) != first and dealt(1, seed=5) != first
    finally:
        host.close()
