"""Per-row seeded sampling (kit/engine/sampling.py): the hash, the Gumbel-max sampler's distribution, and rollouts that
do not depend on the rest of the batch.

Run: python -m pytest tests/test_sampling.py
"""

import dataclasses

import numpy as np
import pytest
import torch

from test_compiled_engine import as_engine
from test_models_rollout import REQUESTS, make_team

import kit.engine.sampling
from kit.engine.rollout import Sampler, SamplingParams, generate, sampling_config
from kit.engine.sampling import SeededSampling, _mix, gumbel_from_bits, row_seed, seeded_config, seeded_gumbel

M64 = 2**64 - 1


def splitmix64_finalizer(x: int) -> int:
    """The reference, on Python ints modulo 2**64."""
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def test_the_hash_is_splitmix64_on_int64_tensors():
    values = [0, 1, 2, 12345, -1, -(2**63), 2**63 - 1, 0x0123456789ABCDEF]
    got = _mix(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & M64 for g in got] == [splitmix64_finalizer(v) for v in values]
    # SplitMix64 seeded with 0: its first output is the finalizer of the golden-ratio increment
    assert splitmix64_finalizer(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


def test_noise_depends_only_on_the_rows_own_seed_step_and_token():
    seeds = torch.tensor([11, -5, 2**40], dtype=torch.int64)
    noise = seeded_gumbel(seeds, 3, 50)
    assert torch.equal(noise[1:2], seeded_gumbel(seeds[1:2], 3, 50))  # alone or in a batch
    assert torch.equal(noise[:, :20], seeded_gumbel(seeds, 3, 20))  # token t's noise ignores the vocabulary size
    assert not torch.equal(noise, seeded_gumbel(seeds, 4, 50))
    assert torch.isfinite(noise).all()


QWEN_VOCAB = 151_936  # Qwen2.5's logits; a 1-in-2^24 event per token happens in 0.9% of its row-steps


def test_the_noise_is_finite_and_bounded_for_every_hash_output():
    """u is read from bits 33..63; sweep every value within 2^18 of both ends of (0, 1/2) and (1/2, 1), the
    places where a float u rounds to 0, 1/2 or 1, with the unused low bits all zero and all one."""
    near = torch.arange(2**18, dtype=torch.int64)
    top = torch.cat([near, -1 - near, 2**30 - 1 - near, -(2**30) + near])  # bits 33..63 as a signed number
    bits = torch.cat([top << 33, (top << 33) | (2**33 - 1)])
    noise = gumbel_from_bits(bits)
    assert torch.isfinite(noise).all()
    assert -3.11 < noise.min() and noise.max() < 22.19  # -log(-log u) at u = 2^-32 and 1 - 2^-32
    assert gumbel_from_bits(torch.tensor([0, -1])).tolist() == pytest.approx([-3.0992, 22.1807], abs=1e-3)


def test_the_noise_is_gumbel_distributed():
    """Kolmogorov-Smirnov against exp(-exp(-x)): the signed reading of the bits gives a uniform u."""
    bits = torch.randint(-(2**63), 2**63 - 1, (200_000,), generator=torch.Generator().manual_seed(0))
    noise = gumbel_from_bits(bits).double().sort().values
    cdf = torch.exp(-torch.exp(-noise))
    n = len(noise)
    ks = max((torch.arange(1, n + 1) / n - cdf).max(), (cdf - torch.arange(n) / n).max())
    assert ks < 1.95 / n**0.5  # the 0.1% critical value


def test_no_infinite_or_nan_score_at_a_real_vocabulary_size():
    """+inf or NaN noise anywhere shows as a +inf or NaN score, -inf noise as a kept token's score at -inf."""
    rows, steps = 32, 12  # 384 row-steps: 3.5 infinite noises expected from a u that can round to 1
    seeds = torch.tensor([row_seed(0, ("qwen",), r) for r in range(rows)])
    logits = torch.randn(rows, QWEN_VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, logits.topk(50).indices, True)
    sampler = SeededSampling(seeds, 0.7, 1.0, 50)
    for step in range(steps):
        scores = sampler(torch.zeros(rows, 1 + step, dtype=torch.long), logits)
        assert not (scores.isnan() | scores.isposinf()).any(), step
        assert torch.equal(scores.isfinite(), kept), step  # the rest is -inf, as top-k left it
        assert kept.gather(1, scores.argmax(-1, keepdim=True)).all(), step


@pytest.mark.parametrize("engine", ["hf", "compiled"])
@pytest.mark.parametrize("bits", [None, 0, -1, 2**63 - 1, -(2**63)],
                         ids=["hash", "all zero", "all one", "u just below 1/2", "u just above 1/2"])
def test_top_k_1_samples_the_greedy_token_whatever_the_noise(engine, bits, monkeypatch):
    """With `bits`, every token's noise comes from that one hash output (the extremes of the noise): a token that
    top-k removed must still never win, in either engine."""
    if bits is not None:
        real = kit.engine.sampling.gumbel_from_bits
        monkeypatch.setattr(kit.engine.sampling, "gumbel_from_bits", lambda b: real(torch.full_like(b, bits)))
    team = as_engine(make_team(), engine)
    requests = REQUESTS * 2
    greedy = generate(team, requests, 2, max_new_tokens=8, temperature=0)
    sampled = generate(team, requests, 2, max_new_tokens=8, temperature=1.0, top_k=1,
                       keys=[("k", i) for i in range(len(requests))])
    assert torch.equal(sampled.segments[0].input_ids, greedy.segments[0].input_ids)


def warped_distribution(logits, temperature, top_p, top_k):
    """softmax(logits / temperature) cut to the top k, renormalized, then to the smallest top set of mass >= top_p."""
    p = torch.softmax(torch.as_tensor(logits, dtype=torch.float64) / temperature, -1)
    order = p.argsort(descending=True)
    p[order[top_k:]] = 0
    p /= p.sum()
    keep = torch.cumsum(p[order], 0) - p[order] < top_p  # the mass before a token is short of top_p
    p[order[~keep]] = 0
    return p / p.sum()


@pytest.mark.parametrize("vocab, rows, steps", [(64, 4096, 16), (QWEN_VOCAB, 32, 12)])
def test_sampled_frequencies_match_the_warped_distribution(vocab, rows, steps):
    """Chi-square over the tokens that top-k then top-p keep; no sample may fall outside them. The first
    tokens' probabilities are chosen so that top-p before top-k would keep a different set."""
    logits = torch.full((vocab,), -6.0)
    logits[:6] = torch.tensor([0.30, 0.25, 0.20, 0.10, 0.05, 0.05]).log()
    temperature, top_p, top_k = 0.9, 0.8, 4
    expected = warped_distribution(logits, temperature, top_p, top_k)
    support = expected > 0
    assert support.sum() == 3  # top-p before top-k would keep 4
    sampler = SeededSampling(torch.tensor([row_seed(1, ("chi2",), r) for r in range(rows)]), temperature, top_p,
                             top_k)
    counts = torch.zeros(vocab, dtype=torch.float64)
    for step in range(steps):
        picks = sampler(torch.zeros(rows, 1 + step, dtype=torch.long), logits.expand(rows, -1)).argmax(-1)
        counts += torch.bincount(picks, minlength=vocab)
    assert counts[~support].sum() == 0
    n = rows * steps
    chi2 = ((counts[support] - n * expected[support]) ** 2 / (n * expected[support])).sum()
    assert chi2 < 13.8  # the 0.1% critical value for 2 degrees of freedom


def test_row_seeds_move_to_the_scores_device_once():
    """Not a blocking host-to-device copy at every decode step (the meta device stands in for a GPU)."""
    sampler = SeededSampling(torch.arange(3), 0.7, 0.9, 5)
    ids, scores = torch.zeros(3, 4, dtype=torch.long, device="meta"), torch.zeros(3, 50, device="meta")
    sampler(ids, scores)
    seeds = sampler.row_seeds
    assert seeds.device == scores.device
    sampler(torch.zeros(3, 5, dtype=torch.long, device="meta"), scores)
    assert sampler.row_seeds is seeds


def empirical(logits, temperature=1.0, top_p=1.0, top_k=0, rows=40_000):
    sampler = SeededSampling(torch.arange(rows, dtype=torch.int64) * 7919 + 3, temperature, top_p, top_k)
    scores = torch.tensor(logits, dtype=torch.float32).expand(rows, -1).clone()
    picks = sampler(torch.zeros(rows, 5, dtype=torch.long), scores).argmax(-1)
    return np.bincount(picks.numpy(), minlength=len(logits)) / rows


@pytest.mark.parametrize("temperature, top_p, top_k, expected", [
    (1.0, 1.0, 0, [0.5, 0.3, 0.2, 0.0]),
    (2.0, 1.0, 0, np.sqrt([0.5, 0.3, 0.2, 0.0]) / np.sqrt([0.5, 0.3, 0.2]).sum()),  # softmax(log p / 2)
    (1.0, 0.6, 0, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]),  # nucleus: the smallest set with mass >= 0.6
    (1.0, 1.0, 1, [1.0, 0.0, 0.0, 0.0]),
])
def test_gumbel_max_samples_the_warped_distribution(temperature, top_p, top_k, expected):
    logits = np.log([0.5, 0.3, 0.2, 1e-30])
    assert empirical(logits, temperature, top_p, top_k) == pytest.approx(expected, abs=0.01)


