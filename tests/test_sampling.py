"""Per-row seeded sampling (kit/sampling.py): the hash, the Gumbel-max sampler's distribution, and rollouts that
do not depend on the rest of the batch.

Run: python -m pytest tests/test_sampling.py
"""

import dataclasses

import numpy as np
import pytest
import torch

from test_compiled_engine import as_engine
from test_models_rollout import REQUESTS, make_team

from kit.rollout import Sampler, SamplingParams, generate, sampling_config
from kit.sampling import SeededSampling, _mix, row_seed, seeded_config, seeded_gumbel

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
    from kit.rollout import build_segment

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
