"""The MAGRPO maths against hand-computed values. Run: python -m pytest tests/test_magrpo.py"""

import numpy as np
import pytest
import torch

from kit.maths import losses, magrpo


def test_aligned_joint_actions_pair_the_gth_completions():
    assert magrpo.joint_actions(2, 3, "aligned") == [(0, 0), (1, 1), (2, 2)]


def test_cross_joint_actions_are_the_cartesian_product():
    assert magrpo.joint_actions(2, 2, "cross") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(magrpo.joint_actions(3, 4, "cross")) == 64


def test_unknown_joint_mode_is_named():
    with pytest.raises(ValueError, match="joint_mode='pairs'"):
        magrpo.joint_actions(2, 2, "pairs")


def test_cross_per_agent_return_is_the_mean_over_partners():
    joints = magrpo.joint_actions(2, 2, "cross")  # (0,0) (0,1) (1,0) (1,1)
    r = magrpo.per_agent_returns([1.0, 3.0, 5.0, 7.0], joints, 2, 2)
    # agent 0, completion 0 is in (0,0),(0,1): (1+3)/2; completion 1: (5+7)/2
    # agent 1, completion 0 is in (0,0),(1,0): (1+5)/2; completion 1: (3+7)/2
    np.testing.assert_allclose(r, [[2.0, 6.0], [3.0, 5.0]])


def test_aligned_per_agent_return_is_the_joint_return():
    joints = magrpo.joint_actions(2, 3, "aligned")
    np.testing.assert_allclose(magrpo.per_agent_returns([1, 2, 3], joints, 2, 3), [[1, 2, 3], [1, 2, 3]])


def test_mean_advantage_is_return_minus_group_mean():
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0, 3.0, 6.0]), [-2.0, -1.0, 0.0, 3.0])


def test_rloo_advantage_leaves_one_out():
    # 1 - (2+3+6)/3 = -8/3 ; 2 - 10/3 = -4/3 ; 3 - 3 = 0 ; 6 - 2 = 4
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0, 3.0, 6.0], "rloo"), [-8 / 3, -4 / 3, 0.0, 4.0])


def test_none_advantage_is_the_return():
    np.testing.assert_allclose(magrpo.advantages([1.0, 2.0], "none"), [1.0, 2.0])


def test_std_scaling_divides_by_population_std():
    # returns [1, 5]: mean 3, population std 2 (not 1, where skipping the division would go unseen) -> [-1, 1]
    np.testing.assert_allclose(magrpo.advantages([1.0, 5.0], scale=True, eps=0.0), [-1.0, 1.0])


def test_clipping_bounds_advantages():
    np.testing.assert_allclose(magrpo.advantages([0.0, 10.0], clip=2.0), [-2.0, 2.0])


def test_advantages_are_per_group_on_the_last_axis():
    a = magrpo.advantages([[0.0, 2.0], [10.0, 20.0]])
    np.testing.assert_allclose(a, [[-1.0, 1.0], [-5.0, 5.0]])


def test_leaf_returns_are_the_rewards():
    np.testing.assert_allclose(magrpo.node_returns([0.5, 1.0]), [0.5, 1.0])


def test_multi_turn_return_adds_the_mean_of_the_children():
    # joint 0 led to a child whose returns are [1, 3] (mean 2); joint 1 to [0, 0]
    np.testing.assert_allclose(magrpo.node_returns([0.5, 1.0], [[1.0, 3.0], [0.0, 0.0]]), [2.5, 1.0])


def test_discount_weights_the_future():
    np.testing.assert_allclose(magrpo.node_returns([1.0], [[2.0, 4.0]], discount=0.5), [2.5])


