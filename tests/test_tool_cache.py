"""Agents acting in rounds go on from their KV cache (kit/engine/tools.py: carried_inputs, keep_cache): a round
forwards only what is new since the last (the last round's last token and the tool turn), and samples what a full
forward of every row's whole context samples. On the tiny model with the real HF engine.

Run: python -m pytest tests/test_tool_cache.py
"""

import pytest
import torch

from kit.engine import carry, rollout, tools
from kit.engine.rollout import SamplingParams, engine_for, sampling_config
from kit.engine.sampling import row_seed
from kit.run.config import load_config
from kit.sandbox.envhost import EnvHost

QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def team():
    from kit.engine.models import build_team

    team = build_team(load_config("tiny_cpu", overrides=["num_agents=2"]), **QUIET)
    team.roles = ["left", "right"]
    return team


def _rows(tok, texts):
    return [tools._Row(k, 0, k % 2, k, tok(t).input_ids, [], [], [], 4) for k, t in enumerate(texts)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_round_from_the_carried_cache_samples_what_the_whole_context_samples(team, temperature):
    tok, model = team.tokenizers[0], team.models[0]
    engine = engine_for(team, 0)
    config = sampling_config(6, temperature, 1.0, 0, [tok.eos_token_id], tok.pad_token_id)
    config.min_new_tokens = 6  # every row generates all 6 tokens: the cache then lacks the last one
    texts = ["the first prompt, longer than the others are", "a second", "third prompt here"]
    rows = _rows(tok, texts)
    adapters = [team.adapter_of[r.agent] for r in rows]
    seeds = torch.tensor([row_seed(7, ("r", i), 0) for i in range(len(rows))]) if temperature else None
    enc, past = carry.inputs(rows, tok.pad_token_id, model.config, "cpu")
    assert past is None  # the first round: plain left padding
    comp, _, cache = engine.generate_carried(enc["input_ids"], enc["attention_mask"], adapters, config, seeds)
    kept = [6, 3, 6]  # the second row's round was cut after 3 tokens (a call ended there)
    for r, n, c in zip(rows, kept, comp):
        r.ids += c[:n].tolist()
    carry.keep(cache, rows, enc["attention_mask"], kept)
    assert [r.cached for r in rows] == [len(r.prompt) + min(n, 5) for r, n in zip(rows, kept)]
    for r, extra in zip(rows, ["a tool said this", "ok", "and a much longer tool turn with many words in it"]):
        r.ids += tok(extra, add_special_tokens=False).input_ids  # a tool turn of its own length per row

    cached = [r.cached for r in rows]
    enc, past = carry.inputs(rows, tok.pad_token_id, model.config, "cpu")
    assert past is not None and past.get_seq_length() == max(cached)
    assert all(r.kv is None for r in rows)  # moved into the batched cache, not held twice through the generate
    assert enc["attention_mask"].sum(1).tolist() == [len(r.prompt) + len(r.ids) for r in rows]
    carried, carried_logp, _ = engine.generate_carried(enc["input_ids"], enc["attention_mask"], adapters, config,
                                                       seeds, past)
    whole = rollout.left_pad([r.prompt + r.ids for r in rows], tok.pad_token_id, "cpu")
    full, full_logp = engine.generate(whole["input_ids"], whole["attention_mask"], adapters, config, seeds)
    assert torch.equal(carried, full)
    assert torch.allclose(carried_logp, full_logp, atol=1e-4)


class Force:
    """Writes a call to read_left as a row's first round (while its context holds no such call); free after."""

    def __init__(self, tok):
        self.tok = tok
        self.call = tok('<tool_call>{"name": "read_left", "arguments": {}}</tool_call>',
                        add_special_tokens=False).input_ids
        self.start = None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        step = input_ids.shape[1] - self.start
        for i, ids in enumerate(input_ids):
            if '<tool_call>{"name": "read_left"' not in self.tok.decode(ids[:self.start]) and step < len(self.call):
                scores[i] = torch.where(torch.arange(scores.shape[1]) == self.call[step], 0.0, float("-inf"))
        return scores


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_joint_rollout_with_tool_rounds_is_the_same_with_and_without_the_carried_cache(team, temperature,
                                                                                         monkeypatch):
    tok = team.tokenizers[0]
    plain = rollout.seeded_config
    monkeypatch.setattr(rollout, "seeded_config",
                        lambda config, seeds: (lambda c, p: (c, type(p)([*p, Force(tok)])))(*plain(config, seeds)))
    engine = engine_for(team, 0)
    pasts = []
    carried_call = engine.generate_carried

    def spy(*args):
        pasts.append(args[5] if len(args) > 5 else None)
        return carried_call(*args)

    host = EnvHost("kit.tasks.environments:KeyHalves", timeout_s=10)
    try:
        worlds = [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}]
        requests = [(a, f"Item {w['id']}: hand in the key.") for w in worlds for a in range(2)]
        params = SamplingParams(max_new_tokens=90, temperature=temperature, use_chat_template=False)
        keys = [("t", i, a) for i in range(len(worlds)) for a in range(2)]
        outs = []
        for carry in (True, False):
            monkeypatch.setattr(engine, "carries_cache", carry)
            monkeypatch.setattr(engine, "generate_carried", spy)
            outs.append(tools.act(team, requests, 2, params, worlds=worlds, host=host, roles=team.roles,
                                  max_tool_calls=1, keys=keys, seed=3))
    finally:
        host.close()
    with_cache, without = outs
    assert with_cache.tool_calls == without.tool_calls == 8  # every row called once, then answered freely
    # with the cache, the second round went on from it; without, each round forwarded the whole context
    assert pasts[0] is None and pasts[1] is not None and pasts[2:] == [None, None]
    assert with_cache.transcripts == without.transcripts and with_cache.texts == without.texts
    a, b = with_cache.segments[0], without.segments[0]
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert torch.allclose(a.sampler_logprobs, b.sampler_logprobs, atol=1e-4)


