"""Every config field that changes training reaches the maths: set the field, and the advantages, the loss, the
optimizer step, the learning rate or the sample seeds are what a hand computation says.

Run: python -m pytest tests/test_config_reaches_maths.py      (a few seconds: a scripted sampler, or one update
of the tiny model)

One table per stage, one row per field (or per pair of fields that act together):
    advantages   scale_rewards, advantage_mode, advantage_clip, reward_processor, reward_weights, joint_mode,
                 num_turns with discount, batch_size and num_generations, multi_objective_aggregation
    loss         loss_type, beta (and its reference: the model with the adapter off), temperature (the update
                 scores at it), rollout_correction with rollout_is_cap, num_iterations (the clipped form),
                 mask_truncated_completions; issue 33: importance_sampling_level, delta, loss_type cispo and sapo
                 with sapo_temperature_pos/_neg, use_bias_correction_kl, top_entropy_quantile, entropy_coef,
                 off_policy_mask_threshold
    optimizer    learning_rate, weight_decay, max_grad_norm
    schedule     lr_scheduler, warmup_steps, num_steps (tests/test_trainer.py: the trainer applies and logs it)
    sampling     seed (the row seeds, each step's global RNGs), temperature, top_p, top_k, max_new_tokens;
                 top-k before top-p
    adapters     lora_r, lora_alpha
Elsewhere: micro_batch_size and share_adapter (tests/test_trainer.py), the game trainer's groups per deal
(tests/test_games.py), the algorithm and critic fields of issue 31 (algorithm, critic_type, baseline,
value_loss_coef, value_clip_range, advantage_normalization, critic_learning_rate, critic_warmup_steps, gae_lambda,
use_separate_critic: tests/test_critic.py, by hand). The fields that pick the model, its precision, the task or the prompt text (model_name,
quantization, dtype, task, use_chat_template, ...) change the numbers that go in, not the formulas checked here.
"""

import math

import numpy as np
import pytest
import torch

from kit.run.checkpoint import seed_everything, step_seed
from kit.run.config import load_config
from kit.engine.models import build_team
from kit.engine.rollout import Rollout, engine_for
from kit.engine.forward import completion_logprobs
from kit.engine.sampling import SeededSampling, row_seed
from kit.tasks import from_functions
from kit.trainers.trainer import Trainer, lr_schedule

QUIET = dict(log=lambda *_: None)


def config(tmp_path, *overrides):
    """tiny_cpu with the paper's plain update, then `overrides`: beta 0 and top_p 1 (no correction), since the
    preset's KL term and top-p correction are tested on their own."""
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "eval_every=0",
                                              "beta=0", "top_p=1.0", *overrides])


# ---- advantages: a scripted sampler, rewards known by hand

VALUE = [0.0, 1.0, 5.0, 2.0]  # what completion "g" is worth


def joint_reward(item, completions) -> float:
    """Agent 0's value plus twice agent 1's, so cross mode tells the agents apart. Aligned, G=3: R = [0, 3, 15]."""
    return VALUE[int(completions[0][-1])] + 2 * VALUE[int(completions[1][-1])]


def bonus(item, completions) -> float:
    return float(completions[0] == "2")


class Scripted:
    """Sample g of every request is "g"; a second-turn prompt "again g" is answered "g" by every sample, so a child
    node's returns all equal its parent joint action's reward."""

    def sample(self, requests, n, params=None, keys=None):
        return Rollout(requests, [[p[-1]] * n if p.startswith("again") else [str(g) for g in range(n)]
                                  for _, p in requests])


def levels_of(tmp_path, overrides, reward_funcs=()):
    task = from_functions([{"id": "a"}, {"id": "b"}], lambda it: ["x", "y"], joint_reward,
                          feedback_fn=lambda it, comps, reward: [f"again {c}" for c in comps])
    cfg = config(tmp_path, "batch_size=1", "num_generations=3", *overrides)
    trainer = Trainer(cfg, task=task, sampler=Scripted(), reward_funcs=list(reward_funcs), **QUIET)
    return trainer.sample(trainer.batch_items(0))