def test_seeded_config_switches_to_greedy_decoding_only_when_seeds_are_given():
    cfg = sampling_config(8, 0.7, 0.9, 0, [0], 0)
    greedy, processors = seeded_config(cfg, torch.tensor([1, 2]))
    assert not greedy.do_sample and len(processors) == 1 and cfg.do_sample  # the caller's config is untouched
    assert seeded_config(cfg, None)[1] == [] and seeded_config(sampling_config(8, 0.0, 1.0, 0, [0], 0),
                                                                 torch.tensor([1]))[1] == []


def test_row_seeds_are_a_function_of_seed_key_and_sample():
    assert row_seed(0, ("train", 3, 1), 2) == row_seed(0, ("train", 3, 1), 2)
    assert len({row_seed(s, k, g) for s in (0, 1) for k in (("a", 1), ("a", 2)) for g in (0, 1)}) == 8


def test_a_request_samples_the_same_completions_alone_or_in_any_batch():
    team = make_team()
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    sampler = Sampler(team, params, seed=5)
    keys = [("k", i) for i in range(len(REQUESTS))]
    together = sampler.sample(REQUESTS, 3, keys=keys).texts
    alone = sampler.sample(REQUESTS[2:3], 3, keys=keys[2:3]).texts
    reordered = sampler.sample(REQUESTS[::-1], 3, keys=keys[::-1]).texts[::-1]
    assert alone == together[2:3] and reordered == together
    assert len({t for per in together for t in per}) > len(REQUESTS)  # it does sample
    assert Sampler(team, params, seed=6).sample(REQUESTS, 3, keys=keys).texts != together


