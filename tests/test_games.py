"""Game tasks (kit/tasks/game.py) and episode rollouts (kit/tasks/games.py) on OpenSpiel's tiny_hanabi and hanabi."""

import importlib.util
import itertools
import json

import numpy as np
import pytest
import torch

pyspiel = pytest.importorskip("pyspiel")

from kit.run.config import load_config  # noqa: E402
from kit.trainers.game_trainer import GameTrainer  # noqa: E402
from kit.tasks.games import play  # noqa: E402
from kit.engine.rollout import Rollout  # noqa: E402
from kit.tasks.game import OpenSpielGame  # noqa: E402

QUIET = dict(log=lambda *_: None)


def tiny_hanabi_value(p0, p1) -> float:
    """Expected score of a deterministic joint policy: p0[card] -> move, p1[card * 3 + partner's move] -> move."""
    game, total = pyspiel.load_game("tiny_hanabi"), 0.0
    for c0, c1 in itertools.product(range(2), range(2)):
        s = game.new_initial_state()
        s.apply_action(c0)
        s.apply_action(c1)
        s.apply_action(p0[c0])
        s.apply_action(p1[c1 * 3 + p0[c0]])
        total += 0.25 * s.returns()[0]
    return total


def test_tiny_hanabi_optimum_by_enumerating_every_deterministic_joint_policy():
    values = [tiny_hanabi_value(p0, p1) for p0 in itertools.product(range(3), repeat=2)
              for p1 in itertools.product(range(3), repeat=6)]
    assert max(values) == 10.0 and len(values) == 9 * 729
    # the uniform random-legal team, played out over every deal and move: the mean over deterministic policies
    game, random_value = pyspiel.load_game("tiny_hanabi"), 0.0
    for c0, c1, a0, a1 in itertools.product(range(2), range(2), range(3), range(3)):
        s = game.new_initial_state()
        for action in (c0, c1, a0, a1):
            s.apply_action(action)
        random_value += s.returns()[0] / 36
    assert np.mean(values) == pytest.approx(random_value) and random_value < 0.8 * max(values)


def test_a_deal_follows_its_seed_and_the_prompt_numbers_the_legal_moves():
    task = OpenSpielGame(2, "tiny_hanabi")
    a, b = task.reset(7), task.reset(7)
    assert a.state.history() == b.state.history()  # the chance outcomes of a seed
    assert {tuple(task.reset(s).state.history()) for s in range(40)} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    prompt = task.prompt(a, task.player(a))
    assert "You are player 0" in prompt and "1. p0a0\n2. p0a1\n3. p0a2" in prompt
    assert "Answer with the number" in prompt


def test_parsing_a_move_by_number_or_by_its_text_and_illegal_output_is_data():
    task = OpenSpielGame(2, "tiny_hanabi", illegal_penalty=0.5)
    ep = task.reset(0)
    assert task.parse(ep, "Move 2.") == 1 and task.parse(ep, "I pick p0a2") == 2
    assert task.parse(ep, "7") is None and task.parse(ep, "no idea") is None
    record = task.step(ep, "no idea")  # illegal: counted, a random legal move instead
    assert record["legal"] is False and record["move"] in task.moves(task.reset(0)) and ep.illegal == 1
    task.step(ep, "1")
    assert task.terminal(ep) and task.score(ep) == task.game_score(ep) - 0.5
    ending = OpenSpielGame(2, "tiny_hanabi", illegal="end")
    ep = ending.reset(0)
    ending.step(ep, "xyz")
    assert ending.terminal(ep) and ep.length == 1 and ep.decisions[0]["move"] is None


def test_hanabi_moves_by_their_text_and_bad_settings_are_refused():
    task = OpenSpielGame(2, "hanabi", max_decisions=4)
    ep = task.reset(3)
    assert "Legal moves:\n1. (Play 0)" in task.prompt(ep, 0) and "Fireworks" in task.prompt(ep, 0)
    last = task.moves(ep)[-1]
    assert last.startswith("(Reveal player +1") and task.parse(ep, f"I choose {last}") == task.legal(ep)[-1]
    for _ in range(4):
        task.step(ep, "1")
    assert task.terminal(ep) and ep.ended  # max_decisions
    from kit.tasks import describe

    assert describe(task) == "game 'hanabi' (player_0, player_1): turn-based episodes, return = score"
    with pytest.raises(ValueError, match="illegal='skip'"):
        OpenSpielGame(2, "tiny_hanabi", illegal="skip")
    with pytest.raises(ValueError, match="has 2 players but num_agents=3"):
        OpenSpielGame(3, "tiny_hanabi")


