"""IAC and MAAC in the loop (kit/trainers/critic.py): every critic field reaches the advantages, the fit or the optimizer,
with numbers worked out by hand; resume is exact with critics; games train with critics, and a game critic's
advantages and fit targets are worked out by hand (its q baseline over every process too, threads as processes).
with numbers worked out by hand; resume is exact with critics; games train with critics. use_separate_critic=false
(value heads on the agents' own adapters): value_loss_coef weighs the value gradient on the actor's adapter, which
one optimizer steps once per iteration; warm-up, resume, games and multi-turn with it.

Run: python -m pytest tests/test_critic.py      (about a minute: a scripted sampler and the tiny model)

The advantage table uses tests/test_config_reaches_maths.py's scripted sampler (sample g is "g"; R = [0, 3, 15]
for the aligned joint actions of G = 3, agent 0's value plus twice agent 1's) and replaces the critics' scores by a
lookup of the text they read, so the numbers are known; the critic model itself is tests/test_heads.py.
"""

import json
import math
import warnings

import numpy as np
import pytest
import torch

from kit.run.config import ConfigError, load_config
from kit.engine.rollout import Rollout
from kit.tasks import from_functions
from kit.trainers.trainer import Trainer
from tests.test_config_reaches_maths import Scripted, joint_reward

QUIET = dict(log=lambda *_: None)
VALUE = [0.0, 1.0, 5.0]


def fake_score(text: str) -> float:
    """What the critics 'predict' here: V(agent 0's prompt "x") = 1, V("y") = 2, V(a second-turn prompt) = 10,
    V(MAAC's joint prompt) = 4; Q(prompt + completion g) = VALUE[g] for agent 0, 2 VALUE[g] for agent 1; the joint
    Q(c0, c1) = VALUE[c0] + 2 VALUE[c1] (= the reward)."""
    if text.startswith("[Agent 0]"):
        lines = text.split("\n")
        if len(lines) == 2:  # v: two prompt blocks
            return 4.0
        return VALUE[int(lines[1])] + 2 * VALUE[int(lines[3])]
    if text.startswith("again"):
        return 10.0
    if len(text) == 1:
        return {"x": 1.0, "y": 2.0}[text]
    return (1.0 if text[0] == "x" else 2.0) * VALUE[int(text[1])]


def trainer_for(tmp_path, *overrides, sampler=None):
    task = from_functions([{"id": "a"}, {"id": "b"}], lambda it: ["x", "y"], joint_reward,
                          feedback_fn=lambda it, comps, reward: [f"again {c}" for c in comps])
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "eval_every=0",
                                              "beta=0", "top_p=1.0", "batch_size=1", "num_generations=3",
                                              "advantage_normalization=false", *overrides])
    trainer = Trainer(cfg, task=task, sampler=sampler or Scripted(), **QUIET)
    trainer.algorithm.values = lambda name, texts: np.array([fake_score(t) for t in texts])
    return trainer


CRITIC_ADVANTAGES = [  # overrides, turn-0 advantages (agents, G)
    (("algorithm=iac",), [[0 - 1, 3 - 1, 15 - 1], [0 - 2, 3 - 2, 15 - 2]]),  # R - V(own prompt)
    (("algorithm=iac", "critic_type=q"), [[-2, -1, 3], [-4, -2, 6]]),  # Q - mean Q: VALUE - 2, 2 VALUE - 4
    (("algorithm=maac",), [[-4, -1, 11]] * 2),  # R - V(joint prompt) = R - 4
    (("algorithm=maac", "critic_type=q"), [[-6, -3, 9]] * 2),  # joint Q = R, minus its mean 6
    # COMA: agent 0 swaps its own sample, agent 1's fixed: VALUE[g] - mean VALUE; agent 1: 2 VALUE[g] - 2 mean VALUE
    (("algorithm=maac", "critic_type=q", "baseline=counterfactual"), [[-2, -1, 3], [-4, -2, 6]]),
    # normalised over the step, each agent: [-1, 2, 14] has mean 5 and std sqrt(42)
    (("algorithm=iac", "advantage_normalization=true"), [np.array([-6, -3, 9]) / math.sqrt(42)] * 2),
    # two turns, children repeat their parent's move (r_1 = r_0), discount 0.5, lam 0.5, V(child) = 10:
    # y_0 = r + 0.5 (0.5 * 10 + 0.5 * r) = 1.25 r + 2.5 = [2.5, 6.25, 21.25]; minus V(x) = 1 and V(y) = 2
    (("algorithm=iac", "num_turns=2", "discount=0.5", "gae_lambda=0.5"), [[1.5, 5.25, 20.25], [0.5, 4.25, 19.25]]),
    # TD(0) (lam 0): y_0 = r + 0.5 * 10 = [5, 8, 20]
    (("algorithm=iac", "num_turns=2", "discount=0.5"), [[4, 7, 19], [3, 6, 18]]),
    # lam 1: the Monte Carlo return r + 0.5 r = [0, 4.5, 22.5]
    (("algorithm=iac", "num_turns=2", "discount=0.5", "gae_lambda=1"), [[-1, 3.5, 21.5], [-2, 2.5, 20.5]]),
]


