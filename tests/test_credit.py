"""Credit assignment without a critic (kit/maths/magrpo.py, issue 31): the marginal advantage, groups over nodes, the
moving role baseline and the team/local reward mix, each against numbers worked out by hand.

Run: python -m pytest tests/test_credit.py      (well under a second: numpy only)
"""

import numpy as np
import pytest

from kit.maths import magrpo
from kit.run.config import load_config, training_diff, to_dict

CROSS = magrpo.joint_actions(2, 3, "cross")  # (a, b) for a, b in 0..2


def additive(f, g):
    """R(a, b) = f[a] + g[b] over the cross joint actions."""
    return [f[a] + g[b] for a, b in CROSS]


def test_marginal_advantage_of_an_additive_reward_ignores_the_partners_samples():
    f = [0.0, 1.0, 5.0]  # agent 0's part: its advantage is f - mean f = [-2, -1, 3]
    for g in ([0.0, 2.0, 4.0], [9.0, 0.0, 0.0], [-3.0, 7.0, 2.0]):
        adv = magrpo.marginal_advantages(additive(f, g), CROSS, 2, 3)
        np.testing.assert_allclose(adv[0], [-2, -1, 3], atol=1e-12)
    np.testing.assert_allclose(adv[1], [-5, 5, 0], atol=1e-12)  # agent 1's: g - mean g, mean [-3, 7, 2] = 2
    # aligned pairs sample k with the partner's sample k: R(k, k) = f + g = [9, 1, 5] with g = [9, 0, 0], and
    # agent 0's advantage R - 5 carries the partner's luck
    aligned = magrpo.advantages(magrpo.per_agent_returns([9.0, 1.0, 5.0], [(0, 0), (1, 1), (2, 2)], 2, 3))
    np.testing.assert_allclose(aligned[0], [4, -4, 0], atol=1e-12)


def test_leniency_judges_a_sample_by_its_partners_best_answer():
    # R(a, b) = V[a] + 2 V[b] + 6 [a = b = 2], V = [0, 1, 5]; agent 0's sample a meets b = 0, 1, 2
    V = [0.0, 1.0, 5.0]
    R = [V[a] + 2 * V[b] + 6 * (a == b == 2) for a, b in CROSS]  # a = 0: 0 2 10, a = 1: 1 3 11, a = 2: 5 7 21
    np.testing.assert_allclose(magrpo.per_agent_returns(R, CROSS, 2, 3), [[4, 5, 11], [2, 4, 14]])  # means
    np.testing.assert_allclose(magrpo.per_agent_returns(R, CROSS, 2, 3, leniency=1.0), [[10, 11, 21], [5, 7, 21]])
    np.testing.assert_allclose(magrpo.per_agent_returns(R, CROSS, 2, 3, leniency=0.5),
                               [[7, 8, 16], [3.5, 5.5, 17.5]])
    np.testing.assert_allclose(magrpo.lenient([[0, 2, 10], [5, 7, 21]], 0.25), [0.75 * 4 + 2.5, 0.75 * 11 + 5.25])
    # an additive reward: the best partner answer is the same for every sample, so leniency changes no advantage
    f, g = [0.0, 1.0, 5.0], [9.0, 0.0, 0.0]
    np.testing.assert_allclose(magrpo.advantages(magrpo.per_agent_returns(additive(f, g), CROSS, 2, 3, 1.0)),
                               magrpo.marginal_advantages(additive(f, g), CROSS, 2, 3), atol=1e-12)


def test_leniency_falls_linearly_to_zero_over_its_decay_steps():
    assert magrpo.leniency_at(0.8, 0, 500) == 0.8  # constant
    assert [magrpo.leniency_at(1.0, 4, s) for s in (0, 1, 2, 4, 9)] == [1.0, 0.75, 0.5, 0.0, 0.0]


def test_marginal_refuses_aligned_joint_actions():
    with pytest.raises(ValueError, match="cross"):
        magrpo.marginal_advantages([1.0, 2.0, 3.0], [(0, 0), (1, 1), (2, 2)], 2, 3)