def test_the_illegal_move_fallback_leaves_the_deals_chance_outcomes_shared():
    # one episode of a deal names no move and gets the fallback; its twin names that same move: every card either
    # draws afterwards (a chance event after each play) must then be the same
    task = OpenSpielGame(2, "hanabi")
    a, b = task.reset(5), task.reset(5)
    fallback = task.step(a, "no idea")
    assert not fallback["legal"] and task.step(b, fallback["move"])["legal"]
    while not task.terminal(a):
        task.step(a, "(Play 0)")
        task.step(b, "(Play 0)")
    assert len(a.state.history()) > 10 + a.length + 1  # 10 cards dealt, the moves, and cards drawn after them
    assert a.state.history() == b.state.history()


def test_the_illegal_move_fallback_is_the_same_for_a_deals_episodes_and_varies_over_deals():
    task = OpenSpielGame(2, "hanabi")
    first = {seed: task.step(task.reset(seed), "no idea")["move"] for seed in range(12)}
    assert task.step(task.reset(3), "xyz")["move"] == first[3]  # twin episodes, the same failure, the same move
    assert len(set(first.values())) > 1


class ScriptedSampler:
    """Answers every request with a fixed text and records each call (rows, acting agents)."""

    def __init__(self, answer="1"):
        self.answer, self.calls = answer, []

    def sample(self, requests, n, params=None, keys=None):
        self.calls.append([agent for agent, _ in requests])
        return Rollout(requests, [[self.answer] * n for _ in requests])


def test_every_decision_of_every_live_episode_is_one_sample_call_routed_to_the_acting_player():
    task = OpenSpielGame(2, "hanabi", max_decisions=5)
    sampler = ScriptedSampler("1")
    episodes, rounds = play(sampler, task, seeds=[1, 2, 3], G=2, keys=[("k", d) for d in range(3)])
    # always "(Play 0)": some deals lose their 3 lives by the 5th decision and drop out of the batch
    assert len(sampler.calls) == 5 and [len(c) for c in sampler.calls][:4] == [6] * 4  # 3 deals x G=2
    assert sum(len(c) for c in sampler.calls) == sum(ep.length for ep in episodes)  # one row per decision
    assert [r.episodes for r in rounds][-1] == [e for e, ep in enumerate(episodes) if ep.length == 5]
    assert sampler.calls[0] == [0] * 6 and sampler.calls[1] == [1] * 6  # players act in turn
    assert all(task.terminal(ep) for ep in episodes)


def game_config(tmp_path, *extra):
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'run'}", "task=game", "batch_size=2",
                                              "num_generations=4", "eval_every=0", "save_every=0",
                                              "progress=false", "num_eval_items=2", *extra])


class KeyedSampler:
    """tiny_hanabi moves chosen by the sample's key (step, deal position, episode, decision): deal position 0
    plays legal moves that differ by episode, deal position 1 names no move at all (the fallback and a penalty)."""

    def sample(self, requests, n, params=None, keys=None):
        texts = [["x" if key[2] == 1 else str(1 + (key[3] + key[4]) % 3)] for key in keys]
        return Rollout(requests, texts)


GROUP_ADVANTAGES = {  # the advantage fields on a (deals, G) array of returns, by hand
    "advantage_mode=mean": lambda r: r - r.mean(1, keepdims=True),
    "advantage_mode=rloo": lambda r: r - (r.sum(1, keepdims=True) - r) / (r.shape[1] - 1),
    "scale_rewards=true": lambda r: (r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6),
    "advantage_clip=0.5": lambda r: np.clip(r - r.mean(1, keepdims=True), -0.5, 0.5),
}


@pytest.mark.parametrize("field", GROUP_ADVANTAGES)
def test_the_baseline_of_a_game_episode_is_its_own_deals(tmp_path, field):
    cfg = game_config(tmp_path, "task_args={game: tiny_hanabi, prompt_style: compact}", "num_generations=3", field)
    trainer = GameTrainer(cfg, sampler=KeyedSampler(), **QUIET)
    rounds = trainer.sample(trainer.batch_items(0))
    returns = trainer.returns.reshape(2, 3)  # (deals, G)
    assert returns[0].mean() != returns[1].mean()  # a batch-wide baseline would differ from the per-deal ones
    expected = GROUP_ADVANTAGES[field](returns).reshape(-1)
    np.testing.assert_allclose(trainer._advantages, expected)
    np.testing.assert_allclose(rounds[1].advantages, expected[rounds[1].episodes])  # what the update reads


def test_a_share_of_the_deals_plays_the_episodes_they_play_in_the_whole_batch(tmp_path):
    # a process's deals are seeded by their places in the global batch, not by their places in its share
    cfg = game_config(tmp_path, "task_args={game: tiny_hanabi, prompt_style: compact}", "batch_size=4",
                      "num_generations=2")
    trainer = GameTrainer(cfg, **QUIET)
    items = trainer.batch_items(0)
    trainer.sample(items)
    whole = [[d["completion"] for d in ep.decisions] for ep in trainer.episodes]  # 4 deals x 2 episodes
    trainer.sample([items[1], items[3]], positions=[1, 3])  # process 1 of 2
    assert [[d["completion"] for d in ep.decisions] for ep in trainer.episodes] == whole[2:4] + whole[6:8]


