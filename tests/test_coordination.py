"""The coordination suite (kit/tasks/coordination.py): the Tiny Hanabi Suite's tables and optima, the exact evaluator,
and the game trainer's credit options (cross branching, the role baseline: resumed exactly, 2 processes = 1).

Run: python -m pytest tests/test_coordination.py      (about 20 s; the 2-process run is marked slow)
"""

import json

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")

from kit.tasks import coordination  # noqa: E402
from kit.run.config import load_config  # noqa: E402
from kit.tasks.coordination import deterministic, optimum, payoff_table, pure_equilibria, value  # noqa: E402
from kit.trainers.game_trainer import GameTrainer  # noqa: E402
from kit.engine.rollout import Rollout  # noqa: E402
from kit.tasks.game import OpenSpielGame  # noqa: E402

QUIET = dict(log=lambda *_: None)
SIGNAL_P0 = [2, 0]  # game E: card 0 -> a2, card 1 -> a0 ...
SIGNAL_P1 = [[2, 0, 0], [0, 0, 2]]  # ... and player 1 reads it: [card][seen move] -> move (a1 is never seen)


@pytest.mark.parametrize("game, best", [("A", 2.25), ("B", 1.0), ("C", 2.5), ("D", 2.5), ("E", 10.0), ("F", 7 / 3)])
def test_each_suite_game_has_the_optimum_the_paper_reports(game, best):
    # brute force over every deterministic joint policy against the paper's table of optima
    assert optimum(payoff_table(game)) == pytest.approx(best, abs=1e-12)


def test_game_e_is_openspiels_default_tiny_hanabi_with_its_five_pure_equilibria():
    assert pyspiel.load_game("tiny_hanabi").get_parameters()["payoff"] == coordination.openspiel_params("E")["payoff"]
    assert pure_equilibria(payoff_table("E")) == [10.0, 9.0, 8.0, 7.5, 5.0]


def test_the_exact_value_of_hand_written_policies():
    E, A = payoff_table("E"), payoff_table("A")
    middle = value(E, deterministic([1, 1], 3), deterministic([[1] * 3] * 2, 3))
    assert middle == 8.0  # every deal pays 8 for (a1, a1)
    assert value(E, deterministic(SIGNAL_P0, 3), deterministic(SIGNAL_P1, 3)) == 10.0
    assert value(E, np.full((2, 3), 1 / 3), np.full((2, 3, 3), 1 / 3)) == pytest.approx(134 / 36)  # the mean entry
    # game A, both always a0: payoff[c0, c1, 0, 0] = 0, 0, 3, 2 over the four deals
    assert value(A, deterministic([0, 0], 2), deterministic([[0, 0]] * 2, 2)) == 1.25


def test_suite_picks_the_payoff_table_of_tiny_hanabi():
    task = OpenSpielGame(2, "tiny_hanabi", suite="F", prompt_style="compact")
    np.testing.assert_array_equal(coordination.table_of(task.game), payoff_table("F"))
    assert len(task.legal(task.reset(0))) == 2  # F: 3 cards, 2 moves
    with pytest.raises(ValueError, match="suite"):
        OpenSpielGame(2, "tiny_hanabi", suite="A", params={"num_actions": 2})
    with pytest.raises(ValueError, match="suite"):
        OpenSpielGame(2, "tiny_hanabi", suite="G")


@pytest.mark.parametrize("game", list("ABCDEF"))
def test_the_card_blind_convention_is_the_best_policy_that_ignores_the_cards(game):
    payoff = payoff_table(game)
    C, A = payoff.shape[0], payoff.shape[-1]
    blind = max(value(payoff, deterministic([a0] * C, A), deterministic([list(m1)] * C, A))
                for a0 in range(A) for m1 in np.ndindex(*[A] * A))  # brute force: p0 constant, p1 a function of a0
    a0, reply = coordination.card_blind_moves(payoff)
    assert value(payoff, deterministic([a0] * C, A), deterministic([reply] * C, A)) == pytest.approx(blind)
    if game == "E":
        assert (a0, reply[1], blind) == (1, 1, 8.0)  # the middle move twice


