"""Each prompt forwarded once for its samples (issue 40): the same tokens, log-probs and gradients as forwarding
every row's own prompt, in generation and in the update. Run: python -m pytest tests/test_prompt_sharing.py"""

import pytest
import torch

from kit.run.config import load_config
from kit.engine.models import Team, adapter_parameters, attach_adapters, build_tiny_model, lora_config
from kit.engine.rollout import HFEngine, generate
from kit.engine.forward import completion_logprobs, prompt_groups
from kit.trainers.trainer import Trainer

# two agents, prompts of three lengths (left padding), one prompt given to both agents (one group per adapter)
REQUESTS = [(0, "a0 sum 7"), (1, "a0 sum 7"), (0, "a much longer prompt for agent zero"), (1, "x")]


def make_team():
    model, tok = build_tiny_model(0)
    names = ["agent_0", "agent_1"]
    pm = attach_adapters(model, names, lora_config(8, 16, 0.0, "all-linear"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh LoRA B is zero: give each adapter an effect of its own
        for name in names:
            for p in adapter_parameters(pm, name):
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    return Team([pm], [tok], [0, 0], names)


def sample(team, share, n=4, **kw):
    team.share_prompts = share
    team.engines.clear()
    keys = [(0, k) for k in range(len(REQUESTS))]
    return generate(team, REQUESTS, n, max_new_tokens=12, temperature=1.0, keys=keys, **kw)


def test_groups_are_the_identical_left_padded_prompts_numbered_by_first_appearance():
    pad = 0
    ids = torch.tensor([[5, 6, 7], [pad, 6, 7], [5, 6, 7], [pad, 6, 7], [3, 3, 3]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    first, group = prompt_groups(ids, mask)
    assert first.tolist() == [0, 1, 4] and group.tolist() == [0, 1, 0, 1, 2]
    # the pad id is a real token in the prompt (SmolLM2: pad = <|im_end|>): same ids, another mask, another prompt
    first, group = prompt_groups(torch.tensor([[pad, 6], [pad, 6]]), torch.tensor([[1, 1], [0, 1]])), None
    assert first is None
    assert prompt_groups(torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2, dtype=torch.long)) is None


def test_shared_prefill_samples_the_same_tokens_with_mixed_adapters_and_left_padding():
    team = make_team()
    calls = []
    real = HFEngine.prefill

    def spy(self, ids, mask, adapters):
        cache = real(self, ids, mask, adapters)
        calls.append(None if cache is None else cache.layers[0].keys.shape[0])
        return cache

    HFEngine.prefill = spy
    try:
        a, b = sample(team, False), sample(team, True)
    finally:
        HFEngine.prefill = real
    assert calls == [16]  # one prefill of 4 distinct (prompt, adapter) pairs, indexed out to 16 rows
    assert a.texts == b.texts
    sa, sb = a.segments[0], b.segments[0]
    assert torch.equal(sa.input_ids, sb.input_ids) and torch.equal(sa.completion_mask, sb.completion_mask)
    torch.testing.assert_close(sa.sampler_logprobs, sb.sampler_logprobs, atol=1e-5, rtol=0)


def test_greedy_shared_prefill_equals_unshared():
    team = make_team()
    team.share_prompts = False
    a = generate(team, REQUESTS, 3, max_new_tokens=10, temperature=0)
    team.share_prompts, team.engines = True, {}
    assert generate(team, REQUESTS, 3, max_new_tokens=10, temperature=0).texts == a.texts


def logprobs_and_grads(team, seg, adapter, share, entropy=True, temperature=0.7):
    model = team.models[0]
    model.set_adapter(adapter)
    model.train()
    params = adapter_parameters(model, adapter)
    for p in params:
        p.grad = None
    lp, ent = completion_logprobs(model, seg, temperature, entropy=True, share_prompts=share)
    ((lp * seg.completion_mask).sum() + 0.1 * (ent * seg.completion_mask).sum()).backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("head", ["hidden", "logits"])
@pytest.mark.parametrize("rows", ["all", "micro-batch", "one token"])
def test_shared_update_forward_has_the_unshared_logprobs_entropy_and_gradient(head, rows):
    team = make_team()
    seg = sample(team, True).segments[0]
    model = team.models[0]
    if head == "logits":  # a trainable output layer: the model's own logits, not the decoder + head path
        model.get_base_model().lm_head.weight.requires_grad_(True)
    for adapter, agents in (("agent_0", [0]), ("agent_1", [1])):
        sub = seg.rows(agents)
        if rows == "micro-batch":
            sub = sub.slice(2, 7)  # cuts a group of 4 samples in two
        elif rows == "one token":
            sub = sub.slice(0, 8)
            sub = type(sub)(sub.base, sub.input_ids[:, :sub.prompt_len + 1], sub.attention_mask[:, :sub.prompt_len + 1],
                            sub.completion_mask[:, :1], sub.prompt_len, sub.sample, sub.agent,
                            sub.sampler_logprobs[:, :1], sub.finished)
        assert prompt_groups(sub.input_ids[:, :sub.prompt_len], sub.attention_mask[:, :sub.prompt_len]) is not None
        lp0, e0, g0 = logprobs_and_grads(team, sub, adapter, share=False)
        lp1, e1, g1 = logprobs_and_grads(team, sub, adapter, share=True)
        m = sub.completion_mask.bool()
        torch.testing.assert_close(lp1[m], lp0[m], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(e1[m], e0[m], atol=1e-5, rtol=1e-5)
        # float32 rounding of other shapes (the head's log-softmax is float32 either way): a relative error of a few
        # 1e-6 on the gradient; a wrong gradient (a prompt counted once, not once per completion) is off by O(1)
        assert max(float((x - y).norm() / y.norm()) for x, y in zip(g1, g0)) < 1e-4


def test_gradient_checkpointing_forwards_every_prompt(monkeypatch):
    """Checkpointing drops the KV cache that sharing reads: the update falls back to whole rows."""
    team = make_team()
    seg = sample(team, True).segments[0].rows([0])
    model = team.models[0]
    model.get_base_model().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    import kit.engine.forward as forward

    monkeypatch.setattr(forward, "shared_prompt_forward", lambda *a: pytest.fail("shared under checkpointing"))
    logprobs_and_grads(team, seg, "agent_0", share=True)


@pytest.mark.parametrize("overrides", [[], ["beta=0.1", "num_iterations=2"], ["algorithm=marlhf"]])
def test_a_training_step_with_and_without_sharing_ends_at_the_same_adapters(tmp_path, overrides):
    runs = {}
    for share in (False, True):
        cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / str(share)}", "progress=false",
                                                 f"share_prompts={str(share).lower()}", *overrides])
        trainer = Trainer(cfg)
        trainer.train(max_steps=2)
        runs[share] = [p.detach().clone() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)]
        trainer.close()
    assert max(float((x - y).norm() / y.norm()) for x, y in zip(runs[True], runs[False])) < 1e-4