def test_grouped_advantages_pool_the_baseline_but_marginal_keeps_its_nodes():
    returns = np.array([[[1.0, 3.0]], [[5.0, 7.0]]])  # (2 nodes, 1 agent, G=2)
    np.testing.assert_allclose(magrpo.grouped_advantages(returns, [0, 0]), [[[-3, -1]], [[1, 3]]])  # mean 4
    np.testing.assert_allclose(magrpo.grouped_advantages(returns, [0, 1]), [[[-1, 1]], [[-1, 1]]])  # per node
    np.testing.assert_allclose(magrpo.grouped_advantages(returns, [0, 0], "marginal"), [[[-1, 1]], [[-1, 1]]])
    # scale_rewards=group: the pooled returns [1, 3, 5, 7] have population std sqrt(5)
    scaled = magrpo.grouped_advantages(returns, [0, 0], "marginal", "group", eps=0.0)
    np.testing.assert_allclose(scaled, np.array([[[-1, 1]], [[-1, 1]]]) / np.sqrt(5))


def test_role_baseline_starts_at_the_first_mean_then_moves_by_the_decay():
    used, after = magrpo.role_baseline([np.nan, 2.0], [4.0, 6.0], decay=0.5)
    np.testing.assert_allclose(used, [4.0, 2.0])  # unset: this batch's mean
    np.testing.assert_allclose(after, [4.0, 0.5 * 2 + 0.5 * 6])
    adv = magrpo.role_advantages([[4.0, 5.0], [1.0, 3.0]], used)  # (roles, G) minus each role's baseline
    np.testing.assert_allclose(adv, [[0, 1], [-1, 1]])


def test_team_and_local_rewards_mix_per_agent_and_flow_up_the_tree():
    mixed = magrpo.mix_rewards([1.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], 0.25)  # (J=2, N=2)
    np.testing.assert_allclose(mixed, [[1.0, 0.75], [0.0, 0.25]])
    # a per-agent reward plus the mean of the child's per-agent returns, discounted by 0.5
    np.testing.assert_allclose(magrpo.node_returns([[1.0, 2.0]], [np.array([[2.0, 4.0], [4.0, 8.0]])], 0.5),
                               [[2.5, 5.0]])
    np.testing.assert_allclose(magrpo.per_agent_returns([[1.0, 2.0], [3.0, 4.0]], [(0, 0), (1, 1)], 2, 2),
                               [[1, 3], [2, 4]])  # agent i reads its own column


def test_local_parts_name_what_is_missing():
    assert magrpo.local_parts({"local_0": 1.0, "local_1": 2.0, "tests": 0.5}, 2) == [1.0, 2.0]
    with pytest.raises(ValueError, match="local_1"):
        magrpo.local_parts({"local_0": 1.0}, 2)


@pytest.mark.parametrize("comlrl, kit_name", [("mareinforce", "raw"), ("marloo", "rloo"), ("maremax", "max")])
def test_comlrl_names_are_presets_of_advantage_mode_and_resume_as_the_kits(comlrl, kit_name):
    cfg = load_config("tiny_cpu", overrides=[f"advantage_mode={comlrl}"])
    assert cfg.advantage_mode == kit_name and to_dict(cfg)["advantage_mode"] == kit_name
    assert training_diff({**to_dict(cfg), "advantage_mode": comlrl}, cfg) == []  # a config.json written either way
    np.testing.assert_allclose(magrpo.advantages([[1.0, 3.0]], comlrl), magrpo.advantages([[1.0, 3.0]], kit_name))


@pytest.mark.parametrize("overrides, field", [
    (["advantage_mode=marginal"], "advantage_mode"),  # aligned: no partners' samples to average over
    (["task=game", "advantage_mode=role", "joint_mode=cross"], "advantage_mode"),
    (["task=game", "grouping=turn"], "grouping"),
    (["local_reward_weight=1.5"], "local_reward_weight"),
    (["task=game", "local_reward_weight=0.5"], "local_reward_weight"),
    (["role_baseline_decay=1.0"], "role_baseline_decay"),
    (["leniency=0.5"], "leniency"),  # aligned: one partner answer per sample, its mean is its max
    (["leniency=1.5", "joint_mode=cross"], "leniency"),
    (["leniency=1", "joint_mode=cross", "algorithm=maac"], "leniency"),  # critics do not read it
    (["leniency_decay_steps=-1"], "leniency_decay_steps"),
])
def test_bad_credit_settings_fail_in_validation_naming_the_field(overrides, field):
    from kit.run.config import ConfigError

    with pytest.raises(ConfigError, match=field):
        load_config("tiny_cpu", overrides=overrides)