@pytest.mark.parametrize("overrides, expected", CRITIC_ADVANTAGES, ids=[" ".join(r[0]) for r in CRITIC_ADVANTAGES])
def test_critic_fields_reach_the_advantages(tmp_path, overrides, expected):
    trainer = trainer_for(tmp_path, *overrides)
    levels = trainer.sample(trainer.batch_items(0))
    np.testing.assert_allclose(levels[0].advantages[0], expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("overrides, warns", [
    (("algorithm=iac", "batch_size=1", "advantage_normalization=true"), True),
    (("algorithm=maac", "batch_size=1", "advantage_normalization=true"), True),
    (("algorithm=iac", "batch_size=2", "advantage_normalization=true"), False),  # V differs between the prompts
    (("algorithm=iac", "batch_size=1", "advantage_normalization=false"), False),  # R - V keeps V
    (("algorithm=iac", "batch_size=1", "critic_type=q"), False),  # Q differs between the samples
    (("algorithm=iac", "batch_size=1", "num_turns=2"), False),  # later turns' prompts differ
])
def test_a_v_critic_that_cannot_reach_the_policy_is_named(overrides, warns):
    """The table above: with one prompt a step and normalisation, IAC's advantages are [-6, -3, 9] / sqrt(42) for both
    agents although V(x) = 1 and V(y) = 2 differ; such a config says so when it is loaded."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        load_config("tiny_cpu", overrides=list(overrides))
    assert any("subtracts it away" in str(w.message) for w in seen) == warns


def test_fit_targets_are_the_lambda_returns(tmp_path):
    """What each critic is fitted to: its texts against their lambda-returns (IAC-v: y_0 of the turn-0 prompt is the
    mean over joint actions of [2.5, 6.25, 21.25] = 10; the last turn's prompts 'again g' their reward)."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "num_turns=2", "discount=0.5", "gae_lambda=0.5")
    trainer.sample(trainer.batch_items(0))
    texts, targets, olds = trainer.algorithm.batch["critic_0"]
    assert texts == ["x", "again 0", "again 1", "again 2"]
    np.testing.assert_allclose(targets, [10.0, 0.0, 3.0, 15.0])
    np.testing.assert_allclose(olds, [1.0, 10.0, 10.0, 10.0])


class Varied(Scripted):
    """As Scripted, but a second-turn prompt "again j" gets samples (j + h) mod G, h = 0..G-1: the joint actions of
    a child node differ (its first is the parent's move, its mean over h is the same for every j)."""

    def sample(self, requests, n, params=None, keys=None):
        return Rollout(requests, [[str((int(p[-1]) + h) % n) for h in range(n)] if p.startswith("again")
                                  else [str(g) for g in range(n)] for _, p in requests])


def test_a_lambda_return_averages_the_child_nodes_unequal_joint_actions(tmp_path):
    """Two turns, Varied: child node j's joint actions are worth 3 VALUE[(j + h) % 3], mean 3 * 2 = 6 (its first
    alone would be 3 VALUE[j] = [0, 3, 15]). IAC-v, discount 0.5, lam 0.5, V(child prompt) = 10:
    y_0 = r + 0.5 (0.5 * 10 + 0.5 * 6) = r + 4 = [4, 7, 19]; agent 0's advantage y_0 - V(x) = y_0 - 1."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "num_turns=2", "discount=0.5", "gae_lambda=0.5",
                          sampler=Varied())
    levels = trainer.sample(trainer.batch_items(0))
    np.testing.assert_allclose(levels[1].returns, [[0, 3, 15], [3, 15, 0], [15, 0, 3]])  # the children differ
    np.testing.assert_allclose(levels[0].advantages[0], [[3, 6, 18], [2, 5, 17]])  # minus V(x) = 1, V(y) = 2
    texts, targets, _ = trainer.algorithm.batch["critic_0"]
    assert texts[0] == "x" and targets[0] == pytest.approx(np.mean([4, 7, 19]))  # V's target: the mean y_0


BASE = {"a": 10.0, "b": 40.0}  # item a's and item b's second-turn values


def per_critic(name: str, text: str) -> float:
    """Critic i's score: 0 on a first-turn text; on "again <item> <g>" (v) or that plus a completion h (q),
    BASE[item] + 5 i + (g for v, h for q): every item and every agent's critic says something else."""
    if not text.startswith("again"):
        return 0.0
    _, item, tail = text.split()
    return BASE[item] + 5 * int(name[-1]) + int(tail[-1])


def two_items_two_turns(tmp_path, *overrides, sampler=None):
    """Items a and b on one process, two turns, each item's feedback naming it; critics scored by per_critic."""
    task = from_functions([{"id": "a"}, {"id": "b"}], lambda it: ["x", "y"], joint_reward,
                          feedback_fn=lambda it, comps, reward: [f"again {it['id']} {c}" for c in comps])
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "eval_every=0",
                                              "beta=0", "top_p=1.0", "batch_size=2", "num_generations=3",
                                              "advantage_normalization=false", "num_turns=2", "discount=0.5",
                                              *overrides])
    trainer = Trainer(cfg, task=task, sampler=sampler or Scripted(), **QUIET)
    trainer.algorithm.values = lambda name, texts: np.array([per_critic(name, t) for t in texts])
    return trainer, trainer.sample([{"id": "a"}, {"id": "b"}])