def test_token_logprobs_match_log_softmax():
    logits = torch.tensor([[[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]])
    targets = torch.tensor([[2, 0]])
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(losses.token_logprobs(logits, targets), expected)


def test_sum_loss_on_a_hand_made_batch():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # row 0's third token is padding
    adv = torch.tensor([2.0, -1.0])
    # row sums: -3 and -1.5 ; loss = -mean(2*-3, -1*-1.5) = -mean(-6, 1.5) = 2.25
    loss, _ = losses.policy_loss(logp, mask, adv, "sum")
    assert float(loss) == pytest.approx(2.25)


def test_token_mean_loss_on_a_hand_made_batch():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    # -(2*(-1-2) + -1*(-1.5)) / 5 tokens = -(-6 + 1.5)/5 = 0.9
    loss, _ = losses.policy_loss(logp, mask, adv, "token_mean")
    assert float(loss) == pytest.approx(0.9)


def test_padding_never_enters_the_loss_or_its_gradient():
    logp = torch.tensor([[-1.0, -2.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, _ = losses.policy_loss(logp, mask, torch.tensor([1.0]))
    loss.backward()
    assert logp.grad[0, 2] == 0 and logp.grad[0, 0] != 0


def test_kl_is_zero_when_policy_equals_reference_and_positive_otherwise():
    logp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    _, same = losses.policy_loss(logp, mask, torch.zeros(1), beta=0.1, ref_logp=logp.clone())
    _, diff = losses.policy_loss(logp, mask, torch.zeros(1), beta=0.1, ref_logp=logp - 0.5)
    assert same["kl"] == pytest.approx(0.0)
    # k3 per token: exp(-0.5) + 0.5 - 1 ; two tokens summed
    assert diff["kl"] == pytest.approx(2 * (np.exp(-0.5) + 0.5 - 1))


def test_token_mean_kl_is_per_completion_token_like_its_loss():
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    _, stats = losses.policy_loss(logp, mask, torch.zeros(2), "token_mean", ref_logp=logp - 0.5, beta=0.1)
    # k3 = exp(-0.5) + 0.5 - 1 on each of the 5 completion tokens, averaged over tokens (not summed per row)
    assert stats["kl"] == pytest.approx(np.exp(-0.5) + 0.5 - 1)


def test_head_logprobs_equal_token_logprobs_in_value_and_gradient():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 5), generator=g)
    upstream = torch.randn(3, 5, generator=g, dtype=torch.float64)
    ref = losses.token_logprobs(hidden @ weight.t(), targets).double()
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), hidden)
    out = losses.head_logprobs(hidden, weight, targets, chunk=4)  # chunks that cut rows in the middle
    (grad,) = torch.autograd.grad((out.double() * upstream).sum(), hidden)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)  # fp32 output
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-6)


def test_head_logprobs_blocks_hold_at_most_head_block_logits(monkeypatch):
    """A 152k vocabulary's (chunk, V) blocks are bounded by elements, not by a fixed 1024 positions (an fp32 block
    of 1024 x 151,936 is 622 MB, and two are alive at a time): the positions per block follow HEAD_BLOCK // V."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 7, 8, generator=g, requires_grad=True)
    weight = torch.randn(11, 8, generator=g)
    targets = torch.randint(0, 11, (2, 7), generator=g)
    rows = []
    real = losses._logits
    monkeypatch.setattr(losses, "_logits", lambda h, w, t: rows.append(h.shape[0]) or real(h, w, t))
    monkeypatch.setattr(losses, "HEAD_BLOCK", 3 * 11 + 5)  # room for 3 positions of 11 logits
    out = losses.head_logprobs(hidden, weight, targets)
    out.sum().backward()
    assert rows == [3, 3, 3, 3, 2] * 2  # 14 positions in blocks of 3, forward then backward
    torch.testing.assert_close(out, losses.token_logprobs(hidden @ weight.t(), targets))
    rows.clear()
    monkeypatch.setattr(losses, "HEAD_BLOCK", 10 ** 9)
    losses.head_logprobs(torch.randn(1, 1500, 8), weight, torch.zeros(1, 1500, dtype=torch.long))
    assert rows == [1024, 476]  # never more than 1024 positions


def test_a_forward_first_hands_back_what_the_last_one_freed(monkeypatch):
    """completion_logprobs calls kit.env.release_freed_memory before it forwards (micro-batches of long rows on a
    CPU otherwise leave glibc's heap gigabytes above the live tensors), and that call is a no-op without glibc."""
    import kit.engine.forward as forward
    import kit.env as env
    from kit.engine.rollout import Segment

    calls = []

    class Model(torch.nn.Module):
        def forward(self, input_ids, **kw):
            calls.append("forward")
            return type("Out", (), {"logits": torch.zeros(len(input_ids), kw["logits_to_keep"], 5)})()

    monkeypatch.setattr(forward, "release_freed_memory", lambda: calls.append("release"))
    ids = torch.ones(1, 4, dtype=torch.long)
    seg = Segment(0, ids, torch.ones_like(ids), torch.ones(1, 2), 2, torch.zeros(1, dtype=torch.long),
                  torch.zeros(1, dtype=torch.long), torch.zeros(1, 2), torch.ones(1, dtype=torch.bool))
    forward.completion_logprobs(Model(), seg)
    assert calls == ["release", "forward"]
    env.release_freed_memory()  # the real call (glibc here, or none)
    import ctypes

    class Musl:  # dlopen("libc.so.6") on musl gives its own libc, which has no malloc_trim
        pass

    def no_library(name):  # macOS, Windows
        raise OSError(f"{name}: cannot open shared object file")

    for cdll in (no_library, lambda name: Musl()):
        env._malloc_trim.cache_clear()
        monkeypatch.setattr(ctypes, "CDLL", cdll)
        assert env._malloc_trim() is None
        env.release_freed_memory()  # a no-op, not an error
    monkeypatch.undo()
    env._malloc_trim.cache_clear()  # the cached None must not outlive the test