def test_a_player_updates_on_its_own_decisions_only(tmp_path):
    # max_decisions=1: only player 0 ever acts, so player 1's adapter must not move at all
    cfg = game_config(tmp_path, "task_args={game: tiny_hanabi, prompt_style: compact, max_decisions: 1}",
                      "batch_size=4", "num_generations=8")
    trainer = GameTrainer(cfg, **QUIET)
    before = {a: [p.detach().clone() for p in trainer.team.parameters_of(a)] for a in trainer.team.adapters}
    trainer.train(max_steps=1)
    moved = {a: max(float((p.detach() - q).abs().max()) for p, q in zip(trainer.team.parameters_of(a), before[a]))
             for a in trainer.team.adapters}
    assert moved["agent_1"] == 0.0 and moved["agent_0"] > 0.0
    row = json.loads(open(tmp_path / "run" / "metrics.jsonl").readlines()[-1])
    assert row["decisions/player_0"] == 32 and row["decisions/player_1"] == 0
    assert 0.0 < row["illegal/rate"] < 1.0  # the returns differ, so player 0 has a gradient


def test_full_hanabi_runs_end_to_end_on_the_tiny_model(tmp_path):
    cfg = game_config(tmp_path, "task_args={game: hanabi, prompt_style: compact, max_decisions: 6}", "num_steps=2",
                      "eval_every=2", "micro_batch_size=4")  # an adapter's ~24 decisions update 4 rows at a time
    trainer = GameTrainer(cfg, **QUIET)
    summary = trainer.train()
    trainer.close()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    last = rows[-1]
    assert summary["steps"] == 2 and 1.0 <= last["episode/length"] <= 6.0  # max_decisions=6
    for key in ("score/mean", "score/max", "score/std", "illegal/rate", "decisions/player_0", "decisions/player_1",
                "loss/agent_0", "loss/agent_1", "eval/score_mean", "eval/illegal_rate"):
        assert key in last, key
    assert 0.0 < last["illegal/rate"] < 1.0  # the tiny model names illegal moves too: handled, not a crash
    episodes = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert len(episodes) == 2 * 2 * 4 and all(1 <= len(e["decisions"]) == e["length"] <= 6 for e in episodes)
    assert {"player", "prompt", "completion", "move", "legal"} <= set(episodes[0]["decisions"][0])
    # the explorer replays a logged game move by move, from its seed and its completions
    from kit.analysis import explore

    log = explore.RunLog(tmp_path / "run")
    row = max(log.rows(step=2), key=lambda r: r["length"])
    frames = log.replay(row)
    assert log.is_game and len(frames) == row["length"] + 1 and frames[-1]["player"] is None
    assert [f["move"] for f in frames[:-1]] == [d["move"] for d in row["decisions"]]
    assert "Fireworks" in frames[0]["state"] and frames[0]["player"] == 0 and frames[1]["player"] == 1
    assert ("score", row["score"]) in explore.breakdown(row) and log.best(2)["reward"] == max(
        r["reward"] for r in log.rows(step=2))
    broken = {**row, "decisions": [{**row["decisions"][0], "move": "(Play 9)"}, *row["decisions"][1:]]}
    with pytest.raises(ValueError, match="replays as"):
        log.replay(broken)
    if importlib.util.find_spec("ipywidgets"):
        box = explore.browser(tmp_path / "run")
        widgets = {type(w).__name__: w for w in box.children}
        nav = box.children[5].children  # previous, decision slider, next
        assert "<table>" in box.children[2].value and widgets["Dropdown"].options
        nav[2].click()
        assert nav[1].value == 1 and "decision 1" in box.children[6].value
        nav[0].click()
        assert "decision 0" in box.children[6].value
    resumed = GameTrainer.from_run(tmp_path / "run", ["num_steps=3"], **QUIET)  # a checkpoint resumes
    assert resumed.step == 2 and torch.is_tensor(resumed.team.parameters_of("agent_0")[0])