def test_each_items_returns_bootstrap_from_its_own_children_through_each_agents_critic(tmp_path):
    """Issue 41: two items, two turns, IAC-v, TD(0) (discount 0.5): y_0 = r_g + 0.5 V_i("again <item> g"), the
    child of THIS item's joint action g read by agent i's OWN critic: BASE[item] + 5 i + g. R = [0, 3, 15];
    V_i(first-turn prompt) = 0, so the advantage is y_0 itself."""
    _, levels = two_items_two_turns(tmp_path, "algorithm=iac")
    R, g = np.array([0.0, 3.0, 15.0]), np.arange(3)
    expected = [[R + 0.5 * (BASE[item] + 5 * i + g) for i in range(2)] for item in ("a", "b")]
    np.testing.assert_allclose(levels[0].advantages, expected)  # item a agent 0: [5, 8.5, 21]; b agent 1: [22.5...]


def test_a_q_critics_bootstrap_is_the_mean_q_over_the_childs_actions(tmp_path):
    """Issue 41: IAC-q, two items, two turns, TD(0): S_i(child) = the on-policy mean over the child's G actions of
    Q_i. Varied: child j's samples are (j + k) mod 3, so its Q_i are BASE[item] + 5 i + {0, 1, 2}, mean
    BASE[item] + 5 i + 1 (its first action alone: + j). Critic i's turn-0 targets: r_g + 0.5 S_i(child g)."""
    trainer, _ = two_items_two_turns(tmp_path, "algorithm=iac", "critic_type=q", sampler=Varied())
    R = np.array([0.0, 3.0, 15.0])
    for i in range(2):
        texts, targets, _ = trainer.algorithm.batch[f"critic_{i}"]
        assert texts[:6] == [("x" if i == 0 else "y") + str(g) for g in range(3)] * 2  # item a's rows, then b's
        want = np.concatenate([R + 0.5 * (BASE[item] + 5 * i + 1) for item in ("a", "b")])
        np.testing.assert_allclose(targets[:6], want)