MEAN = [-6.0, -3.0, 9.0]  # R = [0, 3, 15] minus its mean 6 (paper Eq. 1)
ADVANTAGES = [  # overrides, reward functions, turn-0 advantages of each item: (agents, G)
    ((), (), [MEAN, MEAN]),
    (("scale_rewards=true",), (), [np.array(MEAN) / (math.sqrt(42) + 1e-6)] * 2),  # population std sqrt(42)
    (("advantage_mode=rloo",), (), [[0 - 9, 3 - 7.5, 15 - 1.5]] * 2),  # R minus the mean of the others
    (("advantage_mode=none",), (), [[0, 3, 15]] * 2),
    (("advantage_mode=raw",), (), [[0, 3, 15]] * 2),  # MAREINFORCE
    (("advantage_mode=max",), (), [[0 - 15, 3 - 15, 15 - 15]] * 2),  # MAReMax: R minus the group's best
    (("scale_rewards=group",), (), [np.array(MEAN) / (math.sqrt(42) + 1e-6)] * 2),
    # cross: per-agent returns [4, 5, 9] and [2, 4, 12] (below); batch: one std over all six, sqrt(70 / 6)
    (("scale_rewards=batch", "joint_mode=cross"), (), np.array([[-2, -1, 3], [-4, -2, 6]]) / (math.sqrt(70 / 6) + 1e-6)),
    (("scale_rewards=group", "joint_mode=cross"), (), [np.array([-2, -1, 3]) / (math.sqrt(14 / 3) + 1e-6),
                                                       np.array([-4, -2, 6]) / (math.sqrt(56 / 3) + 1e-6)]),
    (("advantage_clip=4",), (), [[-4, -3, 4]] * 2),
    (("reward_processor=scale(0.5)",), (), [[-3, -1.5, 4.5]] * 2),
    (("reward_weights=[1.0, 0.5]",), (bonus,), [[-6 - 1 / 6, -3 - 1 / 6, 9 + 1 / 3]] * 2),  # R = [0, 3, 15.5]
    # cross: completion a of agent 0 is worth V[a] + 2 * mean(V) over its partners, b of agent 1 2 V[b] + mean(V)
    (("joint_mode=cross",), (), [[-2, -1, 3], [-4, -2, 6]]),
    # two turns: each child repeats its parent's move, so R_0 = r + discount * r
    (("num_turns=2",), (), [np.array(MEAN) * 2] * 2),
    (("num_turns=2", "discount=0.5"), (), [np.array(MEAN) * 1.5] * 2),
    (("num_turns=2", "discount=0"), (), [MEAN, MEAN]),
    (("batch_size=2", "num_generations=4"), (), [[-6, -3, 9, 0]] * 2),  # R = [0, 3, 15, 6], per item
]


@pytest.mark.parametrize("overrides, reward_funcs, expected", ADVANTAGES, ids=[" ".join(r[0]) or "default"
                                                                                for r in ADVANTAGES])
def test_advantage_fields(tmp_path, overrides, reward_funcs, expected):
    advantages = levels_of(tmp_path, overrides, reward_funcs)[0].advantages  # (items, agents, G)
    assert advantages.shape[1:] == np.shape(expected)
    for item in advantages:
        np.testing.assert_allclose(item, expected, rtol=1e-9, atol=1e-12)


# ---- loss: one update of the tiny model on fixed advantages

def sampled(tmp_path, *overrides):
    """A trainer whose adapters differ from the base (so the KL is not 0), one step of real samples, and fixed
    advantages."""
    trainer = Trainer(config(tmp_path, "batch_size=2", "num_generations=2", "max_new_tokens=3", *overrides),
                      **QUIET)
    gen = torch.Generator().manual_seed(0)
    for name, p in trainer.team.models[0].named_parameters():
        if "lora_B" in name:  # zero at init: the adapter would be the identity
            p.data.normal_(0.0, 0.05, generator=gen)
    seed_everything(0)
    levels = trainer.sample(trainer.batch_items(0))
    shape = levels[0].advantages.shape  # (items, agents, G)
    levels[0].advantages = np.linspace(-1.0, 2.0, int(np.prod(shape))).reshape(shape)
    return trainer, levels


def model_logprobs(model, seg, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) of the completion tokens, from the model's own full logits; (R, T)."""
    T = seg.completion_mask.shape[1]
    positions = (seg.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seg.input_ids, attention_mask=seg.attention_mask, position_ids=positions).logits
    logits = logits[:, -T - 1:-1].double() / temperature  # position t predicts completion token t
    return torch.log_softmax(logits, -1).gather(-1, seg.input_ids[:, -T:, None])[..., 0]


# The kit's float32 loss against a float64 sum by hand: ~5 digits agree. How many depends on the CPU's kernels (the
# matmul's blocking, exp's rounding; k3 = exp(d) - d - 1 at d ~ 0.1 loses two digits): 1e-5 held on the CPU these
# tests were written on and failed on CI's. A field that does not reach the loss moves it by far more than 1e-4.
F32 = 1e-4


