"""Evaluation (pass@k), baselines, plots and the analysis CLI on the tiny model.

Run: python -m pytest tests/test_evaluate.py
"""

import json
import math

import pytest

from kit.analysis import baselines, plots
from kit.run.config import load_config
from kit.analysis.evaluate import RunContext, evaluate_run, format_table, pass_at_k, summarize
from kit.tasks.rewards import Reward
from kit.tasks.toy import DigitSum
from kit.trainers.trainer import Trainer


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 0.4),  # c/n
    (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (10, 0, 10, 0.0),
    (10, 10, 1, 1.0),
    (10, 3, 8, 1.0),  # n - c < k: some draw of 8 must contain a correct one
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_matches_the_combinatorial_formula():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="c <= n"):
        pass_at_k(3, 4, 1)


class Passing:
    def is_pass(self, reward):
        return reward.parts["tests"] >= 1.0


def test_summarize_pass_at_k_parts_and_cooperation_rate():
    def r(tests, coop):
        return Reward(tests + coop, {"tests": tests, "cooperation": coop})

    rewards = [[r(1.0, 1.5), r(0.5, 0.0), r(0.0, 0.0)], [r(0.0, 0.0), r(0.0, 0.5), r(0.0, 0.0)]]
    out = summarize(Passing(), rewards, ks=(1, 3, 5), num_tokens=30, seconds=2.0)
    assert out["num_samples"] == 3 and "pass@5" not in out
    assert out["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    assert out["pass@3"] == pytest.approx(0.5)
    assert out["reward/tests"] == pytest.approx(1.5 / 6)
    assert out["cooperation_rate"] == pytest.approx(2 / 6)
    assert out["tokens_per_s"] == 15.0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 4-step tiny toy run with checkpoints at steps 2 and 4."""
    path = tmp_path_factory.mktemp("runs") / "toy"
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={path}", "progress=false", "num_steps=4", "save_every=2",
                                             "eval_every=2", "batch_size=4", "num_generations=4",
                                             "num_eval_items=6"])
    Trainer(cfg, log=lambda *_: None).train()
    return path


@pytest.fixture(scope="module")
def ctx(run_dir):
    context = RunContext(run_dir, log=lambda *_: None)
    yield context
    context.close()


def test_evaluate_run_scores_base_and_every_checkpoint(run_dir, ctx):
    rows = evaluate_run(run_dir, "all", n=5, ctx=ctx, log=lambda *_: None)
    assert [r["step"] for r in rows] == [0, 2, 4]
    assert all(r["num_items"] == 6 and r["num_samples"] == 5 for r in rows)
    assert all(f"pass@{k}" in rows[0] for k in (1, 3, 5)) and "pass@10" not in rows[0]
    saved = json.loads((run_dir / "eval" / "step_000004.json").read_text())
    assert saved["pass@1"] == rows[-1]["pass@1"]
    assert "| step | pass@1 | pass@3 | pass@5 | reward/mean |" in format_table(rows)


def test_step_zero_is_the_untrained_base_again_after_a_checkpoint(ctx):
    ctx.use_step(4)
    trained = [p.detach().clone() for p in ctx.team.parameters_of("agent_0")]
    ctx.use_step(0)
    base = list(ctx.team.parameters_of("agent_0"))
    assert any(not (a == b).all() for a, b in zip(trained, base))
    assert all(not p.any() for p in base if p.dim() == 2 and p.shape[0] > p.shape[1])  # LoRA B is zero


def test_every_baseline_samples_n_joint_actions_per_item(ctx):
    for method in baselines.METHODS:
        row = baselines.run_method(method, ctx.sampler, ctx.task, ctx.cfg, ctx.items[:3], 4, ctx.scorer)
        assert row["method"] == method and row["num_items"] == 3 and row["num_samples"] == 4
        assert row["tokens"] > 0 and row["wall_s"] > 0 and 0.0 <= row["pass@1"] <= 1.0


class SpySampler:
    """A sampler that records every batch of requests and answers with the real one."""

    def __init__(self, real):
        self.real, self.seen, self.greedy = real, [], real.greedy

    def sample(self, requests, n, params=None, keys=None):
        self.seen.append(requests)
        return self.real.sample(requests, n, params, keys=keys)


class ScriptedSampler:
    """Answers request k's sample g with "<turn>-<k>-<g>" and records each call's requests and keys."""

    def __init__(self):
        self.calls = []

    def sample(self, requests, n, params=None, keys=None):
        from kit.engine.rollout import Rollout

        self.calls.append((requests, keys, params))
        return Rollout(requests, [[f"{len(self.calls)}-{k}-{g}" for g in range(n)] for k in range(len(requests))])


class FeedbackTask:
    """Two agents; the reward of a joint action is its turn number; feedback names the joint action and reward."""

    def prompts(self, item):
        return [f"p{item['id']}a0", f"p{item['id']}a1"]

    def feedback(self, item, joint, reward):
        return [f"after {joint} r={reward.total} a{a}" for a in range(2)]


class TurnScorer:
    """A joint action's reward names it: 1000 x its call + 10 x agent 0's request index + agent 0's sample index."""

    def submit(self, jobs):
        from concurrent.futures import Future

        out = []
        for _, joint in jobs:
            call, k, g = map(int, joint[0].split("-"))
            f = Future()
            f.set_result(Reward(1000.0 * call + 10 * k + g, {}))
            out.append(f)
        return out


def test_feedback_turns_answer_each_joint_action_and_report_the_last_turn():
    from kit.analysis.evaluate import sample_turns, summarize_turns

    sampler, items, n, N = ScriptedSampler(), [{"id": "x"}, {"id": "y"}], 3, 2
    joints, per_turn, _, _ = sample_turns(sampler, FeedbackTask(), items, n, TurnScorer(), turns=3)
    assert len(sampler.calls) == 3 and [len(c[0]) for c in sampler.calls] == [4, 12, 12]

    def joint_of(turn, k, g):  # joint action g of item k after `turn` (1-based) calls, as the sampler answered it
        if turn == 1:
            return tuple(f"1-{k * N + a}-{g}" for a in range(N))
        return tuple(f"{turn}-{(k * n + g) * N + a}-0" for a in range(N))

    for turn in (2, 3):  # every request of a later turn: the feedback on its own joint action and reward
        requests, keys, _ = sampler.calls[turn - 1]
        for k, item in enumerate(items):
            for g in range(n):
                before = joint_of(turn - 1, k, g)
                call, first, sample = map(int, before[0].split("-"))
                for a in range(N):
                    row = (k * n + g) * N + a
                    assert requests[row] == (a, f"after {before} r={1000.0 * call + 10 * first + sample} a{a}")
                    assert keys[row] == ("eval", item["id"], turn - 1, g, a)  # its own seed per turn
    assert joints == [[joint_of(3, k, g) for g in range(n)] for k in range(len(items))]
    assert [[r.total for r in per_item] for per_item in per_turn[0]] == [[1000.0 + 10 * k * N + g for g in range(n)]
                                                                        for k in range(len(items))]
    out = summarize_turns(None, per_turn)
    last = [1000.0 * 3 + 10 * (k * n + g) * N for k in range(len(items)) for g in range(n)]
    assert out["reward/mean"] == pytest.approx(sum(last) / len(last)) and out["turns"] == 3
    assert out["turn1/reward_mean"] == pytest.approx(1000.0 + 10 * 1 + 1)  # mean of 10 k N + g: k N in {0, 2}

    class NoFeedback:
        prompts = FeedbackTask.prompts

    with pytest.raises(ValueError, match="feedback"):  # before anything is sampled
        sample_turns(sampler, NoFeedback(), items, 1, TurnScorer(), turns=2)
    assert len(sampler.calls) == 3

    class OnePrompt(FeedbackTask):
        def feedback(self, item, joint, reward):
            return ["only one"]

    with pytest.raises(ValueError, match="1 prompts for 2 agents"):
        sample_turns(sampler, OnePrompt(), items, 1, TurnScorer(), turns=2)


def test_greedy_eval_with_turns_samples_every_turn_greedily():
    from kit.analysis.evaluate import greedy_eval

    class Greedy(ScriptedSampler):
        greedy = "GREEDY"

    sampler = Greedy()
    out = greedy_eval(sampler, FeedbackTask(), [{"id": "x"}], TurnScorer(), turns=2)
    assert [c[2] for c in sampler.calls] == ["GREEDY", "GREEDY"]
    assert out["eval/reward_mean"] == 2000.0 and out["eval/turn1/reward_mean"] == 1000.0


def test_greedy_eval_with_turns_reports_each_part_of_the_last_turn_as_its_mean():
    """Review 6: eval/<part> comes from the same turn as eval/reward_mean (the last), never the first."""
    from kit.analysis.evaluate import greedy_eval

    class Greedy(ScriptedSampler):
        greedy = "GREEDY"

    class PartScorer(TurnScorer):
        def submit(self, jobs):
            out = super().submit(jobs)
            for f in out:
                r = f.result()
                f._result = Reward(r.total, {"turn": float(r.total // 1000), "tests": 0.25 * (r.total // 1000)})
            return out

    out = greedy_eval(Greedy(), FeedbackTask(), [{"id": "x"}, {"id": "y"}], PartScorer(), turns=3)
    assert out["eval/turn"] == 3.0 and out["eval/tests"] == 0.75
    assert out["eval/turn1/reward_mean"] < 2000.0 <= out["eval/reward_mean"]


def test_a_two_turn_run_evaluates_the_team_through_its_feedback_turn(tmp_path):
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path}", "progress=false", "num_turns=2",
                                             "num_eval_items=2"])
    trainer = Trainer(cfg)
    spy = SpySampler(trainer.sampler)
    trainer.sampler = spy
    got = trainer.evaluate()
    assert len(spy.seen) == 2 and "eval/turn1/reward_mean" in got
    assert all(" had " in prompt for _, prompt in spy.seen[1])  # the toy task's feedback
    row = baselines.run_method("naive", spy, trainer.task, cfg, trainer.eval_items, 2, trainer.scorer)
    assert row["turns"] == 2 and "turn1/reward_mean" in row and len(spy.seen) == 4
    trainer.close()


def test_sequential_and_discussion_show_teammates_text(ctx):
    spy = SpySampler(ctx.sampler)
    joints, _, _ = baselines._sequential(spy, ctx.task, ctx.items[:2], 3)
    second = spy.seen[1]
    assert len(second) == 6 and all(agent == 1 for agent, _ in second)
    assert all(f"Your teammate (digit_0) wrote:\n{joints[k][g][0].strip()}" in second[k * 3 + g][1]
               for k in range(2) for g in range(3))
    spy.seen.clear()
    revised, _, _ = baselines._discussion(spy, ctx.task, ctx.items[:2], 2)
    assert len(spy.seen) == 2 and len(spy.seen[1]) == 2 * 2 * 2 and "Your first answer:" in spy.seen[1][0][1]


def test_single_model_baseline_needs_the_task_hooks(ctx):
    class NoSingle:
        prompts = DigitSum().prompts

    with pytest.raises(ValueError, match="single_prompt"):
        baselines._single(ctx.sampler, NoSingle(), ctx.items[:1], 2)


def test_plots_render_from_a_run_directory(run_dir, ctx, tmp_path):
    rows = evaluate_run(run_dir, [0, 4], n=3, ctx=ctx, log=lambda *_: None)
    figs = {"learning": plots.learning_curves(run_dir, path=tmp_path / "learning.png"),
            "eval": plots.eval_curves(rows, path=tmp_path / "eval.png"),
            "bars": plots.baseline_bars([{"method": "naive", "pass@1": 0.2, "pass@3": 0.4},
                                         {"method": "magrpo", "pass@1": 0.5, "pass@3": 0.7}],
                                        path=tmp_path / "bars.png"),
            "schemes": plots.scheme_area([{"step": 1, "wrapper": 0.5, "coordinator": 0.5},
                                          {"step": 2, "wrapper": 0.25, "coordinator": 0.75}],
                                         path=tmp_path / "schemes.png")}
    for name, fig in figs.items():
        assert (tmp_path / f"{name}.png").stat().st_size > 5000, name
        assert fig.axes and all(ax.has_data() for ax in fig.axes[:1]), name
    assert [t.get_text() for t in figs["bars"].axes[0].get_xticklabels()] == ["naive", "magrpo"]


def test_plots_explain_missing_data(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/reward_mean": 0.1}) + "\n")
    with pytest.raises(ValueError, match="no training steps"):
        plots.learning_curves(tmp_path)
    with pytest.raises(ValueError, match="evaluate_run"):
        plots.eval_curves([])


def test_cli_eval_and_baselines_write_tables_and_pngs(run_dir, capsys):
    from kit.__main__ import main

    def cli(*args):  # in-process: the tiny model's warm-up is already cached
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = cli("eval", "--run-dir", str(run_dir), "--steps", "newest", "--n", "3", "--items", "3")
    assert code == 0, err
    assert "| 4 |" in out and (run_dir / "eval" / "eval_curves.png").exists()
    code, out, err = cli("baselines", "--run-dir", str(run_dir), "--methods", "naive,sequential", "--n", "2",
                         "--items", "2")
    assert code == 0, err
    assert "| sequential |" in out and "| magrpo |" in out
    assert (run_dir / "eval" / "baselines.png").exists()
    code, out, err = cli("schemes", "--run-dir", str(run_dir))
    assert code == 2 and "code task" in err  # the toy task has no programs
    code, out, err = cli("eval", "--run-dir", str(run_dir.parent / "nope"))
    assert code == 2 and "no config.json" in err


def test_summarize_counts_mains_calls_and_the_schemes_of_passing_code():
    """Issue 78's columns: main calls aux on every sample (not only where the cooperation part was paid), per item,
    and the primary schemes of the passing joint actions only."""
    from kit.tasks.code import CodeTask

    task = CodeTask(dataset="coop", test_timeout=2.0)
    item = {"id": "t/double_all", "prompt": "def double_all(xs: list) -> list:\n    pass\n", "entry_point": "double_all",
            "context": "", "setup": "", "tests": ["assert double_all([1, 2]) == [2, 4]", "assert double_all([]) == []"]}
    aux = "def aux(x):\n    return 2 * x\n"
    loop = "def double_all(xs):\n    out = []\n    for x in xs:\n        out.append(aux(x))\n    return out\n"
    alone = "def double_all(xs):\n    return [x + x for x in xs]\n"
    broken = "def double_all(xs):\n    return [aux(x) + 1 for x in xs] or None\n"  # calls aux, passes nothing
    joints = [[(aux, loop), (aux, alone), (aux, broken), ("", loop)]]  # the last: no aux, main still calls it
    rewards = [[task.reward(item, j) for j in joints[0]]]
    out = summarize(task, rewards)
    assert out["aux_call_rate"] == pytest.approx(3 / 4) and out["per_item"]["aux_call"] == [pytest.approx(3 / 4)]
    assert out["cooperation_rate"] == pytest.approx(1 / 4)  # paid only where aux is defined and a test passes
    from kit.analysis.schemes import passing_shares

    shares = passing_shares(task, [item], rewards)
    assert shares["num_passing"] == 2  # (aux, loop) and (aux, alone); ("", loop) fails: aux undefined
    assert shares["schemes/passing"]["coordinator"] == pytest.approx(0.5)
    assert shares["schemes/passing"]["no_use"] == pytest.approx(0.5)
    assert passing_shares(task, [item], [[rewards[0][2]]]) == {}  # nothing passes


def test_seeds_items_bootstrap_resamples_seeds_and_items():
    from kit.analysis.stats import bootstrap, seeds_items_bootstrap

    assert seeds_items_bootstrap([[0.5, 0.5], [0.5, 0.5]]) == (0.5, 0.5, 0.5)
    one_seed = [[0.0, 1.0, 1.0, 0.0, 1.0]]
    assert seeds_items_bootstrap(one_seed) == pytest.approx(bootstrap(one_seed[0]), abs=0.05)  # items only
    mean, low, high = seeds_items_bootstrap([[0.0, 0.0], [1.0, 1.0]])  # the seeds disagree, the items do not
    assert mean == 0.5 and low == 0.0 and high == 1.0
    same_items = seeds_items_bootstrap([[0.2, 0.8]] * 3)  # seeds that agree: only the items' spread
    assert same_items[1] == pytest.approx(0.2) and same_items[2] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="seeds, items"):
        seeds_items_bootstrap([0.1, 0.2])