def test_the_value_loss_is_one_mean_over_every_micro_batch(tmp_path):
    """Issue 41 (fast; the 2-process test caught this only slowly): IAC-q, G = 3 rows per critic in micro-batches of
    2 and 1. The critic's gradient is that of value_loss_coef * mean over the 3 rows of (Q - y)^2, by autograd on all
    3 at once: each micro-batch is divided by the rows of the whole, never by its own."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "critic_type=q", "micro_batch_size=2", "value_loss_coef=0.6",
                          "max_grad_norm=0")  # the gradient as the loss gives it, unclipped
    alg = trainer.algorithm
    del alg.values  # the real critics
    model = alg.models["critic_0"]
    with torch.no_grad():  # a head off zero, so the gradient reaches the adapter too (dV/dh = w)
        model.head.weight.copy_(torch.linspace(-0.5, 0.5, model.head.weight.shape[1])[None])
    trainer.sample(trainer.batch_items(0))
    texts, targets, _ = alg.batch["critic_0"]
    assert len(texts) == 3 and targets == [0.0, 3.0, 15.0]
    params = model.parameters()
    hand = torch.autograd.grad(0.6 * ((model.score_texts(texts) - torch.tensor(targets)) ** 2).mean(), params)
    seen, real = {}, alg.optimizers["critic_0"].step

    def step(*args, **kwargs):
        seen.setdefault("grads", [p.grad.clone() for p in params])
        return real(*args, **kwargs)

    alg.optimizers["critic_0"].step = step
    with warnings.catch_warnings():  # torch's "optimizer.step() overridden" about the spy above
        warnings.simplefilter("ignore", UserWarning)
        alg.fit(trainer)
    assert max(float(g.abs().max()) for g in hand) > 1e-3
    for got, want in zip(seen["grads"], hand):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("coef", [0.6, 1.0])
def test_value_loss_coef_scales_the_logged_value_loss(tmp_path, coef):
    """The untrained critic (zero head) says 0; MAAC-v's one prompt has the target mean(R) = 6: (0 - 6)^2 = 36
    (CoMLRL's squared error; before issue 41 the kit's carried PPO's 0.5, 18)."""
    trainer = trainer_for(tmp_path, "algorithm=maac", f"value_loss_coef={coef}")
    del trainer.algorithm.values  # the real critic
    trainer.sample(trainer.batch_items(0))
    stats = trainer.algorithm.fit(trainer)
    assert stats["critic/value_loss/critic"] == pytest.approx(coef * 36.0, rel=1e-6)


@pytest.mark.parametrize("lr", [0.01, 0.003])
def test_critic_learning_rate_makes_the_first_adamw_step(tmp_path, lr):
    """The head's bias after AdamW's first step: 0 - lr * g / (|g| + eps) = +lr (V = 0 under the target 6)."""
    trainer = trainer_for(tmp_path, "algorithm=maac", f"critic_learning_rate={lr}", "learning_rate=0.5")
    del trainer.algorithm.values
    trainer.sample(trainer.batch_items(0))
    trainer.algorithm.fit(trainer)
    assert float(trainer.algorithm.models["critic"].head.bias.detach()) == pytest.approx(lr, rel=1e-6)


def test_value_clip_range_reaches_the_value_loss(tmp_path, monkeypatch):
    from kit.maths import actor_critic

    seen = []
    real = actor_critic.value_loss
    monkeypatch.setattr(actor_critic, "value_loss", lambda *a: seen.append(a[3]) or real(*a))
    trainer = trainer_for(tmp_path, "algorithm=maac", "value_clip_range=0.3", "num_iterations=2")
    del trainer.algorithm.values
    trainer.sample(trainer.batch_items(0))
    trainer.algorithm.fit(trainer)
    assert seen == [0.3, 0.3]  # one call per iteration


@pytest.mark.parametrize("separate", ["true", "false"])
def test_critic_warmup_steps_keep_the_actors_still(tmp_path, separate):
    """critic_warmup_steps=1: step 1 fits the critics only (shared heads: the heads alone, the adapters they read
    stay); step 2 moves the actors too (real samples)."""
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'w'}", "progress=false", "eval_every=0",
                                             "save_every=0", "batch_size=1", "num_generations=2", "num_steps=2",
                                             "algorithm=iac", "critic_warmup_steps=1", "log_rollouts=false",
                                             f"use_separate_critic={separate}"])
    trainer = Trainer(cfg, **QUIET)

    def actors():
        return [p.detach().clone() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)]

    before = actors()
    trainer.train(max_steps=1)
    assert all(torch.equal(p, q) for p, q in zip(before, actors()))
    assert float(trainer.algorithm.models["critic_0"].head.bias.detach()) != 0.0  # the critic did fit
    # the actors' LR schedule counts the warm-up step too, so a decay still ends at num_steps
    assert all(trainer.schedulers[a].last_epoch == 1 for a in trainer.team.adapters)
    trainer.train(max_steps=1)
    assert not all(torch.equal(p, q) for p, q in zip(before, actors()))