def test_the_full_prompt_and_the_rule_player_follow_the_suite_games_size():
    task = OpenSpielGame(2, "tiny_hanabi", suite="F", prompt_style="full")  # 3 cards, 2 moves
    episode = task.reset(0)
    assert "(d0, d1 or d2)" in task.prompt(episode, 0) and "(a0 or a1)" in task.prompt(episode, 0)
    assert task.rule_move(episode) == task.moves(episode)[coordination.card_blind_moves(payoff_table("F"))[0]]
    task.step(episode, "p0a1")
    assert task.rule_move(episode) == task.moves(episode)[coordination.card_blind_moves(payoff_table("F"))[1][1]]
    e = OpenSpielGame(2, "tiny_hanabi", prompt_style="full")
    assert "(d0 or d1)" in e.prompt(e.reset(0), 0) and "(a0, a1 or a2)" in e.prompt(e.reset(0), 0)


class Scripted:
    """A greedy team that answers by a table: player 0 by its card, player 1 by its card and the move it saw."""

    greedy = None

    def __init__(self, p0, p1):
        self.p0, self.p1 = p0, p1

    def sample(self, requests, n, params=None, keys=None):
        def answer(player, prompt):  # "a0 go d1", "a1 go d0 a2"
            words = prompt.split()
            card = int(words[2][1])
            move = self.p0[card] if player == 0 else self.p1[card][int(words[3][1])]
            return "x" if move is None else str(move + 1)  # moves are numbered from 1; "x" names none
        return Rollout(requests, [[answer(p, prompt)] * n for p, prompt in requests])


def test_exact_eval_scores_a_greedy_team_over_every_deal():
    task = OpenSpielGame(2, "tiny_hanabi", prompt_style="compact")
    out = coordination.exact_eval(Scripted(SIGNAL_P0, SIGNAL_P1), task, sampled=False)
    assert out == {"eval/exact_optimum": 10.0, "eval/exact_greedy": 10.0}
    # player 1 names no move: a random legal one (each deal's payoff row averages 10/3) and one penalty per game
    out = coordination.exact_eval(Scripted(SIGNAL_P0, [[None] * 3] * 2), task, sampled=False)
    assert out["eval/exact_greedy"] == pytest.approx(10 / 3 - 1.0)


def trainer(tmp_path, *overrides, name="run"):
    cfg = load_config("tiny_hanabi", overrides=[f"run_dir={tmp_path / name}", "progress=false", "eval_every=0",
                                                "batch_size=2", "num_generations=2", *overrides])
    return GameTrainer(cfg, **QUIET)


def test_move_probabilities_are_a_distribution_and_exact_for_one_token_answers(tmp_path):
    t = trainer(tmp_path, "max_new_tokens=1")
    first, second = coordination.observations(t.task, coordination.table_of(t.task.game))
    probs, illegal, unresolved = coordination.move_probabilities(t.team, t.sampler.params, t.task, second, 1)
    np.testing.assert_allclose(probs.sum(1) + illegal, 1.0)
    assert (unresolved == 0).all()  # one token: every completion is enumerated
    out = coordination.exact_eval(t.sampler, t.task)
    assert out["eval/exact_unresolved"] == 0 and -1.0 <= out["eval/exact_sampled"] <= 10.0


