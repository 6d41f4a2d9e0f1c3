"""MARLHF on the tiny model (kit/trainers/marlhf.py): the reward model's fields reach its Bradley-Terry fit, its score is
the reward MAGRPO's advantages and the critics' targets (marlhf_rl_algorithm=iac, maac) see, judge pairs go through
the judge's ledger, each RL stage trains on the toy task, and a run resumes exactly (critics included).

Run: python -m pytest tests/test_marlhf.py      (about 30 s)
"""

import json

import pytest
import torch

from kit.run.config import ConfigError, load_config
from kit.judge.pairs import JudgePreference, oracle_judge
from kit.trainers.marlhf import NAME, MARLHFTrainer, joint_text
from kit.engine.rollout import encode_prompt, kept_prompt
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
        # float32 over another batch shape (16 texts against 32): ~1e-8 where the hand gradient is 0 (seen on 2
        # cores), 3e-7 on an entry of 1.4e-3 with AVX2 kernels (MKL_ENABLE_INSTRUCTIONS=AVX2)
        torch.testing.assert_close(g, want, rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(p1.detach(), p0 - lr * g / (g.abs() + 1e-8), rtol=1e-5, atol=1e-7)  # AdamW step 1


def test_micro_batches_give_the_whole_batchs_step(tmp_path):
    """micro_batch_size=4 (2 pairs a forward) accumulates the gradient of the 16-pair batch's mean loss: the same
    single AdamW step as one forward of all 32 texts, and the same last-epoch loss."""
    fits = []
    for mb in (0, 4):
        trainer = scripted(tmp_path / f"mb{mb}", "reward_num_train_epochs=1", "reward_train_batch_size=16",
                           "reward_heldout_fraction=0", "max_grad_norm=0", f"micro_batch_size={mb}")
        with torch.no_grad():
            trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
        seen, calls = spy(trainer.algorithm.optimizers[NAME]), []
        score = trainer.rm.score_texts
        trainer.rm.score_texts = lambda texts: calls.append(len(texts)) or score(texts)
        stats = trainer.fit()
        fits.append((seen, stats, calls[:8]))
    (whole, whole_stats, whole_calls), (micro, micro_stats, micro_calls) = fits
    assert whole_calls[0] == 32 and micro_calls == [4] * 8 and micro["steps"] == whole["steps"] == 1
    assert max(float(g.abs().max()) for g in whole["grads"]) > 1e-4
    for g, want in zip(micro["grads"], whole["grads"]):
        torch.testing.assert_close(g, want, rtol=1e-3, atol=1e-6)  # other batch shapes, as above
    assert micro_stats["rm/loss"] == pytest.approx(whole_stats["rm/loss"], rel=1e-4)  # other batch shapes


def test_a_batch_that_is_not_a_multiple_of_the_pairs_per_forward_weighs_its_last_part_by_its_size(tmp_path):
    """Review 6: 14 pairs (one of 8 items held out) in batches of 7, 2 pairs a forward (micro_batch_size=4): each
    batch is 2 + 2 + 2 + 1 pairs, and the part of one pair weighs 1/7 of the batch's mean loss, as in one forward."""
    fits = []
    for mb in (0, 4):
        trainer = scripted(tmp_path / f"mb{mb}", "reward_num_train_epochs=1", "reward_train_batch_size=7",
                           "reward_heldout_fraction=0.125", "max_grad_norm=0", f"micro_batch_size={mb}")
        with torch.no_grad():
            trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
        seen, calls = spy(trainer.algorithm.optimizers[NAME]), []
        score = trainer.rm.score_texts
        trainer.rm.score_texts = lambda texts: calls.append(len(texts)) or score(texts)
        stats = trainer.fit()
        fits.append((seen, stats, calls[:8]))
    (whole, whole_stats, whole_calls), (micro, micro_stats, micro_calls) = fits
    assert whole_stats["rm/num_pairs"] == 14 and whole_calls[:2] == [14, 14] and micro_calls == [4, 4, 4, 2] * 2
    assert micro["steps"] == whole["steps"] == 2
    for g, want in zip(micro["grads"], whole["grads"]):  # the second batch's step, after one equal first step
        torch.testing.assert_close(g, want, rtol=1e-3, atol=1e-6)
    assert micro_stats["rm/loss"] == pytest.approx(whole_stats["rm/loss"], rel=1e-4)


def test_held_out_items_epochs_and_batch_size(tmp_path):
    """8 items x 2 pairs, a quarter of the items held out: 12 pairs fit, 4 measured; 2 epochs of batches of 5:
    2 x ceil(12 / 5) = 6 steps."""
    trainer = scripted(tmp_path, "reward_num_train_epochs=2", "reward_train_batch_size=5")
    seen = spy(trainer.algorithm.optimizers[NAME])
    stats = trainer.fit()
    assert (stats["rm/num_pairs"], stats["rm/heldout_pairs"], seen["steps"]) == (12, 4, 6)
    assert 0 <= stats["rm/heldout_accuracy"] <= 1


def test_each_fit_records_its_pairs_task_rewards_and_scores(tmp_path):
    """rm_pairs.jsonl: one row per pair of the fit (train and held out), the task's rewards of winner and loser and
    the model's scores, from which the logged accuracies follow (kit/trainers/marlhf.py; bench/smol_algos.py reads them)."""
    trainer = scripted(tmp_path, "reward_num_train_epochs=1")
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(2))
    stats = trainer.fit()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "rm_pairs.jsonl")]
    assert len(rows) == 16 and sum(r["heldout"] for r in rows) == 4 and {r["step"] for r in rows} == {1}
    assert sorted({r["item"] for r in rows}) == sorted(item["id"] for item in ITEMS)
    assert {(tuple(r["candidates"]), tuple(r["task_reward"])) for r in rows} == {((2, 0), (15.0, 0.0)),
                                                                               ((2, 1), (15.0, 3.0))}
    for heldout, name in ((False, "train"), (True, "heldout")):
        mine = [r for r in rows if r["heldout"] == heldout]
        right = sum(w > l for w, l in (r["score"] for r in mine))  # a tie counts as wrong (pair_accuracy)
        assert stats[f"rm/{name}_accuracy"] == pytest.approx(right / len(mine))
    item = next(r for r in rows if not r["heldout"])
    text = joint_text([f"x {item['item']}", "y"], ("2", "2"))  # candidate 2 of both agents
    assert item["score"][0] == pytest.approx(float(trainer.rm.score_texts([text])[0]), abs=1e-5)


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