@pytest.mark.parametrize("overrides, field", [
    (("algorithm=iac", "baseline=counterfactual"), "baseline"),
    (("algorithm=maac", "critic_type=q", "baseline=counterfactual", "joint_mode=cross"), "baseline"),
    (("gae_lambda=1.5",), "gae_lambda"), (("value_loss_coef=0",), "value_loss_coef"),
    (("algorithm=a2c",), "algorithm"), (("critic_type=w",), "critic_type"),
    (("algorithm=maac", "use_separate_critic=false"), "use_separate_critic"),
    (("use_separate_critic=false",), "use_separate_critic"),  # magrpo: no critic to put on the actor
    # combinations whose fields would not reach the maths (the critic replaces the group-relative advantages; the
    # reward model is scored after the task's rewards): refused rather than silently ignored
    (("algorithm=iac", "local_reward_weight=0.5"), "local_reward_weight"),
    (("algorithm=maac", "multi_objective_aggregation=normalize_then_sum"), "multi_objective_aggregation"),
    (("algorithm=iac", "advantage_mode=role"), "advantage_mode"),
    (("algorithm=marlhf", "advantage_mode=role"), "algorithm"),
    (("algorithm=marlhf", "multi_objective_aggregation=normalize_then_sum"), "algorithm"),
    # marlhf_rl_algorithm picks marlhf's RL stage only; with critics, every critic rule holds on the learnt reward
    (("marlhf_rl_algorithm=iac",), "marlhf_rl_algorithm"),
    (("algorithm=maac", "marlhf_rl_algorithm=maac"), "marlhf_rl_algorithm"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=a2c"), "marlhf_rl_algorithm"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=iac", "local_reward_weight=0.5"), "local_reward_weight"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=maac", "advantage_mode=role"), "advantage_mode"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=iac", "critic_type=q", "baseline=counterfactual"), "baseline"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=iac", "use_separate_critic=false"), "use_separate_critic"),
    (("algorithm=iac", "scale_rewards=group"), "scale_rewards"),
    (("algorithm=marlhf", "marlhf_rl_algorithm=maac", "scale_rewards=group"), "scale_rewards"),
])
def test_bad_critic_settings_fail_before_any_model_loads(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config("tiny_cpu", overrides=list(overrides))


def test_marlhf_picks_its_rl_stage_by_marlhf_rl_algorithm():
    """marlhf's RL stage is magrpo unless marlhf_rl_algorithm says iac or maac; the critic rules then read that
    stage (COMA's counterfactual baseline is allowed for maac-q on the learnt reward)."""
    from kit.run.config import rl_algorithm

    assert rl_algorithm(load_config("tiny_cpu", overrides=["algorithm=marlhf"])) == "magrpo"
    cfg = load_config("tiny_cpu", overrides=["algorithm=marlhf", "marlhf_rl_algorithm=maac", "critic_type=q",
                                             "baseline=counterfactual"])
    assert rl_algorithm(cfg) == "maac"
    assert rl_algorithm(load_config("tiny_cpu", overrides=["algorithm=iac"])) == "iac"


def critic_weights(trainer):
    return {name: [p.detach().clone() for p in m.parameters()] for name, m in trainer.algorithm.models.items()}


@pytest.mark.parametrize("algo", [("algorithm=iac", "critic_type=q"),
                                  ("algorithm=iac", "use_separate_critic=false", "num_iterations=2"),
                                  pytest.param(("algorithm=maac",), marks=pytest.mark.slow)],
                         ids=["iac-q", "iac-shared-heads", "maac-v"])
def test_resume_with_critics_is_exact(tmp_path, algo):
    """k steps, stop, resume, k more == 2k straight: bitwise actors, critics (adapters and heads), metrics."""
    common = ["progress=false", "num_steps=4", "save_every=2", "eval_every=0", "batch_size=2", "num_generations=2",
              "log_rollouts=false", *algo]
    straight = Trainer(load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'a'}", *common]), **QUIET)
    straight.train()
    first = Trainer(load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'b'}", *common]), **QUIET)
    first.train(max_steps=2)
    resumed = Trainer(load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'b'}", *common]), resume=True,
                      **QUIET)
    assert resumed.step == 2
    resumed.train()
    for a in straight.team.adapters:
        assert all(torch.equal(p, q) for p, q in zip(straight.team.parameters_of(a), resumed.team.parameters_of(a)))
    wa, wb = critic_weights(straight), critic_weights(resumed)
    assert all(torch.equal(p, q) for name in wa for p, q in zip(wa[name], wb[name]))

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in open(tmp_path / run / "metrics.jsonl")]

    assert rows("a") == rows("b")
    assert any(k.startswith("critic/value_loss/") for k in rows("a")[-1])


@pytest.mark.parametrize("algo, head", [(("algorithm=maac",), "critic"),
                                        (("algorithm=iac", "use_separate_critic=false"), "critic_1")],
                         ids=["maac", "iac-shared-heads"])
def test_a_damaged_critic_head_falls_back_to_the_older_checkpoint(tmp_path, algo, head):
    common = ["progress=false", "num_steps=2", "save_every=1", "eval_every=0", "batch_size=1", "num_generations=2",
              "log_rollouts=false", *algo, f"run_dir={tmp_path / 'r'}"]
    Trainer(load_config("tiny_cpu", overrides=common), **QUIET).train()
    (tmp_path / "r" / "ckpt" / "step_000002" / "models" / head / "head.safetensors").write_bytes(b"x")
    with pytest.warns(UserWarning, match="skipping unreadable checkpoint"):
        resumed = Trainer(load_config("tiny_cpu", overrides=common), resume=True, **QUIET)
    assert resumed.step == 1


@pytest.mark.parametrize("algo", [("algorithm=iac",), ("algorithm=iac", "use_separate_critic=false"),
                                  pytest.param(("algorithm=maac", "critic_type=q", "baseline=counterfactual"),
                                               marks=pytest.mark.slow)],
                         ids=["iac", "iac-shared-heads", "maac-q-cf"])
