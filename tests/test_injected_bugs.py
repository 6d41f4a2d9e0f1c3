"""Tests for bugs an independent review injected that the suite missed (tools/mutate.py lists each edit, "review"
in its name, with the test here that now catches it). Run: python -m pytest tests/test_injected_bugs.py
"""
import numpy as np
import pytest
import torch

from kit.maths import magrpo
from kit.engine.rollout import Sampler, SamplingParams, generate
from kit.engine.forward import completion_logprobs, position_ids
from kit.engine.sampling import row_seed
from test_models_rollout import REQUESTS, make_team
from test_sampling import empirical
import test_config_reaches_maths as cfgm


def test_temperature_warps_before_top_p_cuts():
    # T=2 flattens [.5,.3,.2] to [.415,.322,.263]: a 0.45 nucleus needs two tokens (cut first, it keeps one)
    kept = np.sqrt([0.5, 0.3])
    assert empirical(np.log([0.5, 0.3, 0.2, 1e-30]), 2.0, 0.45, 0) == pytest.approx(
        list(kept / kept.sum()) + [0.0, 0.0], abs=0.01)


def test_a_short_request_samples_the_same_alone_as_left_padded_in_a_batch():
    sampler = Sampler(make_team(), SamplingParams(max_new_tokens=8, temperature=1.0), seed=5)
    keys = [("k", i) for i in range(len(REQUESTS))]
    together = sampler.sample(REQUESTS, 3, keys=keys).texts
    assert sampler.sample(REQUESTS[3:4], 3, keys=keys[3:4]).texts == together[3:4]  # 3 tokens alone, 37 in the batch


def test_the_logits_path_equals_the_chunked_head_path(monkeypatch):
    import kit.engine.forward as forward
    team = make_team()
    model = team.models[0]
    seg = generate(team, REQUESTS, 2, max_new_tokens=6, temperature=1.0).segments[0]
    model.set_adapter("agent_1")
    fast = completion_logprobs(model, seg)
    monkeypatch.setattr(forward, "_decoder_and_head", lambda m: None)
    torch.testing.assert_close(completion_logprobs(model, seg), fast, atol=1e-5, rtol=1e-5)


def test_position_ids_count_from_zero_at_the_first_real_token():
    assert position_ids(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2],
                                                                                        [0, 1, 2, 3, 4]]


def test_std_scaling_uses_each_groups_own_std():
    r = np.array([[0.0, 3.0, 15.0], [1.0, 1.0, 4.0]])
    np.testing.assert_allclose(magrpo.advantages(r, scale=True),
                               (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6))


def test_clipping_bounds_the_scaled_advantage():
    a = magrpo.advantages([0.0, 3.0, 15.0], scale=True, clip=1.0)
    np.testing.assert_allclose(a, np.clip(np.array([-6.0, -3.0, 9.0]) / (np.sqrt(42) + 1e-6), -1, 1))


def test_each_agent_samples_with_its_own_seeds(tmp_path):
    trainer, spy = cfgm.spied(tmp_path)
    inner, rows = spy.engine, []

    class Pairs(cfgm.SpyEngine):
        def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
            rows.extend(zip(adapters, row_seeds.tolist()))
            return inner.generate(input_ids, attention_mask, adapters, generation_config, row_seeds)

    trainer.team.engines[0] = Pairs(inner)
    trainer.sample(trainer.batch_items(0))
    assert sorted(rows) == sorted((trainer.team.adapter_of[a], row_seed(trainer.cfg.seed, ("train", 0, p, 0, a), g))
                                  for p in range(2) for a in range(2) for g in range(2))


@pytest.mark.parametrize("overrides, expected", [
    (("num_turns=2", "batch_size=2"), [np.array(cfgm.MEAN) * 2] * 2),  # each node's own children, two items
    (("scale_rewards=true", "advantage_clip=1"), [np.clip(np.array(cfgm.MEAN) / (np.sqrt(42) + 1e-6), -1, 1)] * 2),
])
def test_more_advantage_rows(tmp_path, overrides, expected):
    cfgm.test_advantage_fields(tmp_path, overrides, (), expected)