@pytest.mark.parametrize("share", [False, True])
def test_every_decoding_step_forwards_one_token_per_row(share):
    """The KV cache is on in both paths: after the prompt, one new token a row per forward."""
    team = make_team()
    widths = []
    decoder = team.models[0].get_base_model().model
    hook = decoder.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        sample(team, share)
    finally:
        hook.remove()
    prefills = 2 if share else 1  # the shared prefix, then the prompts' last token; or the whole prompts
    assert widths[prefills:] == [1] * (len(widths) - prefills) and len(widths) > prefills + 3


@pytest.mark.parametrize("family", ["mistral", "gemma3"])
def test_sliding_window_layers_share_exactly(family):
    """A window (5) shorter than the prompt (9): the cache keeps each layer's own kind (Gemma 3 mixes both)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

    from kit.engine.rollout import Segment

    torch.manual_seed(0)
    shape = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                 sliding_window=5)
    model = MistralForCausalLM(MistralConfig(num_hidden_layers=2, **shape)) if family == "mistral" else \
        Gemma3ForCausalLM(Gemma3TextConfig(num_hidden_layers=3, head_dim=8, **shape,
                                           layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    model = attach_adapters(model, ["agent_0"], lora_config(4, 8, 0.0, "all-linear"))
    with torch.no_grad():
        for p in adapter_parameters(model, "agent_0"):
            p.add_(torch.randn_like(p) * 0.3)
    P, T = 9, 6
    prompt, pmask = torch.randint(1, 100, (2, P)), torch.ones(2, P, dtype=torch.long)
    prompt[1, :3], pmask[1, :3] = 0, 0  # left padding on the second prompt
    ids = torch.cat([prompt.repeat_interleave(2, 0), torch.randint(1, 100, (4, T))], 1)
    att = torch.cat([pmask.repeat_interleave(2, 0), torch.ones(4, T, dtype=torch.long)], 1)
    seg = Segment(0, ids, att, torch.ones(4, T, dtype=torch.long), P, torch.arange(4), torch.zeros(4, dtype=torch.long),
                  torch.zeros(4, T), torch.ones(4, dtype=torch.bool))
    team = Team([model], [None], [0], ["agent_0"])
    lp0, e0, g0 = logprobs_and_grads(team, seg, "agent_0", share=False)
    lp1, e1, g1 = logprobs_and_grads(team, seg, "agent_0", share=True)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    assert max(float((x - y).norm() / y.norm()) for x, y in zip(g1, g0)) < 1e-4


# --- a call bounded by memory (kit/engine/batching.py, issue 77)

@pytest.mark.parametrize("fit, slices", [(9, [8, 8]), (13, [12, 4])])
def test_a_call_split_by_memory_samples_what_one_call_samples(monkeypatch, fit, slices):
    """Rows in slices of whole requests (of 4 requests' 4 samples: 16 rows), the last one partial or not: the same
    texts, token ids, masks and sampler log-probs as one call (seeded per row)."""
    import kit.engine.rollout

    team = make_team()
    whole = sample(team, True)
    calls = []
    real = HFEngine.generate
    monkeypatch.setattr(HFEngine, "generate", lambda self, ids, *a: calls.append(len(ids)) or real(self, ids, *a))
    monkeypatch.setattr(kit.engine.rollout, "rows_that_fit", lambda *a: fit)
    split = sample(team, True)
    assert calls == slices
    assert split.texts == whole.texts
    a, b = whole.segments[0], split.segments[0]
    T = a.completion_mask.shape[1]
    assert torch.equal(a.completion_mask, b.completion_mask[:, :T]) and not b.completion_mask[:, T:].any()
    assert torch.equal(a.input_ids * a.attention_mask, (b.input_ids * b.attention_mask)[:, :a.input_ids.shape[1]])
    assert torch.allclose(a.sampler_logprobs, b.sampler_logprobs[:, :T], atol=1e-6)


def test_rows_that_fit_follow_the_kv_cache_and_the_scores():
    """Qwen2.5-0.5B's shape: 24 layers x 2 KV heads x 64 x 4 bytes x 2 = 24 KiB a position in fp32, plus four
    float32 copies of a 151,936-token vocabulary's scores (2.3 MiB): 500 positions a row -> ~14.3 MiB a row."""
    from types import SimpleNamespace

    from kit.engine.batching import bytes_per_row

    config = SimpleNamespace(num_hidden_layers=24, num_key_value_heads=2, num_attention_heads=14, head_dim=64,
                             hidden_size=896, vocab_size=151_936)
    assert bytes_per_row(config, 500) == 2 * 24 * 2 * 64 * 4 * 500 + 4 * 4 * 151_936
    assert bytes_per_row(config, 500, torch.bfloat16) == 2 * 24 * 2 * 64 * 2 * 500 + 4 * 4 * 151_936


def test_the_rows_that_fit_are_half_the_free_memory_over_a_rows_cache_and_scores():
    from kit.engine.batching import bytes_per_row, rows_that_fit

    model = make_team().models[0]
    config = model.get_base_model().config
    per_row = bytes_per_row(config, 30 + 20)  # the prompt and the new tokens: the cache's positions
    assert rows_that_fit(model, 30, 20, free=2 * 7 * per_row + 1) == 7
    assert rows_that_fit(model, 30, 20, free=10) == 1  # at least one row a call
    bf16 = model.get_base_model().to(torch.bfloat16)
    assert rows_that_fit(model, 30, 20, free=2 * 7 * per_row + 1) > 7  # a bf16 cache is half the bytes
    bf16.to(torch.float32)