def test_a_game_trains_with_critics(tmp_path, algo):
    from kit.trainers.game_trainer import GameTrainer

    pytest.importorskip("pyspiel")
    cfg = load_config("tiny_hanabi", overrides=[f"run_dir={tmp_path / 'g'}", "progress=false", "num_steps=2",
                                                "eval_every=0", "save_every=2", "batch_size=2", "num_generations=2",
                                                "gae_lambda=0.5", *algo])
    trainer = GameTrainer(cfg, **QUIET)
    trainer.train()
    row = json.loads(open(tmp_path / "g" / "metrics.jsonl").readlines()[-1])
    assert any(k.startswith("critic/value_loss/") for k in row)
    texts = [t for texts, _, _ in trainer.algorithm.batch.values() for t in texts]
    assert len(texts) == sum(len(r.episodes) for r in trainer.sample(trainer.batch_items(0)))  # one per decision
    if "algorithm=maac" in algo:
        assert all(t.startswith("[Agent 0]") and "[Agent 1]" in t for t in texts)  # both players' observations


def test_the_training_notebook_passes_its_algorithm(tmp_path, monkeypatch):
    from kit import colab

    monkeypatch.setenv("KIT_SMOKE_DIR", str(tmp_path / "smoke"))
    cfg = colab.notebook_config("tiny_cpu", "toy", {}, "r", smoke=True, algorithm="maac", log=lambda *_: None)
    assert cfg.algorithm == "maac"


class _Episode:
    def __init__(self, seed):
        self.seed, self.decisions = seed, []

    @property
    def length(self):
        return len(self.decisions)


class _AlternatingGame:
    """Players 0 and 1 move in turn; the return is 10. An observation names the player and the decision."""

    def reset(self, seed):
        return _Episode(seed)

    def prompt(self, ep, player):
        return f"o{player}t{ep.length}"

    def step(self, ep, text):
        ep.decisions.append({"player": ep.length % 2, "completion": text})

    def score(self, ep):
        return 10.0


def played(moves: list[str]):
    """The task, its episodes (moves[e][t]: episode e's move at decision t, one seed) and their decisions as
    kit.tasks.games.play returns them: one round per decision index over every episode."""
    from kit.tasks.games import Decisions
    from kit.engine.rollout import Rollout

    task = _AlternatingGame()
    episodes = [task.reset(7) for _ in moves]
    rounds = []
    for t in range(len(moves[0])):
        requests = [(t % 2, task.prompt(ep, t % 2)) for ep in episodes]
        rounds.append(Decisions(t, list(range(len(moves))), Rollout(requests, [[m[t]] for m in moves])))
        for ep, m in zip(episodes, moves):
            task.step(ep, m[t])
    return task, episodes, rounds


def game_values(text: str) -> float:
    """V of decision t's observation: 4, 6, 8 (IAC: the actor's own "o{p}t{t}"; MAAC: the joint observation)."""
    t = int(text.split("\n")[0][-1])
    return {0: 4.0, 1: 6.0, 2: 8.0}[t]


def move_values(text: str) -> float:
    """Q of a move (the text's last character), whatever the state."""
    return {"a": 1.0, "b": 2.0, "c": 5.0, "d": 8.0}[text[-1]]


def hand_critic(algo, critic_type="v", discount=1.0, lam=0.0, values=game_values):
    """An ActorCritic without models: the critics' values are the lookup `values`."""
    from types import SimpleNamespace

    from kit.trainers.critic import ActorCritic

    algorithm = ActorCritic.__new__(ActorCritic)
    algorithm.name = algo
    algorithm.models = {n: None for n in (["critic_0", "critic_1"] if algo == "iac" else ["critic"])}
    algorithm.cfg = SimpleNamespace(critic_type=critic_type, num_agents=2, discount=discount, gae_lambda=lam,
                                    advantage_normalization=False, use_chat_template=False)
    algorithm.fmt = lambda prompt: prompt
    algorithm.values = lambda name, texts: np.array([values(t) for t in texts])
    return algorithm


class OneProcess:
    world = 1

    def gather(self, obj):
        return [obj]


def game_step(algorithm, task, episodes, rounds, dist=None):
    from types import SimpleNamespace

    return algorithm.game_advantages(SimpleNamespace(task=task, dist=dist or OneProcess()), rounds, episodes)


@pytest.mark.parametrize("algo, lam, expected", [
    ("iac", 0.0, [10 - 4, 10 - 6]),  # each player's own sequence: one decision, then the end (return 10)
    ("maac", 0.0, [0 + 6 - 4, 10 - 6]),  # TD(0) over both decisions: V(s_1) - V(s_0), then R - V(s_1)
    ("maac", 1.0, [10 - 4, 10 - 6]),  # Monte Carlo
    ("maac", 0.5, [2 + 0.5 * 4, 4]),  # GAE: delta_0 + lam * delta_1
])
def test_game_advantages_by_hand(algo, lam, expected):
    algorithm = hand_critic(algo, lam=lam)
    adv = game_step(algorithm, *played([["m0", "m1"]]))
    np.testing.assert_allclose(adv, expected)
    texts, targets, _ = algorithm.batch["critic" if algo == "maac" else "critic_0"]
    if algo == "maac":
        assert texts == ["[Agent 0] o0t0\n[Agent 1] o1t0", "[Agent 0] o0t1\n[Agent 1] o1t1"]  # both observations