def test_random_and_rule_players_on_the_same_deals():
    from kit.tasks.games import POLICIES, episode_metrics, play_policy
    from kit.tasks.game import hanabi_rule

    tiny = OpenSpielGame(2, "tiny_hanabi")
    seeds = list(range(200))
    rule = episode_metrics(tiny, play_policy(tiny, seeds, 1, POLICIES["rule"]), 1)
    assert rule["score/mean"] == 8.0 and rule["illegal/rate"] == 0.0  # the middle move, whatever the cards
    rand = play_policy(tiny, seeds, 2, POLICIES["random"])
    assert abs(episode_metrics(tiny, rand, 2)["score/mean"] - 3.72) < 0.6  # 3.72: the exact random-legal value
    assert [ep.state.history() for ep in rand] == [ep.state.history() for ep in play_policy(tiny, seeds, 2,
                                                                                           POLICIES["random"])]
    hanabi = OpenSpielGame(2, "hanabi")
    scores = [hanabi.game_score(ep) for ep in play_policy(hanabi, list(range(20)), 1, POLICIES["rule"])]
    assert np.mean(scores) > 8  # random-legal play scores ~0 (it loses its lives)
    # the rule's order of preference, on hand-written tables
    seen = """Life tokens: 3\nInfo tokens: 7\nFireworks: R0 Y1 G0 W0 B0 \nHands:\nCur player
XX || XX|RYGWB12345\nXX || Y2|Y2\n-----\nW1 || XX|RYGWB12345\nR3 || XX|RYGWB12345\nDeck size: 30\nDiscards:"""
    moves = ["(Discard 0)", "(Discard 1)", "(Play 0)", "(Play 1)", "(Reveal player +1 color W)",
             "(Reveal player +1 rank 1)"]
    assert hanabi_rule(seen, moves) == "(Play 1)"  # known to be Y2 on Y1: play it
    unknown = seen.replace("XX || Y2|Y2", "XX || XX|RYGWB12345")
    assert hanabi_rule(unknown, moves) == "(Reveal player +1 rank 1)"  # the partner's W1 is playable: hint it
    assert hanabi_rule(unknown.replace("W1 ||", "W3 ||"), moves) == "(Discard 0)"  # nothing to play or hint


def test_a_game_run_is_evaluated_over_checkpoints_and_against_its_baselines(tmp_path, capsys):
    from kit.__main__ import main
    from kit.analysis.baselines import compare
    from kit.analysis.evaluate import RunContext, evaluate_run

    cfg = game_config(tmp_path, "task_args={game: tiny_hanabi, prompt_style: compact}", "num_steps=4",
                      "save_every=2", "keep_last=1")
    GameTrainer(cfg, **QUIET).train()
    ctx = RunContext(tmp_path / "run", num_items=6, log=lambda *_: None)
    rows = evaluate_run(tmp_path / "run", "all", n=3, ctx=ctx, log=lambda *_: None)
    assert [r["step"] for r in rows] == [0, 2, 4]  # the base, then both checkpoints (step 2 from the history)
    for r in rows:
        assert r["num_items"] == 6 and r["num_samples"] == 3 and r["episode/length"] == 2.0
        assert {"score/mean", "greedy/score_mean", "illegal/rate", "decisions_per_s"} <= set(r)
    assert (tmp_path / "run" / "eval" / "step_000004.json").exists()
    again = evaluate_run(tmp_path / "run", [4], n=3, ctx=ctx, log=lambda *_: None)[0]
    assert again["score/mean"] == rows[-1]["score/mean"]  # seeded by deal, episode and decision
    table = compare(tmp_path / "run", n=3, ctx=ctx, log=lambda *_: None)
    assert [r["method"] for r in table] == ["random", "rule", "base", "magrpo"] and table[-1]["step"] == 4
    assert table[1]["score/mean"] == 8.0 and table[2]["score/mean"] == rows[0]["score/mean"]
    assert table[-1]["score/mean"] == rows[-1]["score/mean"]  # the same deals and noise as `kit eval`
    with pytest.raises(ValueError, match="unknown game baseline"):
        compare(tmp_path / "run", ["single"], ctx=ctx)
    ctx.close()
    assert main(["baselines", "--run-dir", str(tmp_path / "run"), "--n", "2", "--items", "4"]) == 0
    out = capsys.readouterr().out
    assert "| random |" in out and "| magrpo |" in out and (tmp_path / "run" / "eval" / "baselines.png").exists()
    assert main(["eval", "--run-dir", str(tmp_path / "run"), "--steps", "newest", "--n", "2"]) == 0
    assert "score/mean" in capsys.readouterr().out and (tmp_path / "run" / "eval" / "eval_curves.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_hanabi_self_play_reaches_80_percent_of_the_optimum_within_300_steps(seed):
    # bench/game_learning.py: the tiny_hanabi preset, scored exactly (the greedy team on each of the 4 deals)
    import importlib.util as iu
    from pathlib import Path

    spec = iu.spec_from_file_location("game_learning", Path(__file__).resolve().parents[1] / "bench" /
                                      "game_learning.py")
    bench = iu.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.learn(seed, steps=300, every=25, stop_at=0.8 * bench.OPTIMUM)
    assert result["first_step_at_80pct"] is not None and result["steps"] <= 300, result
    assert result["final"] >= 8.0 > 2 * 3.72  # random-legal play: 3.72 (test above)