def hand_loss(trainer, level, adapter: str, loss_type: str, beta: float, *, temperature: float = 1.0,
              weights=None, clipped_form: bool = False, masked_truncated: bool = False) -> tuple[float, float]:
    """(loss, KL) of one adapter's rows from Eq. 2 (or its variants) and k3 = exp(ref - logp) - (ref - logp) - 1, by
    hand. weights: a function of the rows giving the rollout correction's (R, T) weights; clipped_form: the
    clipped-ratio loss at ratio 1 (its value is -A * 1 per token)."""
    agents = trainer.team.agents_of_adapter(adapter)
    model = trainer.team.model_of(agents[0])
    model.set_adapter(adapter)
    seg = level.rollout.segment(0).rows(agents)
    adv = torch.tensor(level.advantages.reshape(-1)[seg.sample.numpy()], dtype=torch.float64)[:, None]  # (R, 1)
    with torch.no_grad():
        logp = model_logprobs(model, seg, temperature)
        with model.disable_adapter():
            ref = model_logprobs(model, seg, temperature)  # the base model
    mask = seg.completion_mask.double()
    if masked_truncated:
        mask = mask * seg.finished[:, None].double()
    term = -adv * (torch.ones_like(logp) if clipped_form else logp)
    if weights is not None:
        term = term * weights(seg, logp)
    k3 = (torch.exp(ref - logp) - (ref - logp) - 1) * mask
    R, max_tokens = mask.shape[0], trainer.cfg.max_new_tokens

    def reduce(x):
        if loss_type == "sum":
            return (x * mask).sum(-1).mean()
        if loss_type == "grpo":
            return ((x * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        if loss_type == "dr_grpo":
            return (x * mask).sum() / (R * max_tokens)
        return (x * mask).sum() / mask.sum()  # token_mean, dapo, bnpo

    pg, kl = reduce(term), reduce(k3)
    return float(pg + beta * kl), float(kl)


@pytest.mark.parametrize("loss_type, beta", [("sum", 0.0), ("token_mean", 0.0), ("sum", 0.5), ("token_mean", 0.5),
                                             ("grpo", 0.0), ("grpo", 0.5), ("dr_grpo", 0.0), ("dapo", 0.0),
                                             ("bnpo", 0.5)])
def test_loss_fields(tmp_path, loss_type, beta):
    trainer, levels = sampled(tmp_path, f"loss_type={loss_type}", f"beta={beta}")
    hand = {a: hand_loss(trainer, levels[0], a, loss_type, beta) for a in trainer.team.adapters}
    stats = trainer.update(levels)
    for adapter, (loss, kl) in hand.items():
        assert stats[f"loss/{adapter}"] == pytest.approx(loss, rel=F32), adapter
        if beta > 0:
            assert kl > 1e-4 and stats[f"kl/{adapter}"] == pytest.approx(kl, rel=1e-4), adapter


def shift_sampler(levels, by: float) -> None:
    """Make the sampler's log-probs `by` lower than they were, so each token's ratio to the trainer is exp(by)."""
    for level in levels:
        for seg in level.rollout.segments:
            seg.sampler_logprobs -= by * seg.completion_mask


SHIFT = 0.3  # rho = exp(0.3) = 1.35 per token
CORRECTIONS = [  # overrides, the weights by hand (of the rows and the trainer's log-probs)
    (("rollout_correction=none",), None),
    (("rollout_correction=token_truncate", "rollout_is_cap=1.2"), lambda seg, logp: torch.full_like(logp, 1.2)),
    (("rollout_correction=token_truncate", "rollout_is_cap=2"), lambda seg, logp: torch.full_like(logp, math.exp(SHIFT))),
    (("rollout_correction=sequence_mask", "rollout_is_cap=2"),  # rho_seq = the geometric mean of the ratios
     lambda seg, logp: torch.full_like(logp, math.exp(SHIFT))),
    (("rollout_correction=sequence_mask", "rollout_is_cap=1.2"), lambda seg, logp: torch.zeros_like(logp)),
]


@pytest.mark.parametrize("overrides, weights", CORRECTIONS, ids=[" ".join(r[0]) for r in CORRECTIONS])
def test_rollout_correction_fields(tmp_path, overrides, weights):
    """With the KL term on (as tiny_cpu has it): the weights multiply the policy-gradient term only (as TRL)."""
    trainer, levels = sampled(tmp_path, *overrides, "beta=0.5")
    shift_sampler(levels, SHIFT)
    hand = {a: hand_loss(trainer, levels[0], a, "sum", 0.5, weights=weights) for a in trainer.team.adapters}
    stats = trainer.update(levels)
    past = 1.0 if math.exp(SHIFT) > trainer.cfg.rollout_is_cap else 0.0  # every token and row, or none
    for adapter, (loss, kl) in hand.items():
        # with the cap at 1.2 under sequence_mask every weight is 0: the loss is beta * k3 alone (see F32)
        assert kl > 1e-4 and stats[f"loss/{adapter}"] == pytest.approx(loss, rel=F32, abs=1e-9), adapter
        assert stats[f"mismatch/ratio_mean/{adapter}"] == pytest.approx(math.exp(SHIFT), rel=1e-4)
        assert stats[f"mismatch/past_cap/{adapter}"] == stats[f"mismatch/rows_past_cap/{adapter}"] == past
        assert stats[f"mismatch/kl/{adapter}"] == pytest.approx(math.exp(SHIFT) - SHIFT - 1, rel=1e-3)


@pytest.mark.parametrize("overrides, kwargs", [
    (("temperature=0.5",), dict(temperature=0.5)),  # sampled at 0.5, scored at 0.5
    (("temperature=0.5", "beta=0.5"), dict(temperature=0.5, beta=0.5)),  # the reference at 0.5 too
    (("temperature=0.5", "score_at_sampling_temperature=false"), dict(temperature=1.0)),  # runs from before: at 1
    (("num_iterations=2",), dict(clipped_form=True)),  # the clipped ratio, 1 at the first iteration
    (("mask_truncated_completions=true",), dict(masked_truncated=True)),
])
def test_update_form_fields(tmp_path, overrides, kwargs):
    trainer, levels = sampled(tmp_path, *overrides)
    if "masked_truncated" in kwargs:  # the tiny model rarely stops within 3 tokens: both kinds of rows present
        seg = levels[0].rollout.segments[0]
        seg.finished[::2] = True
        seg.finished[1::2] = False
    kwargs = dict(kwargs)  # the parameter's own dict stays whole for a rerun
    beta = kwargs.pop("beta", 0.0)
    hand = {a: hand_loss(trainer, levels[0], a, "sum", beta, **kwargs) for a in trainer.team.adapters}
    stats = trainer.update(levels)
    for adapter, (loss, _) in hand.items():
        assert stats[f"loss/{adapter}"] == pytest.approx(loss, rel=F32), adapter


# ---- the optimizer step

def one_step(tmp_path, *overrides):
    """(parameters before, gradients the optimizer received, parameters after, update stats) of agent_0."""
    trainer, levels = sampled(tmp_path, *overrides)
    params = trainer.team.parameters_of("agent_0")
    before = [p.detach().clone() for p in params]
    opt, seen = trainer.optimizers["agent_0"], {}

    def step(real=opt.step):
        seen["grads"] = [p.grad.clone() for p in params]
        return real()

    opt.step = step
    stats = trainer.update(levels)
    return before, seen["grads"], [p.detach().clone() for p in params], stats


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("lr, weight_decay", [(0.01, 0.0), (0.002, 0.0), (0.01, 0.5)])
def test_learning_rate_and_weight_decay_make_the_first_adamw_step(tmp_path, lr, weight_decay):
    # AdamW's first step, bias-corrected: p <- p (1 - lr wd) - lr g / (|g| + eps)
    before, grads, after, _ = one_step(tmp_path, f"learning_rate={lr}", f"weight_decay={weight_decay}")
    for p0, g, p1 in zip(before, grads, after):
        torch.testing.assert_close(p1, p0 * (1 - lr * weight_decay) - lr * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
@pytest.mark.parametrize("max_grad_norm", [1e-4, 0.0])
def test_max_grad_norm_clips_what_the_optimizer_receives(tmp_path, max_grad_norm):
    _, grads, _, stats = one_step(tmp_path, f"max_grad_norm={max_grad_norm}")
    received = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))
    assert stats["grad_norm/agent_0"] > 1e-3  # the logged norm is the one before clipping
    expected = max_grad_norm or stats["grad_norm/agent_0"]  # 0: no clipping
    assert received == pytest.approx(expected, rel=1e-3)


# ---- the learning-rate schedule

def lrs(*overrides, steps: int) -> list[float]:
    cfg = load_config("tiny_cpu", overrides=list(overrides))
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.learning_rate)
    schedule, out = lr_schedule(opt, cfg), []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    return out