@pytest.mark.parametrize("algo, expected", [
    # each player's own decisions: player 0 acts at t0 and t2 (V 4, 8), player 1 at t1 (V 6); the return 10 at a
    # player's last decision. y(t0) = 0.9 (0.5 V(t2) + 0.5 y(t2)) = 0.9 (4 + 5) = 8.1
    ("iac", {"critic_0": (["o0t0", "o0t2"], [8.1, 10.0], [4.0, 8.0]), "critic_1": (["o1t1"], [10.0], [6.0])}),
    # one sequence t0, t1, t2 (V 4, 6, 8): y2 = 10, y1 = 0.9 (0.5 * 8 + 0.5 * 10) = 8.1,
    # y0 = 0.9 (0.5 * 6 + 0.5 * 8.1) = 6.345
    ("maac", {"critic": (None, [6.345, 8.1, 10.0], [4.0, 6.0, 8.0])}),
])
def test_game_critic_fit_targets_are_the_lambda_returns_by_hand(algo, expected):
    """What a game's critic is fitted to (discount 0.9, lam 0.5, three decisions): each decision's text against
    its lambda-return (= GAE advantage + V), the values it had when scored as the clip's reference."""
    algorithm = hand_critic(algo, discount=0.9, lam=0.5)
    game_step(algorithm, *played([["a", "b", "c"]]))
    assert set(algorithm.batch) == set(expected)
    for name, (texts, targets, olds) in expected.items():
        got_texts, got_targets, got_olds = algorithm.batch[name]
        if texts is not None:
            assert got_texts == texts  # v: the actor's observation
        np.testing.assert_allclose(got_targets, targets, rtol=1e-12)
        np.testing.assert_allclose(got_olds, olds)


@pytest.mark.parametrize("algo", ["iac", "maac"])
def test_game_q_baseline_is_over_every_process(algo):
    """q: Q minus the mean Q of the step's decisions that saw the same state, whichever process played them. Two
    episodes reach the same states with moves a, b (Q 1, 2) and c, d (Q 5, 8): one process gives a: 1 - 3,
    b: 2 - 5, c: 5 - 3, d: 8 - 5; two processes (an episode each) must give the same, not 0 everywhere."""
    from tests.test_distributed import ThreadsOfOneRun

    moves = [["a", "b"], ["c", "d"]]
    one = game_step(hand_critic(algo, "q", values=move_values), *played(moves))
    np.testing.assert_allclose(one, [-2, 2, -3, 3])  # rounds in order, episodes within a round
    threads = ThreadsOfOneRun(2)
    two = threads.run(lambda r: game_step(hand_critic(algo, "q", values=move_values), *played([moves[r]]),
                                          dist=threads.rank(r)))
    np.testing.assert_allclose([two[0][0], two[1][0], two[0][1], two[1][1]], one)
# ---- use_separate_critic=false: a value head on each agent's own adapter

HEADS_ON = {"agent_0": ["critic_0"], "agent_1": ["critic_1"], "shared": ["critic_0", "critic_1"]}


def value_gradient(trainer, adapter):
    """d/d(adapter) of the mean over the rows of every head on it of (V - y)^2 (CoMLRL's value loss, no 0.5), by
    autograd from its definition."""
    alg, params = trainer.algorithm, trainer.team.parameters_of(adapter)
    rows = []
    for name in HEADS_ON[adapter]:
        texts, targets, _ = alg.batch[name]
        rows.append((alg.models[name].score_texts(texts) - torch.tensor(targets)) ** 2)
    return torch.autograd.grad(torch.cat(rows).mean(), params)


