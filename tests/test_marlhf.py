"""MARLHF on the tiny model (kit/marlhf.py): the reward model's fields reach its Bradley-Terry fit, its score is
the reward MAGRPO's advantages see, judge pairs go through the judge's ledger, and a run resumes exactly.

Run: python -m pytest tests/test_marlhf.py      (about 30 s)
"""

import json

import pytest
import torch

from kit.config import load_config
from kit.judge_pairs import JudgePreference, oracle_judge
from kit.marlhf import NAME, MARLHFTrainer, joint_text
from kit.tasks import from_functions
from test_config_reaches_maths import Scripted, joint_reward

QUIET = dict(log=lambda *_: None)
ITEMS = [{"id": f"i{k}"} for k in range(8)]


def config(tmp_path, *overrides, name="run"):
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / name}", "progress=false", "eval_every=0",
                                              "algorithm=marlhf", *overrides])


def scripted(tmp_path, *overrides, **kwargs):
    """Sample k of every agent is "k": each item's joint rewards are [0, 3, 15, 6] (K=4), its two widest-gap pairs
    (2, 0) and (2, 1); prompts name the item, so every pair's texts differ."""
    task = from_functions(ITEMS, lambda it: [f"x {it['id']}", "y"], joint_reward)
    cfg = config(tmp_path, "preference_num_candidates=4", "preference_pairs_per_sample=2", "reward_num_items=8",
                 "reward_heldout_fraction=0.25", *overrides)
    return MARLHFTrainer(cfg, task=task, sampler=Scripted(), **QUIET, **kwargs)


def spy(opt):
    """Count the optimizer's steps and keep the gradients of the last."""
    seen, real = {"steps": 0}, opt.step

    def step(*args, **kwargs):
        seen["steps"] += 1
        seen["grads"] = [p.grad.clone() for group in opt.param_groups for p in group["params"]]
        return real(*args, **kwargs)

    opt.step = step
    return seen


def test_one_fit_is_one_adamw_step_on_the_bradley_terry_gradient(tmp_path):
    """No held-out items, 16 pairs in one batch, one epoch: one AdamW step of reward_learning_rate on the gradient
    of mean log(1 + exp(-(s(w) - s(l)))) over the 16 pairs, (2, 0) and (2, 1) of every item."""
    lr = 0.01
    trainer = scripted(tmp_path, "reward_num_train_epochs=1", "reward_train_batch_size=16", "reward_heldout_fraction=0",
                       f"reward_learning_rate={lr}", "max_grad_norm=0")
    rm = trainer.rm
    with torch.no_grad():
        rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))  # a head that tells texts apart
    params = rm.parameters()
    before = [p.detach().clone() for p in params]
    pairs = [(joint_text([f"x {it['id']}", "y"], (str(w),) * 2), joint_text([f"x {it['id']}", "y"], (str(l),) * 2))
             for it in ITEMS for w, l in ((2, 0), (2, 1))]
    sw, sl = rm.score_texts([w for w, _ in pairs]), rm.score_texts([l for _, l in pairs])
    hand = torch.autograd.grad(torch.log1p(torch.exp(-(sw - sl))).mean(), params)
    seen = spy(trainer.algorithm.optimizers[NAME])
    stats = trainer.fit()
    assert seen["steps"] == 1 and stats["rm/num_pairs"] == 16 and stats["rm/heldout_pairs"] == 0
    assert max(float(g.abs().max()) for g in hand) > 1e-4
    for p0, g, want, p1 in zip(before, seen["grads"], hand, params):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-8)
        torch.testing.assert_close(p1.detach(), p0 - lr * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-7)  # AdamW step 1


def test_held_out_items_epochs_and_batch_size(tmp_path):
    """8 items x 2 pairs, a quarter of the items held out: 12 pairs fit, 4 measured; 2 epochs of batches of 5:
    2 x ceil(12 / 5) = 6 steps."""
    trainer = scripted(tmp_path, "reward_num_train_epochs=2", "reward_train_batch_size=5")
    seen = spy(trainer.algorithm.optimizers[NAME])
    stats = trainer.fit()
    assert (stats["rm/num_pairs"], stats["rm/heldout_pairs"], seen["steps"]) == (12, 4, 6)
    assert 0 <= stats["rm/heldout_accuracy"] <= 1


def test_the_reward_model_is_the_reward_of_magrpo(tmp_path):
    trainer = scripted(tmp_path, "batch_size=1", "num_generations=3")
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    trainer.fit = lambda: {}
    (level,) = trainer.sample(trainer.batch_items(0))
    item = trainer.batch_items(0)[0]
    texts = [joint_text([f"x {item['id']}", "y"], (str(g),) * 2) for g in range(3)]
    s = [float(trainer.rm.score_texts([t])[0].detach()) for t in texts]
    assert [r.total for r in level.rewards[0]] == pytest.approx(s, abs=1e-5)
    assert [r.parts["task"] for r in level.rewards[0]] == [0.0, 3.0, 15.0]  # the task's reward, for the logs
    mean = sum(s) / 3
    assert level.advantages[0, 0].tolist() == pytest.approx([x - mean for x in s], abs=1e-5)  # paper Eq. 1


def test_judge_pairs_are_labelled_in_both_orders_and_paid_once(tmp_path):
    """The oracle judge prefers the higher joint reward: in (i, j) order with 2 pairs wanted, (0,1) -> (1, 0) and
    (0,2) -> (2, 0), two requests each; 8 items -> 32 requests on the ledger, and no judge call per rollout."""
    judge = oracle_judge(tmp_path / "run", lambda comps: joint_reward(None, comps), log=lambda *_: None)
    trainer = scripted(tmp_path, "pair_selection=all", preference_fn=JudgePreference(judge, "higher is better"))
    buf = trainer.candidates(ITEMS[:1], [0], reference=False)
    assert [(w, l) for _, w, l in buf.pairs] == [(1, 0), (2, 0)]
    trainer.fit()
    assert json.loads((tmp_path / "run" / "budget.json").read_text())["calls"] == 32


def weights(trainer):
    return [p.detach().clone() for a in trainer.team.adapters for p in trainer.team.parameters_of(a)] + \
        [p.detach().clone() for p in trainer.rm.parameters()]


@pytest.mark.slow
def test_marlhf_resumes_exactly(tmp_path):
    """Fits at steps 0 and 3, a checkpoint at 2: the resumed run scores with the saved reward model, and refits it
    from its saved weights and optimizer state."""
    common = ("num_steps=4", "save_every=2", "reward_refresh_every=3", "reward_num_items=6", "batch_size=2",
              "num_generations=2", "reward_num_train_epochs=1")
    straight = MARLHFTrainer(config(tmp_path, *common, name="a"), **QUIET)
    straight.train()
    MARLHFTrainer(config(tmp_path, *common, name="b"), **QUIET).train(max_steps=2)
    resumed = MARLHFTrainer(config(tmp_path, *common, name="b"), resume=True, **QUIET)
    assert resumed.step == 2
    resumed.train()
    assert all(torch.equal(x, y) for x, y in zip(weights(straight), weights(resumed)))

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in open(tmp_path / run / "metrics.jsonl")]

    assert rows("a") == rows("b")
    assert [("rm/heldout_accuracy" in r) for r in rows("a") if "reward/mean" in r] == [True, False, False, True]