C = (1 + math.cos(math.pi / 4)) / 2  # cosine at a quarter of the decay
SCHEDULES = [  # overrides, the learning rate of steps 0, 1, ... (learning_rate=1)
    (("num_steps=4",), [1, 1, 1, 1]),
    (("num_steps=4", "warmup_steps=2"), [0, 0.5, 1, 1]),  # warm-up under the default constant schedule too
    (("num_steps=4", "lr_scheduler=linear"), [1, 0.75, 0.5, 0.25]),
    (("num_steps=8", "lr_scheduler=linear"), [1, 0.875, 0.75, 0.625]),
    (("num_steps=6", "lr_scheduler=linear", "warmup_steps=2"), [0, 0.5, 1, 0.75, 0.5, 0.25]),
    (("num_steps=4", "lr_scheduler=cosine"), [1, C, 0.5, 1 - C]),
    (("num_steps=5", "lr_scheduler=cosine", "warmup_steps=1"), [0, 1, C, 0.5, 1 - C]),
]


@pytest.mark.parametrize("overrides, expected", SCHEDULES, ids=[" ".join(r[0]) for r in SCHEDULES])
@pytest.mark.parametrize("lr", [1.0, 0.25])
def test_schedule_fields(overrides, expected, lr):
    got = lrs(f"learning_rate={lr}", *overrides, steps=len(expected))
    assert got == pytest.approx([lr * x for x in expected], abs=1e-12)


# ---- sampling

class SpyEngine:
    """The real engine, recording what each generate call was given."""

    carries_cache = False  # tool rounds go through generate too (else __getattr__ would hand out generate_carried)

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
        self.calls.append((generation_config, row_seeds))
        return self.engine.generate(input_ids, attention_mask, adapters, generation_config, row_seeds)


def spied(tmp_path, *overrides):
    """A trainer whose engine records its calls; the seed-0 model (built once per process) whatever the seed."""
    team = build_team(config(tmp_path), **QUIET)
    trainer = Trainer(config(tmp_path, "batch_size=2", "num_generations=2", *overrides), team=team, **QUIET)
    spy = trainer.team.engines[0] = SpyEngine(engine_for(trainer.team, 0))
    return trainer, spy


@pytest.mark.parametrize("seed, step, positions", [(0, 0, [0, 1]), (5, 0, [0, 1]), (5, 3, [1])])
def test_the_row_seeds_come_from_the_runs_seed_the_step_and_the_items_place_in_the_batch(tmp_path, seed, step,
                                                                                        positions):
    trainer, spy = spied(tmp_path, f"seed={seed}")
    trainer.step = step
    items = trainer.batch_items(step)
    trainer.sample([items[p] for p in positions], positions)  # positions [1]: process 1 of 2
    (_, seeds), = spy.calls
    keys = [("train", step, p, 0, agent) for p in positions for agent in range(2)]  # (step, item, turn, agent)
    expected = sorted(row_seed(seed, key, g) for key in keys for g in range(2))
    assert sorted(seeds.tolist()) == expected
    assert expected != sorted(row_seed(seed + 1, key, g) for key in keys for g in range(2))


def test_every_step_reseeds_the_global_rngs_from_the_seed_and_the_step(tmp_path, monkeypatch):
    # what does not sample per row (LoRA dropout, a reward function's own draws) gets new noise at every step
    import kit.trainers.trainer

    seen = []
    monkeypatch.setattr(kit.trainers.trainer, "seed_everything", seen.append)
    Trainer(config(tmp_path, "seed=5", "num_steps=2", "batch_size=1", "num_generations=2", "max_new_tokens=1"),
            **QUIET).train()
    assert seen == [step_seed(5, 0), step_seed(5, 1)] and len(set(seen)) == 2