def scored_as_read(trainer, level):
    """Each joint action's reward against the reward model's score of its text, read whole, by hand."""
    got, want = [], []
    for n, node in enumerate(level.nodes):
        for j, idx in enumerate(level.joints):
            text = trainer.rm_text(node["prompts"], trainer.joint(level.rollout, n, idx))
            got.append(level.rewards[n][j].total)
            want.append(float(trainer.rm.score_texts([text])[0].detach()))
    return got, want


def test_each_item_and_joint_action_gets_its_own_score(tmp_path):
    """Two items on one process (a fast stand-in for the 2-process run): node n's joint action j gets the score of
    its own text, s[n J + j]; the items' prompts differ, so a score read from the other item's node shows."""
    trainer = scripted(tmp_path, "batch_size=2", "num_generations=3")
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    trainer.fit = lambda: {}
    (level,) = trainer.sample(trainer.batch_items(0))
    assert len(level.nodes) == 2 and level.nodes[0]["prompts"] != level.nodes[1]["prompts"]
    got, want = scored_as_read(trainer, level)
    assert len(set(round(w, 6) for w in want)) == 6  # six different scores: any mix-up shows
    assert got == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("overrides", [("reward_model_pooling=sum",), ("algorithm=iac", "reward_model_pooling=mean"),
                                       ("algorithm=marlhf", "reward_model_pooling=max")])
def test_a_pooling_that_would_reach_no_reward_model_is_refused(overrides):
    with pytest.raises(ConfigError, match="reward_model_pooling"):
        load_config("tiny_cpu", overrides=list(overrides))