@pytest.mark.parametrize("requests", [REQUESTS, REQUESTS + [(0, "one more for agent zero")]],
                         ids=["even blocks", "uneven blocks (padding rows)"])
def test_the_compiled_engine_samples_exactly_what_the_hf_engine_samples(requests):
    team = make_team()
    keys = [("k", i) for i in range(len(requests))]
    args = dict(max_new_tokens=8, temperature=0.8, top_p=0.9, keys=keys, seed=1)
    hf = generate(team, requests, 2, **args)
    fast = generate(as_engine(team, "compiled"), requests, 2, **args)
    assert fast.texts == hf.texts
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(hf.segments, fast.segments))


def test_keys_must_match_the_requests():
    with pytest.raises(ValueError, match="one key per request"):
        generate(make_team(), REQUESTS, 1, max_new_tokens=2, keys=[("a",)])
    assert dataclasses.asdict(SamplingParams(4).greedy())["temperature"] == 0.0


def test_a_segment_joins_prompts_and_completions_and_masks_after_the_first_eos():
    from kit.engine.rollout import build_segment

    eos = 9
    prompts = torch.tensor([[0, 4, 5], [3, 4, 5]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    seg = build_segment(0, prompts, mask, torch.tensor([[6, eos, eos], [7, 8, 1]]), [eos], torch.tensor([0, 1]),
                        torch.tensor([1, 1]))
    assert seg.input_ids.tolist() == [[0, 4, 5, 6, 9, 9], [3, 4, 5, 7, 8, 1]]
    assert seg.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert seg.attention_mask.tolist() == [[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]
    assert seg.prompt_len == 3
    part = seg.slice(1, 2)
    assert part.input_ids.tolist() == [[3, 4, 5, 7, 8, 1]] and part.sample.tolist() == [1]


# --- the step's cost: no sort of the vocabulary, noise only where a token is kept (issue 77)

def reference_step(seeds, step, logits, temperature, top_p, top_k):
    """What SeededSampling computed before issue 77: transformers' warpers (a full sort for top-p), then every
    token's noise. (scores + noise, log-probs) of one step."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = ([TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []) + \
        ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
    scores = logits
    for w in warpers:
        scores = w(None, scores)
    scores = scores.float()
    return scores + seeded_gumbel(seeds, step, scores.shape[-1]), scores.log_softmax(-1)


@pytest.mark.parametrize("temperature, top_p, top_k", [(0.7, 0.9, 0), (1.0, 0.95, 50), (0.7, 1.0, 50),
                                                        (1.0, 1.0, 0), (0.5, 0.3, 0), (1.0, 0.999, 0)])
def test_a_step_picks_the_tokens_and_log_probs_of_the_full_sort_and_hash(temperature, top_p, top_k):
    """At a real vocabulary size, on logits shaped like a language model's (a few likely tokens, a long tail): the
    sampled token and its log-prob are those of transformers' sorting warpers with every token hashed."""
    rows = 16
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(rows, QWEN_VOCAB, generator=gen) * 2
    logits[:, :40] += torch.randn(rows, 40, generator=gen) * 3 + 12  # a head of plausible tokens
    logits[:2] = torch.randn(2, QWEN_VOCAB, generator=gen) * 0.05  # two flat rows: nuclei of thousands of tokens
    seeds = torch.tensor([row_seed(5, ("ref",), r) for r in range(rows)])
    sampler = SeededSampling(seeds, temperature, top_p, top_k)
    for step in range(3):
        ids = torch.zeros(rows, 4 + step, dtype=torch.long)
        if step:
            ids[:, -1] = picks
        scores = sampler(ids, logits)
        ref_scores, ref_logp = reference_step(seeds, step, logits, temperature, top_p, top_k)
        picks = scores.argmax(-1)
        assert torch.equal(picks, ref_scores.argmax(-1)), step
        assert torch.equal(scores.isfinite(), ref_scores.isfinite()), step  # the same tokens kept
        assert torch.equal(scores[scores.isfinite()], ref_scores[ref_scores.isfinite()]), step
    logp = sampler.logprobs(picks[:, None].expand(rows, 3).clone())
    assert torch.equal(logp[:, -1], ref_logp.gather(1, picks[:, None])[:, 0])


def kept_per_row(rows: torch.Tensor, num_rows: int) -> list[int]:
    return torch.bincount(rows, minlength=num_rows).tolist()


def test_a_flat_rows_nucleus_reaches_past_the_first_candidates_alone():
    """A flat distribution's nucleus is thousands of tokens: that row is sorted whole, the sharp rows keep their
    few candidates."""
    logits = torch.linspace(1.0, 0.0, 5000).expand(2, -1).clone()  # nearly flat: 0.5 of the mass in 1,900 tokens
    logits[1, :3] = torch.tensor([20.0, 19.9, 19.0])  # the second row: 0.44, 0.40, 0.16 of the mass: two kept
    ids, vals, kept, wide = kit.engine.sampling.nucleus(logits, 0.5)
    p = logits[0].double().softmax(-1)  # already in descending order
    expected = int((p.cumsum(0) - p < 0.5).sum())
    rows, tokens, wvals = wide
    assert kept_per_row(rows, 2) == [expected, 0] and expected > kit.engine.sampling.NUCLEUS_WIDTH  # row 0, sorted
    assert kept.sum(-1).tolist() == [0, 2] and sorted(ids[1][kept[1]].tolist()) == [0, 1]  # row 1: its candidates
    assert torch.equal(wvals, logits[rows, tokens])


def test_tokens_tied_at_the_nucleus_edge_are_all_kept():
    """Mass strictly above decides: of four tokens tied after a 0.4 token, with top_p 0.5, all four are kept (a
    sort would keep an arbitrary one)."""
    p = torch.tensor([[0.4, 0.1, 0.1, 0.1, 0.1, 0.2]])
    p[0, 5] = 0.05
    _, _, kept, wide = kit.engine.sampling.nucleus(p.log(), 0.5)
    assert int(kept.sum()) == 5 and wide is None


def test_noise_of_a_token_subset_is_the_full_vocabulary_noise_at_those_tokens():
    seeds = torch.tensor([3, -9], dtype=torch.int64)
    ids = torch.tensor([[5, 0, 49], [7, 7, 1]])
    assert torch.equal(seeded_gumbel(seeds, 2, ids), seeded_gumbel(seeds, 2, 50).gather(1, ids))