def test_sampling_fields_reach_the_engine(tmp_path):
    trainer, spy = spied(tmp_path, "temperature=0.6", "top_p=0.8", "top_k=5", "max_new_tokens=2")
    trainer.sample(trainer.batch_items(0))
    (gen, _), = spy.calls
    assert (gen.do_sample, gen.temperature, gen.top_p, gen.top_k, gen.max_new_tokens) == (True, 0.6, 0.8, 5, 2)


def test_top_k_cuts_before_top_p():
    # p = [0.4, 0.3, 0.2, 0.1]. top-k 2 first: [4/7, 3/7], then top-p 0.5 keeps only the first token. top-p first
    # would keep [0.4, 0.3] (mass 0.7 >= 0.5), which top-k 2 leaves as it is: two tokens.
    sampler = SeededSampling(torch.tensor([7]), temperature=1.0, top_p=0.5, top_k=2)
    scores = sampler(torch.zeros(1, 3, dtype=torch.long), torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log())
    assert torch.isfinite(scores[0]).tolist() == [True, False, False, False]


# ---- adapters

def test_lora_rank_and_alpha_shape_the_adapters(tmp_path):
    trainer = Trainer(config(tmp_path, "lora_r=4", "lora_alpha=12"), **QUIET)
    layers = [m for m in trainer.team.models[0].modules() if hasattr(m, "lora_A") and "agent_0" in m.lora_A]
    assert layers and all(m.r["agent_0"] == 4 and m.scaling["agent_0"] == 3.0 for m in layers)
    assert all(m.lora_A["agent_0"].weight.shape[0] == 4 for m in layers)


# ---- issue 33: more of TRL's update options reach the loss and the advantages

OLD_SHIFT = torch.tensor([0.4, -0.4, 0.1])  # per completion position: the first iteration's ratios e^0.4, e^-0.4, e^0.1


def old_policy_shifted(monkeypatch):
    """Make the update's old log-probs OLD_SHIFT below the current ones at each position (the trainer's own are
    the current ones at the first iteration), so the ratio's forms differ from their values at 1."""
    from kit.maths import losses

    real = losses.policy_loss

    def shifted(*args, old_logp=None, **kwargs):
        if old_logp is not None:
            old_logp = old_logp - OLD_SHIFT[: old_logp.shape[1]].to(old_logp.dtype)
        return real(*args, old_logp=old_logp, **kwargs)

    monkeypatch.setattr(losses, "policy_loss", shifted)