def test_reward_model_pooling_reaches_the_scores_that_replace_the_rewards(tmp_path):
    """reward_model_pooling=sum: each joint action's reward is the head on the SUM of the text's hidden states
    (tests/test_heads.py has that sum by hand), which differs from the last token's score of the same weights."""
    trainer = scripted(tmp_path, "batch_size=2", "num_generations=3", "reward_model_pooling=sum")
    assert trainer.rm.pooling == "sum"
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    trainer.fit = lambda: {}
    (level,) = trainer.sample(trainer.batch_items(0))
    got, want = scored_as_read(trainer, level)
    assert got == pytest.approx(want, abs=1e-4)
    trainer.rm.pooling = "last"
    _, last = scored_as_read(trainer, level)
    assert all(abs(a - b) > 1e-3 for a, b in zip(got, last))


def test_without_prompts_the_reward_model_reads_the_answers_alone_in_its_fit_and_its_scores(tmp_path):
    """reward_model_reads_prompts=false: the fit's pairs and the rollouts' scores are both of
    "[Agent 0]\n<answer 0>\n[Agent 1]\n<answer 1>", so two items' same answers get the same score (with the
    prompts, which name the item, they differ: the test above)."""
    trainer = scripted(tmp_path, "batch_size=2", "num_generations=3", "reward_model_reads_prompts=false")
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    read, score_texts = [], trainer.rm.score_texts
    trainer.rm.score_texts = lambda texts: read.extend(texts) or score_texts(texts)
    trainer.fit()
    assert read and set(read) <= {f"[Agent 0]\n{g}\n[Agent 1]\n{g}" for g in range(4)}  # no prompt in any pair
    trainer.fit = lambda: {}
    (level,) = trainer.sample(trainer.batch_items(0))
    want = [float(score_texts([joint_text(None, (str(g),) * 2)])[0].detach()) for g in range(3)]
    assert len(set(round(w, 6) for w in want)) == 3
    for node in level.rewards:  # both items: the same three scores
        assert [r.total for r in node] == pytest.approx(want, abs=1e-5)


def test_the_reward_model_reads_every_agents_whole_answer_with_long_prompts(tmp_path):
    """Issue 41: with max_prompt_tokens the reward model once read the joint text cut to it in its middle, where
    agent 0's answer sits; now each prompt loses its middle (as its agent saw it) and every answer stays whole."""
    long = " ".join(f"w{k}" for k in range(40))
    task = from_functions(ITEMS[:2], lambda it: [f"x {it['id']} {long} end0", f"y {long} end1"], joint_reward)
    cfg = config(tmp_path, "batch_size=1", "num_generations=3", "max_prompt_tokens=12")
    trainer = MARLHFTrainer(cfg, task=task, sampler=Scripted(), **QUIET)
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    trainer.fit = lambda: {}
    (level,) = trainer.sample(trainer.batch_items(0))
    tok = trainer.rm.tokenizer
    prompts = level.nodes[0]["prompts"]
    cut = [kept_prompt(tok, p, cfg.use_chat_template, 12) for p in prompts]  # as its agent saw it
    assert all(len(tok(c, add_special_tokens=False).input_ids) <= 12 for c in cut) and cut[0].endswith("end0")
    for g in range(3):
        text = trainer.rm_text(prompts, trainer.joint(level.rollout, 0, (g, g)))
        assert text == f"[Agent 0] {cut[0]}\n{g}\n[Agent 1] {cut[1]}\n{g}"  # both answers, whole
        assert len(tok(text, add_special_tokens=False).input_ids) > 12  # cutting it whole would lose the middle
    got, want = scored_as_read(trainer, level)
    assert got == pytest.approx(want, abs=1e-5)  # scored as read: the whole text


def test_judge_pairs_are_labelled_in_both_orders_and_paid_once(tmp_path):
    """The oracle judge prefers the higher joint reward: in (i, j) order with 2 pairs wanted, (0,1) -> (1, 0) and
    (0,2) -> (2, 0), two requests each; 8 items -> 32 requests on the ledger, and no judge call per rollout."""
    judge = oracle_judge(tmp_path / "run", lambda comps: joint_reward(None, comps), log=lambda *_: None)
    trainer = scripted(tmp_path, "pair_selection=all", preference_fn=JudgePreference(judge, "higher is better"))
    buf = trainer.candidates(ITEMS[:1], [0], reference=False)
    assert [(w, l) for _, w, l in buf.pairs] == [(1, 0), (2, 0)]
    trainer.fit()
    assert json.loads((tmp_path / "run" / "budget.json").read_text())["calls"] == 32