def test_a_large_vocabularys_tail_below_min_prob_is_summed_into_unresolved(tmp_path, monkeypatch):
    """With a 49k vocabulary every token has some mass at temperature 1; decoding each would take minutes. Over
    MAX_EXACT_TAIL such continuations their mass is `unresolved` in one sum; the rest is as exact as before."""
    t = trainer(tmp_path, "max_new_tokens=1")
    first, second = coordination.observations(t.task, coordination.table_of(t.task.game))
    exact = coordination.move_probabilities(t.team, t.sampler.params, t.task, second, 1, min_prob=0.02)
    monkeypatch.setattr(coordination, "MAX_EXACT_TAIL", 0)  # the tiny model's ~100 tokens count as a large tail
    probs, illegal, unresolved = coordination.move_probabilities(t.team, t.sampler.params, t.task, second, 1,
                                                                 min_prob=0.02)
    assert (unresolved > 0).all()
    np.testing.assert_allclose(probs.sum(1) + illegal + unresolved, 1.0)  # no mass lost or counted twice
    assert (probs <= exact[0] + 1e-12).all() and (illegal <= exact[1] + 1e-12).all()
    np.testing.assert_allclose(exact[0].sum(1) + exact[1] - probs.sum(1) - illegal, unresolved)


def test_the_sampling_policys_exact_value_is_enumerated_only_for_a_small_vocabulary(tmp_path, monkeypatch):
    t = trainer(tmp_path, "max_new_tokens=1")
    assert coordination.enumerable(t.team) and "eval/exact_sampled" in t.evaluate()
    monkeypatch.setattr(coordination, "MAX_ENUMERATED_VOCAB", 50)  # as for SmolLM2's 49k tokens
    out = t.evaluate()
    assert "eval/exact_sampled" not in out and "eval/exact_greedy" in out


class ByEpisode:
    """Answers by the sample's key ("game", step, deal, episode, decision): player 0 plays move 1 or 2 by its
    episode index mod 2, player 1 too, so the returns of a deal's episodes differ."""

    def sample(self, requests, n, params=None, keys=None):
        return Rollout(requests, [[str(1 + key[3] % 2)] * n for key in keys])


def test_cross_games_branch_the_first_move_and_score_it_by_its_continuations(tmp_path):
    cfg = load_config("tiny_hanabi", overrides=[f"run_dir={tmp_path / 'run'}", "progress=false", "eval_every=0",
                                                "batch_size=2", "num_generations=2", "joint_mode=cross",
                                                "advantage_mode=marginal"])
    t = GameTrainer(cfg, sampler=ByEpisode(), **QUIET)
    rounds = t.sample(t.batch_items(0))
    assert len(t.episodes) == 2 * 4  # deals x G^2
    first = [ep.decisions[0]["move"] for ep in t.episodes]
    assert first == ["p0a0", "p0a0", "p0a1", "p0a1"] * 2  # episodes 2k and 2k+1 share their first move
    assert [ep.decisions[1]["move"] for ep in t.episodes] == ["p1a0", "p1a1"] * 4
    R = t.returns.reshape(2, 2, 2)  # (deal, first move, continuation)
    assert R[:, 1].tolist() == [[4.0, 8.0]] * 2  # (a1, a0) pays 4 and (a1, a1) 8 on every deal
    M = R.mean(-1)  # a first move's return: the mean over its continuations
    np.testing.assert_allclose(rounds[0].advantages, np.repeat(M - M.mean(-1, keepdims=True), 2).ravel())
    np.testing.assert_allclose(rounds[1].advantages, (R - R.mean(-1, keepdims=True)).ravel())
    assert not np.allclose(rounds[0].advantages, rounds[1].advantages)
    lenient = GameTrainer(load_config("tiny_hanabi", overrides=[
        f"run_dir={tmp_path / 'lenient'}", "progress=false", "eval_every=0", "batch_size=2", "num_generations=2",
        "joint_mode=cross", "advantage_mode=marginal", "leniency=1"]), sampler=ByEpisode(), **QUIET)
    rounds = lenient.sample(lenient.batch_items(0))
    best = R.max(-1)  # leniency 1: a first move's return is its best continuation
    np.testing.assert_allclose(rounds[0].advantages, np.repeat(best - best.mean(-1, keepdims=True), 2).ravel())
    np.testing.assert_allclose(rounds[1].advantages, (R - R.mean(-1, keepdims=True)).ravel())  # later: unchanged