def full_logprobs(model, seg, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) over the vocabulary at each completion position; (R, T, V)."""
    T = seg.completion_mask.shape[1]
    positions = (seg.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=seg.input_ids, attention_mask=seg.attention_mask, position_ids=positions).logits
    return torch.log_softmax(logits[:, -T - 1:-1].double() / temperature, -1)


def hand_issue33(trainer, level, adapter: str, term, reduction: str = "sum", beta: float = 0.0,
                 kl_times_ratio: bool = False) -> float:
    """One adapter's loss by hand: term(logp, ratio, adv, mask, sampler, entropy) gives the (R, T) policy term
    (ratio = e^OLD_SHIFT per position), reduced by `reduction`, plus beta * k3 (times the ratio if asked); or a
    pair (that term, a number added after the reduction)."""
    agents = trainer.team.agents_of_adapter(adapter)
    model = trainer.team.model_of(agents[0])
    model.set_adapter(adapter)
    seg = level.rollout.segment(0).rows(agents)
    adv = torch.tensor(level.advantages.reshape(-1)[seg.sample.numpy()], dtype=torch.float64)[:, None]  # (R, 1)
    T = seg.completion_mask.shape[1]
    targets = seg.input_ids[:, -T:, None]
    with torch.no_grad():
        full = full_logprobs(model, seg, trainer.cfg.temperature)
        with model.disable_adapter():
            ref = full_logprobs(model, seg, trainer.cfg.temperature).gather(-1, targets)[..., 0]
    logp, entropy = full.gather(-1, targets)[..., 0], -(full.exp() * full).sum(-1)
    mask = seg.completion_mask.double()
    ratio = torch.exp(OLD_SHIFT[:T].double()).expand_as(logp)
    x = term(logp=logp, ratio=ratio, adv=adv, mask=mask, sampler=seg.sampler_logprobs.double(), entropy=entropy)
    x, after = x if isinstance(x, tuple) else (x, 0.0)  # a term added after the reduction (the entropy bonus)

    def reduce(y):
        y = torch.where(mask.bool(), y, 0.0)
        if reduction == "sum":
            return y.sum(-1).mean()
        if reduction == "grpo":
            return (y.sum(-1) / mask.sum(-1)).mean()
        return y.sum() / mask.sum()  # token_mean

    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    return float(reduce(x) + beta * reduce(k3 * ratio if kl_times_ratio else k3) + after)


def clipped(r, adv, high=0.2):
    return -torch.minimum(r * adv, r.clamp(0.8, 1 + high) * adv)


def sequence_ratio(mask):
    return torch.exp((OLD_SHIFT[: mask.shape[1]].double() * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True))


def sapo(ratio, adv, pos, neg):
    tau = torch.where(adv > 0, pos, neg).double()
    return -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * adv


def mean_of(values, mask):
    """The mean of `values` where `mask` is 1."""
    return float(torch.where(mask.bool(), values, 0.0).sum() / mask.sum())


def entropy_top_half(entropy, mask):
    threshold = np.quantile(entropy[mask.bool()].numpy(), 0.5)  # numpy's linear interpolation, as torch's
    return ((entropy >= threshold) & mask.bool()).double()


def kl_of_row(sampler, logp, mask):
    return (torch.where(mask.bool(), sampler - logp, 0.0).sum(-1) / mask.sum(-1))[:, None]


ISSUE33_LOSSES = [  # overrides, whether the old policy is shifted, the hand term, its reduction, beta, k3 x ratio
    (("num_iterations=2",), True, lambda logp, ratio, adv, **_: clipped(ratio, adv), "sum", 0.0, False),
    (("num_iterations=2", "importance_sampling_level=sequence"), True,
     lambda logp, ratio, adv, mask, **_: clipped(sequence_ratio(mask).expand_as(logp), adv), "sum", 0.0, False),
    (("num_iterations=2", "delta=1.3"), True,
     lambda logp, ratio, adv, **_: -torch.minimum(ratio.clamp(max=1.3) * adv, ratio.clamp(0.8, 1.2) * adv),
     "sum", 0.0, False),
    (("num_iterations=2", "loss_type=cispo", "epsilon_high=0.3"), True,
     lambda logp, ratio, adv, **_: -ratio.clamp(max=1.3) * adv * logp, "token_mean", 0.0, False),
    (("num_iterations=2", "loss_type=sapo"), True, lambda logp, ratio, adv, **_: sapo(ratio, adv, 1.0, 1.05),
     "grpo", 0.0, False),
    (("num_iterations=2", "loss_type=sapo", "sapo_temperature_pos=2", "sapo_temperature_neg=3"), True,
     lambda logp, ratio, adv, **_: sapo(ratio, adv, 2.0, 3.0), "grpo", 0.0, False),
    (("num_iterations=2", "beta=0.5", "use_bias_correction_kl=true"), True,
     lambda logp, ratio, adv, **_: clipped(ratio, adv), "sum", 0.5, True),
    (("top_entropy_quantile=0.5",), False,
     lambda logp, adv, mask, entropy, **_: -adv * logp * entropy_top_half(entropy, mask), "sum", 0.0, False),
    # TRL's entropy bonus (issue 41): minus 0.1 x the mean entropy of the completion tokens (of those the entropy
    # mask keeps), added after the loss_type's reduction (before issue 41 it was reduced like the loss)
    (("entropy_coef=0.1",), False, lambda logp, adv, mask, entropy, **_: (-adv * logp, -0.1 * mean_of(entropy, mask)),
     "sum", 0.0, False),
    (("entropy_coef=0.1", "loss_type=token_mean"), False,
     lambda logp, adv, mask, entropy, **_: (-adv * logp, -0.1 * mean_of(entropy, mask)), "token_mean", 0.0, False),
    (("entropy_coef=0.1", "top_entropy_quantile=0.5"), False,
     lambda logp, adv, mask, entropy, **_: (-adv * logp * entropy_top_half(entropy, mask),
                                            -0.1 * mean_of(entropy, entropy_top_half(entropy, mask))),
     "sum", 0.0, False),
    # the sampler 0.3 nats per token above the policy: completions with A < 0 are past 0.2 and dropped
    (("off_policy_mask_threshold=0.2",), False,
     lambda logp, adv, mask, sampler, **_: -adv * logp * ((adv >= 0) | (kl_of_row(sampler, logp, mask) <= 0.2)),
     "sum", 0.0, False),
    (("off_policy_mask_threshold=0.4",), False, lambda logp, adv, **_: -adv * logp, "sum", 0.0, False),
]


@pytest.mark.parametrize("overrides, shifted, term, reduction, beta, kl_times_ratio", ISSUE33_LOSSES,
                         ids=[" ".join(r[0]) for r in ISSUE33_LOSSES])
def test_more_update_options_reach_the_loss(tmp_path, monkeypatch, overrides, shifted, term, reduction, beta,
                                            kl_times_ratio):
    trainer, levels = sampled(tmp_path, *overrides)
    if shifted:
        old_policy_shifted(monkeypatch)
    if any(o.startswith("off_policy") for o in overrides):
        shift_sampler(levels, -0.3)
    hand = {a: hand_issue33(trainer, levels[0], a, term, reduction, beta, kl_times_ratio) for a in trainer.team.adapters}
    stats = trainer.update(levels)
    for adapter, loss in hand.items():
        assert stats[f"loss/{adapter}"] == pytest.approx(loss, rel=F32), adapter
    if any(o.startswith("off_policy_mask_threshold=0.2") for o in overrides):  # some dropped, some kept
        assert 0 < stats["off_policy_masked/agent_0"] < 1


def two_rewards(tmp_path, aggregation: str):
    return levels_of(tmp_path, (f"multi_objective_aggregation={aggregation}", "reward_weights=[1.0, 0.5]"), (bonus,))


def test_normalize_then_sum_normalises_each_reward_before_the_weighted_sum(tmp_path):
    # R = [0, 3, 15] and bonus = [0, 0, 1] per group (both items, both agents alike): each over its group's
    # population std (+ eps), weighted 1 and 0.5, then over the std of the sum over the step (+ eps)
    eps = 1e-6
    summed = (np.array([-6.0, -3.0, 9.0]) / (math.sqrt(42) + eps)
              + 0.5 * np.array([-1 / 3, -1 / 3, 2 / 3]) / (math.sqrt(2 / 9) + eps))
    expected = summed / (summed.std() + eps)
    for item in two_rewards(tmp_path, "normalize_then_sum")[0].advantages:
        np.testing.assert_allclose(item, [expected, expected], rtol=1e-9)
    summed_first = two_rewards(tmp_path / "b", "sum_then_normalize")[0].advantages  # R = [0, 3, 15.5]
    np.testing.assert_allclose(summed_first[0], [[-6 - 1 / 6, -3 - 1 / 6, 9 + 1 / 3]] * 2)


def test_normalize_then_sum_carries_each_reward_through_the_turns(tmp_path):
    from kit.tasks.rewards import Reward

    task = from_functions([{"id": "a"}], lambda it: ["x", "y"], joint_reward,
                          feedback_fn=lambda it, comps, reward: [f"again {c}" for c in comps])
    cfg = config(tmp_path, "batch_size=1", "num_generations=3", "num_turns=2", "discount=0.5",
                 "multi_objective_aggregation=normalize_then_sum", "reward_weights=[1.0, 0.5]")
    trainer = Trainer(cfg, task=task, sampler=Scripted(), reward_funcs=[bonus], **QUIET)
    levels = trainer.sample(trainer.batch_items(0))
    first, second = trainer.reward_model.source_names()
    # turn 1: the first reward is 4 after joint action 0 and 0 after the others, the bonus is 0 everywhere
    for n, node in enumerate(levels[1].rewards):
        levels[1].rewards[n] = [Reward(4.0 if n == 0 else 0.0, {first: 4.0 if n == 0 else 0.0, second: 0.0})] * 3
    trainer._returns_and_advantages(levels)
    r1 = np.array([0.0, 3.0, 15.0]) + 0.5 * np.array([4.0, 0.0, 0.0])  # r + discount * (the child's mean)
    r2 = np.array([0.0, 0.0, 1.0])  # the bonus of turn 0 only
    eps = 1e-6
    summed = (r1 - r1.mean()) / (r1.std() + eps) + 0.5 * (r2 - r2.mean()) / (r2.std() + eps)
    np.testing.assert_allclose(levels[0].advantages[0], [summed / (summed.std() + eps)] * 2, rtol=1e-9)


def test_the_zero_advantage_groups_are_counted_per_agent(tmp_path):
    def first_agent_only(item, completions) -> float:  # agent 1's samples never change the reward
        return float(completions[0] == "1")

    task = from_functions([{"id": "a"}, {"id": "b"}], lambda it: ["x", "y"], first_agent_only)
    trainer = Trainer(config(tmp_path, "batch_size=2", "num_generations=3", "joint_mode=cross"), task=task,
                      sampler=Scripted(), **QUIET)
    levels = trainer.sample(trainer.batch_items(0))
    # cross: agent 0's returns [0, 1, 0] differ, agent 1's (each the mean over agent 0's partners) all tie at 1/3
    assert levels[0].ties.tolist() == [[False, True], [False, True]]
# ---- credit assignment without a critic (issue 31): grouping, marginal, role, local_reward_weight

# two turns, aligned: turn 1 has one node per joint action j of turn 0, whose 3 samples all repeat j, so every
# sample there is worth 3 V[j] = [0, 3, 15]; turn 0's returns are twice the reward, [0, 6, 30] (mean 12)
GROUPINGS = [
    ("node", [-12, -6, 18], [[0, 0, 0]] * 3),  # a node's samples agree at turn 1: no signal there
    ("turn", [-12, -6, 18], [[-6] * 3, [-3] * 3, [9] * 3]),  # turn 1 pooled over its 3 nodes: mean 6
    ("agent", [-7.5, -1.5, 22.5], [[-7.5] * 3, [-4.5] * 3, [7.5] * 3]),  # both turns pooled: 90 / 12 = 7.5
]


@pytest.mark.parametrize("grouping, turn0, turn1", GROUPINGS, ids=[g[0] for g in GROUPINGS])
def test_grouping_pools_an_agents_samples_over_nodes_and_turns(tmp_path, grouping, turn0, turn1):
    levels = levels_of(tmp_path, ("num_turns=2", f"grouping={grouping}"))
    for agent in range(2):
        np.testing.assert_allclose(levels[0].advantages[0, agent], turn0, atol=1e-12)
        np.testing.assert_allclose(levels[1].advantages[:, agent], turn1, atol=1e-12)


def test_marginal_advantage_in_cross_mode(tmp_path):
    # R(a, b) = V[a] + 2 V[b]: agent 0's sample a is worth V[a] + 2 mean(V) = V[a] + 4, minus the grand mean 6
    advantages = levels_of(tmp_path, ("joint_mode=cross", "advantage_mode=marginal"))[0].advantages
    np.testing.assert_allclose(advantages[0], [[-2, -1, 3], [-4, -2, 6]], atol=1e-12)


def both_two(item, completions) -> float:  # with weight 6: R = V[a] + 2 V[b] + 6 [a = b = 2], not additive
    return float(completions[0] == "2" and completions[1] == "2")


@pytest.mark.parametrize("overrides, step, expected", [
    # agent 0's sample a meets b = 0, 1, 2: R = 0 2 10 | 1 3 11 | 5 7 21; agent 1's b: 0 1 5 | 2 3 7 | 10 11 21
    ((), 0, [[-8 / 3, -5 / 3, 13 / 3], [-14 / 3, -8 / 3, 22 / 3]]),  # means [4, 5, 11], [2, 4, 14]: 20 / 3
    (("leniency=1",), 0, [[-4, -3, 7], [-6, -4, 10]]),  # maxima [10, 11, 21], [5, 7, 21]
    # kappa 0.5: [7, 8, 16] (mean 31 / 3) and [3.5, 5.5, 17.5] (mean 53 / 6); at step 2 kappa is 0: the means
    (("leniency=1", "leniency_decay_steps=2"), 1, [[-10 / 3, -7 / 3, 17 / 3], [-16 / 3, -10 / 3, 26 / 3]]),
    (("leniency=1", "leniency_decay_steps=2"), 2, [[-8 / 3, -5 / 3, 13 / 3], [-14 / 3, -8 / 3, 22 / 3]]),
])
def test_leniency_and_its_decay_reach_the_cross_advantages(tmp_path, overrides, step, expected):
    task = from_functions([{"id": "a"}], lambda it: ["x", "y"], joint_reward)
    trainer = Trainer(config(tmp_path, "batch_size=1", "num_generations=3", "joint_mode=cross",
                             "advantage_mode=marginal", "reward_weights=[1.0, 6.0]", *overrides),
                      task=task, sampler=Scripted(), reward_funcs=[both_two], **QUIET)
    trainer.step = step
    np.testing.assert_allclose(trainer.sample(trainer.batch_items(0))[0].advantages[0], expected, atol=1e-12)


def test_role_advantage_subtracts_the_moving_baseline_then_moves_it(tmp_path):
    task = from_functions([{"id": "a"}], lambda it: ["x", "y"], joint_reward)
    trainer = Trainer(config(tmp_path, "batch_size=1", "num_generations=3", "advantage_mode=role",
                             "role_baseline_decay=0.5"), task=task, sampler=Scripted(), **QUIET)
    trainer.role_baseline = np.array([[1.0, 2.0]])  # (turns, agents)
    advantages = trainer.sample(trainer.batch_items(0))[0].advantages[0]
    np.testing.assert_allclose(advantages, [[-1, 2, 14], [-2, 1, 13]], atol=1e-12)  # R = [0, 3, 15] minus b
    np.testing.assert_allclose(trainer.role_baseline, [[0.5 * 1 + 0.5 * 6, 0.5 * 2 + 0.5 * 6]])  # mean R = 6


def test_role_baseline_is_per_turn_in_multi_turn(tmp_path):
    """Two turns (GROUPINGS' tree: turn 0's returns [0, 6, 30], turn 1's node j all 3 V[j] = [0, 3, 15], mean 6):
    each turn subtracts its own row of the baseline (turns, agents), and each row moves toward its turn's mean."""
    trainer = Trainer(config(tmp_path, "batch_size=1", "num_generations=3", "num_turns=2", "advantage_mode=role",
                             "role_baseline_decay=0.5"),
                      task=from_functions([{"id": "a"}], lambda it: ["x", "y"], joint_reward,
                                          feedback_fn=lambda it, comps, reward: [f"again {c}" for c in comps]),
                      sampler=Scripted(), **QUIET)
    trainer.role_baseline = np.array([[1.0, 2.0], [10.0, 20.0]])
    levels = trainer.sample(trainer.batch_items(0))
    np.testing.assert_allclose(levels[0].advantages[0], [[-1, 5, 29], [-2, 4, 28]], atol=1e-12)  # minus b[0]
    np.testing.assert_allclose(levels[1].advantages[:, 0], [[-10] * 3, [-7] * 3, [5] * 3], atol=1e-12)  # minus 10
    np.testing.assert_allclose(levels[1].advantages[:, 1], [[-20] * 3, [-17] * 3, [-5] * 3], atol=1e-12)  # minus 20
    np.testing.assert_allclose(trainer.role_baseline, [[0.5 * 1 + 0.5 * 12, 0.5 * 2 + 0.5 * 12],
                                                       [0.5 * 10 + 0.5 * 6, 0.5 * 20 + 0.5 * 6]])


@pytest.mark.parametrize("processor, scale", [("identity", 1.0), ("scale(2)", 2.0)])
def test_local_reward_weight_mixes_each_agents_own_part(tmp_path, processor, scale):
    """With a reward_processor the agent's own part goes through it as the team's reward does (review 7): r_i mixes
    one scale. Unprocessed local parts under scale(2) would give agent 0 1.5 R' + ... = 3.5 V, not 4 V."""
    from kit.tasks.rewards import Reward

    def reward(item, completions):  # the team's R = V[a] + 2 V[b]; agent 0's own part V[a], agent 1's 0
        a, b = (VALUE[int(c[-1])] for c in completions)
        return Reward(a + 2 * b, {"local_0": a, "local_1": 0.0})

    task = from_functions([{"id": "a"}], lambda it: ["x", "y"], reward)
    trainer = Trainer(config(tmp_path, "batch_size=1", "num_generations=3", "local_reward_weight=0.5",
                             f"reward_processor={processor}"), task=task, sampler=Scripted(), **QUIET)
    advantages = trainer.sample(trainer.batch_items(0))[0].advantages[0]
    # aligned: R = 3 V = [0, 3, 15]; agent 0: 0.5 R + 0.5 V = 2 V = [0, 2, 10]; agent 1: 0.5 R = [0, 1.5, 7.5]
    np.testing.assert_allclose(advantages, scale * np.array([[-4, -2, 6], [-3, -1.5, 4.5]]), atol=1e-12)