CRITIC_TARGETS = [  # RL stage, critic_type, the critic fitted and whether its targets are per node (v: the mean)
    ("iac", "q", "critic_1", False), ("maac", "q", "critic", False), ("maac", "v", "critic", True)]


@pytest.mark.parametrize("rl, critic_type, name, per_node", CRITIC_TARGETS,
                         ids=[f"{r[0]}-{r[1]}" for r in CRITIC_TARGETS])
def test_the_critics_fit_targets_are_the_reward_models_scores(tmp_path, rl, critic_type, name, per_node):
    """One turn: a critic's target is the reward, y = r (kit/trainers/critic.py); under marlhf r is the reward model's score
    of the joint action, never the task's [0, 3, 15]."""
    trainer = scripted(tmp_path, "batch_size=1", "num_generations=3", f"marlhf_rl_algorithm={rl}",
                       f"critic_type={critic_type}")
    assert trainer.algorithm.name == rl and NAME in trainer.algorithm.models and name in trainer.algorithm.models
    with torch.no_grad():
        trainer.rm.head.weight.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(1))
    trainer.fit = lambda: {}
    trainer.sample(trainer.batch_items(0))
    item = trainer.batch_items(0)[0]
    s = [float(trainer.rm.score_texts([joint_text([f"x {item['id']}", "y"], (str(g),) * 2)])[0].detach())
         for g in range(3)]
    assert max(s) - min(s) > 1e-3  # the scores tell the joint actions apart
    _, targets, _ = trainer.algorithm.batch[name]
    assert targets == pytest.approx([sum(s) / 3] if per_node else s, abs=1e-5)


@pytest.mark.parametrize("rl", ["magrpo", "iac", "maac"])
def test_each_rl_stage_trains_on_the_toy_task(tmp_path, rl):
    """Three steps of the tiny model on the toy task: every agent's adapter, the reward model (fit at step 0, 3 AdamW
    steps) and (iac, maac) every critic (one AdamW step per step) move, every tensor of them (LoRA's B moves once the
    zero head has, then its A), and the logs carry the fit's and the critics' metrics."""
    trainer = MARLHFTrainer(config(tmp_path, f"marlhf_rl_algorithm={rl}", "num_steps=3", "batch_size=2",
                                   "num_generations=2", "reward_num_items=4", "reward_num_train_epochs=3",
                                   "save_every=0", "log_rollouts=false"), **QUIET)
    models = trainer.algorithm.models
    assert sorted(models) == sorted([NAME] + {"magrpo": [], "iac": ["critic_0", "critic_1"], "maac": ["critic"]}[rl])
    before = [(p, p.detach().clone()) for p in trained(trainer)]
    trainer.train()
    assert all(not torch.equal(p.detach(), p0) for p, p0 in before)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert "rm/train_accuracy" in rows[0] and "rm/train_accuracy" not in rows[1]
    assert any(k.startswith("critic/value_loss/") for k in rows[-1]) == (rl != "magrpo")


def test_a_resume_drops_the_pairs_of_a_fit_after_its_checkpoint(tmp_path):
    """Fits at steps 1 and 3, a checkpoint at 2, stopped after 3: the resumed run fits step 3 again, and
    rm_pairs.jsonl holds that fit's rows once, as the straight run's file does."""
    common = ("num_steps=4", "save_every=2", "reward_refresh_every=2", "reward_num_items=4", "batch_size=2",
              "num_generations=2", "reward_num_train_epochs=1")
    MARLHFTrainer(config(tmp_path, *common, name="a"), **QUIET).train()
    MARLHFTrainer(config(tmp_path, *common, name="b"), **QUIET).train(max_steps=3)
    stopped = [json.loads(line)["step"] for line in open(tmp_path / "b" / "rm_pairs.jsonl")]
    MARLHFTrainer(config(tmp_path, *common, name="b"), resume=True, **QUIET).train()
    pairs = [open(tmp_path / run / "rm_pairs.jsonl").read() for run in ("a", "b")]
    assert set(stopped) == {1, 3} and pairs[0] == pairs[1]