def test_the_role_baseline_is_checkpointed_and_a_resumed_run_continues_it_exactly(tmp_path):
    whole = trainer(tmp_path, "advantage_mode=role", "num_steps=4", "save_every=2", name="whole")
    whole.train()
    state = json.loads((tmp_path / "whole" / "ckpt" / "step_000004" / "state.json").read_text())
    np.testing.assert_array_equal(state["advantage"]["role_baseline"], whole.role_baseline)
    half = trainer(tmp_path, "advantage_mode=role", "num_steps=4", "save_every=2", name="half")
    half.train(max_steps=3)  # past the checkpoint of step 2: step 3 is run again after the resume
    resumed = GameTrainer.from_run(tmp_path / "half", **QUIET)
    assert resumed.step == 2
    resumed.train()
    np.testing.assert_array_equal(resumed.role_baseline, whole.role_baseline)
    rows = [json.loads(line) for line in open(tmp_path / "whole" / "metrics.jsonl")]
    again = [json.loads(line) for line in open(tmp_path / "half" / "metrics.jsonl")]
    assert [r["advantage/abs_mean"] for r in again] == [r["advantage/abs_mean"] for r in rows]


@pytest.mark.slow
def test_the_role_baseline_on_two_processes_equals_one_process(tmp_path):
    from test_distributed import launch

    one = trainer(tmp_path, "advantage_mode=role", "batch_size=4", "num_steps=2", "save_every=2", name="one")
    one.train()
    launch(2, "--preset", "tiny_hanabi", "--run-dir", str(tmp_path / "two"), "--set", "advantage_mode=role",
           "--set", "batch_size=4", "--set", "num_generations=2", "--set", "num_steps=2", "--set", "save_every=2",
           "--set", "eval_every=0", "--set", "progress=false")
    two = json.loads((tmp_path / "two" / "ckpt" / "step_000002" / "state.json").read_text())
    np.testing.assert_allclose(two["advantage"]["role_baseline"], one.role_baseline, rtol=1e-12)


def test_a_game_decision_gets_its_return_minus_its_players_baseline(tmp_path):
    t = trainer(tmp_path, "advantage_mode=role", "role_baseline_decay=0.25")
    t.role_baseline = np.array([[1.0, 2.0]])  # (1, players)
    rounds = t.sample(t.batch_items(0))
    for r in rounds:  # tiny_hanabi: decision 0 is player 0's, decision 1 player 1's
        np.testing.assert_allclose(r.advantages, t.returns[r.episodes] - [1.0, 2.0][r.index])
    mean = t.returns.mean()
    np.testing.assert_allclose(t.role_baseline, [[0.25 * 1 + 0.75 * mean, 0.25 * 2 + 0.75 * mean]])


def test_the_bench_skips_methods_this_tree_cannot_run_and_counts_seeds_at_the_optimum():
    import importlib.util

    from kit.tasks.coordination import __file__ as kit_file

    path = kit_file.replace("kit/tasks/coordination.py", "bench/coordination.py")
    spec = importlib.util.spec_from_file_location("coordination_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.METHODS["nothing_here"] = ["no_such_field=1"]
    assert "no_such_field" in bench.runnable("nothing_here")
    assert bench.runnable("magrpo") is None
    rows = [{"method": "role", "game": "E", "steps": 300, "seed": s, "greedy": g, "sampled": 7.0, "optimum": 10.0,
             "reached": g == 10.0, "s_per_step": 0.2, "moves": {"player_0": m}}
            for s, g, m in ((0, 10.0, [0, 2]), (1, 8.0, [1, 1]))]  # seed 0 signals its card, seed 1 is card-blind
    assert "| E (10, 8) | role | 0-1 (2) | 1/2 | 1/2 | 9.000 | 7.000 | 1/2 | 0.200 |" in bench.table(rows)