@pytest.mark.parametrize("coef, share", [(0.6, "false"), (1.5, "false"), (0.6, "true")])
def test_value_loss_coef_weighs_the_value_gradient_on_the_actors_adapter(tmp_path, coef, share):
    """The update adds value_loss_coef * grad(value loss) to the policy gradient of the adapter the head reads,
    before the adapter's one optimizer step: what backward_into_actor adds is exactly coef * the value gradient
    (IAC-v, one turn: each head reads its agent's prompt, target mean R = 6; share_adapter: both heads' rows)."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "use_separate_critic=false", f"value_loss_coef={coef}",
                          f"share_adapter={share}")
    alg = trainer.algorithm
    for name, model in alg.models.items():  # a head off zero, or no gradient reaches the adapter (dV/dh = w)
        with torch.no_grad():
            model.head.weight.copy_(torch.linspace(-0.5, 0.5, model.head.weight.shape[1])[None])
            model.head.bias.fill_(0.3)
    levels = trainer.sample(trainer.batch_items(0))
    assert alg.batch["critic_0"][1] == [6.0] and alg.batch["critic_1"][1] == [6.0]
    expected = {a: value_gradient(trainer, a) for a in trainer.team.adapters}
    assert all(any(g.abs().sum() > 0 for g in expected[a]) for a in expected)
    added, scale, hook = {}, {}, alg.backward_into_actor

    def grads(adapter):
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in trainer.team.parameters_of(adapter)]

    def spy(tr, adapter, iteration):
        before = grads(adapter)  # the policy loss's, already backpropagated
        hook(tr, adapter, iteration)
        after = grads(adapter)
        added[adapter] = [g - b for g, b in zip(after, before)]
        scale[adapter] = max(float(g.abs().max()) for g in after)

    alg.backward_into_actor = spy
    trainer.update(levels)
    assert set(added) == set(trainer.team.adapters)
    for a in added:
        assert max(float(g.abs().max()) for g in expected[a]) > 1.0  # far above the tolerance below
        # (policy + value) - policy in float32 is exact only to a few float32 ulps of the summed gradient: the
        # absolute tolerance scales with it (the order of a sum's terms, and so its rounding, varies with threads)
        atol = max(1e-5, 8 * torch.finfo(torch.float32).eps * scale[a])
        for got, want in zip(added[a], expected[a]):
            torch.testing.assert_close(got, coef * want, rtol=1e-4, atol=atol)


def test_shared_heads_step_once_per_iteration_and_no_parameter_has_two_optimizers(tmp_path):
    """num_iterations=2: the actors' and the heads' AdamW each take 2 steps (fit adds none); every parameter is in
    one optimizer; no adapter was added. The untrained heads say 0 under the target 6: 0.6 * 36 = 21.6 (CoMLRL's
    squared error, no 0.5)."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "use_separate_critic=false", "num_iterations=2")
    alg = trainer.algorithm
    assert set(trainer.team.models[0].peft_config) == {"agent_0", "agent_1"}
    held = [id(p) for opt in trainer.all_optimizers()[0].values() for g in opt.param_groups for p in g["params"]]
    assert len(held) == len(set(held))
    assert [id(p) for p in alg.optimizers["critic_0"].param_groups[0]["params"]] == \
        [id(alg.models["critic_0"].head.weight), id(alg.models["critic_0"].head.bias)]
    stats = trainer.update(trainer.sample(trainer.batch_items(0)))
    stats.update(alg.fit(trainer))
    for name in [*trainer.team.adapters, *alg.models]:
        opt = trainer.all_optimizers()[0][name]
        assert {float(st["step"]) for st in opt.state.values()} == {2.0}, name
    assert stats["critic/value_loss/critic_0"] == pytest.approx(0.6 * 36.0, rel=1e-6)
    assert stats["critic/value_loss/critic_1"] == pytest.approx(0.6 * 36.0, rel=1e-6)


@pytest.mark.parametrize("lr", [0.01, 0.003])
def test_critic_learning_rate_steps_the_shared_heads(tmp_path, lr):
    """The head's bias after AdamW's first step: +lr (V = 0 under the target 6), whatever the actors' rate."""
    trainer = trainer_for(tmp_path, "algorithm=iac", "use_separate_critic=false", f"critic_learning_rate={lr}",
                          "learning_rate=0.5")
    trainer.update(trainer.sample(trainer.batch_items(0)))
    for name in ("critic_0", "critic_1"):
        assert float(trainer.algorithm.models[name].head.bias.detach()) == pytest.approx(lr, rel=1e-6)


@pytest.mark.parametrize("extra", [(), ("num_turns=2", "gae_lambda=0.5"), ("share_adapter=true", "critic_type=q")],
                         ids=["one-turn", "two-turns", "shared-adapter-q"])
def test_iac_with_heads_on_the_actors_trains(tmp_path, extra):
    """The tiny toy, real samples: the adapters and the heads move, the critics' metrics are logged and finite."""
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 's'}", "progress=false", "eval_every=0",
                                             "save_every=0", "batch_size=2", "num_generations=2", "num_steps=2",
                                             "log_rollouts=false", "algorithm=iac", "use_separate_critic=false",
                                             *extra])
    trainer = Trainer(cfg, **QUIET)
    before = [p.detach().clone() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)]
    trainer.train()
    after = [p.detach() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)]
    assert not all(torch.equal(p, q) for p, q in zip(before, after))
    assert all(float(m.head.bias.detach()) != 0.0 for m in trainer.algorithm.models.values())
    row = json.loads(open(tmp_path / "s" / "metrics.jsonl").readlines()[-1])
    for name in ("critic_0", "critic_1"):
        assert math.isfinite(row[f"critic/value_loss/{name}"]) and math.isfinite(row[f"critic/grad_norm/{name}"])