def trained(trainer):
    """Every trained tensor: the agents' adapters, the reward model's and the critics' (adapter and head)."""
    return [p for a in trainer.team.adapters for p in trainer.team.parameters_of(a)] + \
        [p for name in sorted(trainer.algorithm.models) for p in trainer.algorithm.models[name].parameters()]


def weights(trainer):
    return [p.detach().clone() for p in trained(trainer)]


@pytest.mark.slow
@pytest.mark.parametrize("rl", [("marlhf_rl_algorithm=magrpo",), ("marlhf_rl_algorithm=iac", "critic_type=q"),
                                ("marlhf_rl_algorithm=maac",)], ids=["magrpo", "iac-q", "maac-v"])
def test_marlhf_resumes_exactly(tmp_path, rl):
    """Fits at steps 0 and 3, a checkpoint at 2: the resumed run scores with the saved reward model, and refits it
    from its saved weights and optimizer state; the critics (iac, maac) continue from theirs."""
    common = ("num_steps=4", "save_every=2", "reward_refresh_every=3", "reward_num_items=6", "batch_size=2",
              "num_generations=2", "reward_num_train_epochs=1", *rl)
    straight = MARLHFTrainer(config(tmp_path, *common, name="a"), **QUIET)
    straight.train()
    MARLHFTrainer(config(tmp_path, *common, name="b"), **QUIET).train(max_steps=2)
    resumed = MARLHFTrainer(config(tmp_path, *common, name="b"), resume=True, **QUIET)
    assert resumed.step == 2
    resumed.train()
    assert len(weights(straight)) == len(weights(resumed))
    assert all(torch.equal(x, y) for x, y in zip(weights(straight), weights(resumed)))

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in open(tmp_path / run / "metrics.jsonl")]

    assert rows("a") == rows("b")
    assert [("rm/heldout_accuracy" in r) for r in rows("a") if "reward/mean" in r] == [True, False, False, True]
    pairs = [open(tmp_path / run / "rm_pairs.jsonl").read() for run in ("a", "b")]
    assert pairs[0] == pairs[1] and {json.loads(line)["step"] for line in pairs[0].splitlines()} == {1, 4}


def test_the_reward_models_text_holds_an_answer_start_once_and_the_prompt_the_agent_kept(tmp_path):
    """Review 6: a prefilled answer start appeared twice (the cut prompt carried it, the completion begins with it),
    and the cut ignored the chat template, so the reward model kept more of a prompt than its agent had."""
    from kit.engine.models import build_tiny_model
    from kit.engine.prompts import Prompt

    _, tok = build_tiny_model(0)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    start = "```python\ndef aux("
    long = " ".join(f"w{k}" for k in range(60))
    prompts = [Prompt(f"helper task {long} end0", start), f"main task {long} end1"]
    completions = (start + "x):\n    return x\n```", "def f(x):\n    return aux(x)")
    for cap in (None, 150):  # a character tokenizer: the template and the start alone take 68 tokens
        text = joint_text(prompts, completions, tok, cap)
        assert text.count(start) == 1 and text.count("end0") == 1 and text.count("end1") == 1, text
    kept = kept_prompt(tok, prompts[0], True, 150)
    sampled = encode_prompt(tok, prompts[0], True, 150)
    content = len(tok(kept, add_special_tokens=False).input_ids)
    template_and_start = len(encode_prompt(tok, Prompt("", start), True, None))
    assert len(sampled) == 150 and abs(content - (150 - template_and_start)) <= 2  # the agent's room, not more
    assert kept_prompt(tok, prompts[1], True, None) == prompts[1]
    assert f"[Agent 0] {kept}\n{completions[0]}" in joint_text(prompts, completions, tok, 150)  # what the RM reads