def test_with_distinct_adapters_each_row_acts_on_its_own_agents_adapter(monkeypatch):
    """Every row of a tool round on its own agent's adapter (fresh LoRA is zero, so the tests above cannot tell the
    adapters apart): with only the left agent's adapter moved, the right agent's rows act exactly as on the bare base
    and the left agent's do not; two worlds rolled out together, agents interleaved, going on from the carried
    cache, act as each world acts alone."""
    from kit.engine.models import adapter_parameters, build_team

    team = build_team(load_config("tiny_cpu", overrides=["num_agents=2"]), **QUIET)
    team.roles = ["left", "right"]
    tok = team.tokenizers[0]
    plain = rollout.seeded_config
    monkeypatch.setattr(rollout, "seeded_config",
                        lambda config, seeds: (lambda c, p: (c, type(p)([*p, Force(tok)])))(*plain(config, seeds)))
    host = EnvHost("kit.tasks.environments:KeyHalves", timeout_s=10)
    try:
        worlds = [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}]
        params = SamplingParams(max_new_tokens=90, temperature=0.0, use_chat_template=False)

        def play(ws):
            requests = [(a, f"Item {w['id']}: hand in the key.") for w in ws for a in range(2)]
            keys = [("t", w["id"], a) for w in ws for a in range(2)]
            return tools.act(team, requests, 1, params, worlds=ws, host=host, roles=team.roles, max_tool_calls=1,
                             keys=keys, seed=3)

        bare = play(worlds)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in adapter_parameters(team.models[0], team.adapter_of[0]):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
        moved = play(worlds)
        alone = [play([w]) for w in worlds]
    finally:
        host.close()
    assert moved.tool_calls == 4
    left, right = [0, 2], [1, 3]  # the requests' rows: world k0's left and right agents, then k1's
    assert [moved.transcripts[k] for k in right] == [bare.transcripts[k] for k in right]
    assert all(moved.transcripts[k] != bare.transcripts[k] for k in left)
    assert moved.transcripts == alone[0].transcripts + alone[1].transcripts
