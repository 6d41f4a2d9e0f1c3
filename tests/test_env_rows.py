"""Environments and tools (issue 52), rows and runs: rows as a task, training, evaluation and baselines with an
environment, each joint action's world and shares reaching the rewards.

Run: python -m pytest tests/test_env_rows.py
"""

import json

import pytest

from env_helpers import team, keys, play, key_cfg, Skipper, QUIET

from kit.engine import tools
from kit.engine.rollout import SamplingParams
from kit.run.config import ConfigError, load_config
from kit.sandbox.envhost import EnvHost, EnvironmentClassError
from kit.tasks.environments import KeyHalves, key_rows


def test_rows_are_a_task_and_bad_rows_are_named(tmp_path):
    from kit.tasks import DataError, get_task

    path = key_rows(tmp_path / "rows.jsonl", 5)
    task = get_task("rows", 2, file=str(path), num_eval=2, roles=["left", "right"])
    train, held = task.load("train"), task.load("eval")
    assert len(train) == 3 and len(held) == 2 and train[0]["reset_row"]["key"] == train[0]["key"]
    assert task.prompts(train[0])[1].startswith("You are the right, one of a team of 2 agents: left, right.")
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}]}) + "\n")
    first = get_task("rows", 2, file=str(chat), num_eval=0).prompts(get_task("rows", 2, file=str(chat),
                                                                               num_eval=0).load("train")[0])[0]
    assert first.messages[0]["role"] == "system" and first.messages[1] == {"role": "user", "content": "hi"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    with pytest.raises(DataError, match="line 2, field 'prompt'"):
        get_task("rows", 2, file=str(bad)).load("train")


def test_the_config_refuses_what_an_environment_cannot_do():
    with pytest.raises(ConfigError, match="environment"):
        load_config("tiny_cpu", overrides=["environment=nocolon"])
    with pytest.raises(ConfigError, match="joint_mode"):
        load_config("tiny_cpu", overrides=["environment=a.b:C", "joint_mode=cross"])
    with pytest.raises(ConfigError, match="environment_args"):
        load_config("tiny_cpu", overrides=["environment_args={size: 3}"])  # arguments for no environment


def test_a_run_with_an_environment_trains_logs_tool_time_and_resumes_exactly(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    def perfless(rows):
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    done = Trainer(key_cfg(tmp_path, tmp_path / "ref"), **QUIET)
    done.train()
    done.close()
    stopped = Trainer(key_cfg(tmp_path, tmp_path / "run"), **QUIET)
    stopped.train(max_steps=2)
    stopped.close()
    again = Trainer(key_cfg(tmp_path, tmp_path / "run"), resume=True, **QUIET)
    again.train()
    again.close()
    ref = rundir.read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    assert perfless(rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")) == perfless(ref)
    assert all("perf/tool_s" in r and "reward/environment" in r for r in ref)
    logged = rundir.read_jsonl(tmp_path / "ref" / "rollouts.jsonl")
    assert logged and all(len(r["transcripts"]) == 2 for r in logged)
    assert all(r["reset"].startswith("The key has six digits.") for r in logged)  # what reset added to prompts


def test_each_joint_action_gets_its_own_worlds_reward():
    import types

    from kit.trainers.trainer import Trainer

    ro = types.SimpleNamespace(world_rewards=[[0.1, 0.7], [0.4, 0.2]])
    rewards = Trainer.score(types.SimpleNamespace(), ro, [None] * 4, [(0, 0), (1, 1)])
    assert [r.total for r in rewards] == [0.1, 0.7, 0.4, 0.2]
    assert rewards[1].parts == {"environment": 0.7}


def test_each_agents_own_share_of_its_world_is_a_local_part():
    import types

    from kit.trainers.trainer import Trainer

    ro = types.SimpleNamespace(world_rewards=[[0.5, 0.7], [0.4, 0.2]],
                               agent_rewards=[[[1.0, 0.0], [0.9, 0.5]], [[0.3, 0.5], [0.0, 0.4]]])
    rewards = Trainer.score(types.SimpleNamespace(), ro, [None] * 4, [(0, 0), (1, 1)])
    assert [r.total for r in rewards] == [0.5, 0.7, 0.4, 0.2]
    assert rewards[1].parts == {"environment": 0.7, "local_0": 0.9, "local_1": 0.5}  # world 0's sample 1
    assert rewards[2].parts == {"environment": 0.4, "local_0": 0.3, "local_1": 0.5}  # world 1's sample 0


def test_agent_rewards_come_from_the_child_and_bad_ones_are_named():
    host = EnvHost("scripted_envs:Shares", timeout_s=5)
    try:
        assert host.has_agent_rewards and "get_agent_rewards" not in host.tools
        host.reset([{"id": "a"}, {"id": "b"}])
        host.call(1, "set_shares", {"shares": "[0.5, 1]"})
        assert host.agent_rewards([0, 1], ["x", "y"]) == [[0.25, 0.75], [0.5, 1.0]]  # a list: the team's order
        host.call(1, "set_shares", {"shares": '{"y": 0.5, "x": 1}'})
        assert host.agent_rewards([1], ["x", "y"]) == [[1.0, 0.5]]  # a dict: by role, whatever its order
        assert host.agent_rewards([1], ["y", "x"]) == [[0.5, 1.0]]
        with pytest.raises(EnvironmentClassError, match=r"world 1: .*no share for role\(s\) \['z'\]"):
            host.agent_rewards([1], ["x", "z"])
        with pytest.raises(EnvironmentClassError, match=r"world 0: .*a list of 3 numbers"):
            host.agent_rewards([0], ["x", "y", "z"])
        host.call(0, "set_shares", {"shares": "[0.5, NaN]"})
        with pytest.raises(EnvironmentClassError, match="finite"):
            host.agent_rewards([0], ["x", "y"])
    finally:
        host.close()
    plain = EnvHost("scripted_envs:Recorder", timeout_s=5)
    plain.close()
    assert not plain.has_agent_rewards


@pytest.mark.parametrize("task", ["rows", "toy"])
def test_a_local_reward_weight_needs_the_environments_own_shares(tmp_path, task):
    """An environment that owns the reward must give the shares too, whether or not the task has a reward of its
    own (get_reward replaces it)."""
    from kit.trainers.trainer import Trainer

    rows = key_rows(tmp_path / "rows.jsonl", 6)
    args = [f"task_args={{file: {rows}, num_eval: 2}}"] if task == "rows" else []
    with pytest.raises(ValueError, match="gives no share per agent: give the class a get_agent_rewards"):
        Trainer(load_config("tiny_cpu", overrides=[
            f"run_dir={tmp_path / 'r'}", f"task={task}", *args, "environment=scripted_envs:Recorder",
            "local_reward_weight=0.5"]), **QUIET)


def test_each_worlds_shares_reach_each_agents_return(team, keys, tmp_path):
    """act -> score -> returns with local_reward_weight w: agent i's return is (1 - w) get_reward() + w share_i of
    its own world and sample, the shares read from what each row did (a submission in its transcript)."""
    from kit.trainers.trainer import Trainer

    saved = team.engines[0]
    team.engines[0] = Skipper(team.tokenizers[0], team.tokenizers[0].eos_token_id)
    try:
        ro, _ = play(team, keys, [{"id": "k0", "key": "123456"}, {"id": "k1", "key": "987654"}], G=2)
        assert ro.agent_rewards is None  # not asked for: local_reward_weight is 0
        trainer = Trainer(key_cfg(tmp_path, tmp_path / "run", "local_reward_weight=0.25", "batch_size=2",
                                  "max_new_tokens=200", "max_tool_calls=4"), team=team, **QUIET)
        levels = trainer.sample(trainer.batch_items(0))
        trainer.close()
    finally:
        team.engines[0] = saved
    level, N, G = levels[0], 2, 2
    own = level.rollout.agent_rewards
    shares = [[[0.5 + 0.5 * ("<tool_response>\nsubmitted\n" in level.rollout.transcripts[n * N + a][g])
                for a in range(N)] for g in range(G)] for n in range(len(level.nodes))]
    assert own == shares and len({s for node in shares for per in node for s in per}) == 2  # both kinds happen
    for n in range(len(level.nodes)):
        for j, idx in enumerate(level.joints):
            team_reward = level.rewards[n][j].total
            assert team_reward == pytest.approx(sum(shares[n][idx[0]]) / N)
            assert level.per_agent[n, :, idx[0]] == pytest.approx(
                [0.75 * team_reward + 0.25 * shares[n][idx[0]][a] for a in range(N)])


def test_01s_parameters_take_an_environment_and_rows(tmp_path):
    from kit import colab

    rows = key_rows(tmp_path / "rows.jsonl", 6)
    cfg = colab.notebook_config("tiny_cpu", "rows", {"file": str(rows), "roles": ["left", "right"]}, "keys",
                                environment="kit.tasks.environments:KeyHalves", **QUIET)
    assert cfg.environment == "kit.tasks.environments:KeyHalves" and cfg.task == "rows"


def test_a_built_in_task_runs_with_an_environment(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={tmp_path / 'run'}", "progress=false", "task=code", "task_args={dataset: coop}",
        "environment=kit.tasks.environments:CodeTests", "max_new_tokens=16", "num_steps=1", "batch_size=1",
        "num_generations=2", "eval_every=1", "num_eval_items=1", "save_every=0"])
    trainer = Trainer(cfg, **QUIET)
    trainer.train()
    trainer.close()
    rows = rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert "eval/reward_mean" in rows[-1] and "reward/structure" in rows[-1]  # the task's level reward
    assert all("transcripts" in r for r in rundir.read_jsonl(tmp_path / "run" / "rollouts.jsonl"))


def test_kit_eval_and_the_baselines_of_a_run_with_an_environment_act_as_in_training(tmp_path):
    from kit.analysis import baselines
    from kit.analysis.evaluate import evaluate_run
    from kit.trainers.trainer import Trainer

    cfg = key_cfg(tmp_path, tmp_path / "run", "num_steps=2")
    trainer = Trainer(cfg, **QUIET)
    trainer.train()
    trainer.close()
    rows = evaluate_run(tmp_path / "run", "newest", n=2, **QUIET)
    assert "reward/environment" in rows[0]
    said = []
    table = baselines.compare(tmp_path / "run", None, n=2, log=said.append)  # every method asked for
    assert [r["method"] for r in table] == ["naive", "magrpo"] and all("reward/environment" in r for r in table)
    assert any("skipped" in s and "get_reward" in s for s in said), said


def test_the_browser_shows_each_agents_tool_calls_and_results():
    from kit.analysis.explore import render_joint

    row = {"item": "k0", "step": 1, "prompts": ["p0", "p1"], "completions": ["done", "done"], "reward": 1.0,
           "parts": {"environment": 1.0},
           "transcripts": ['<tool_call>{"name": "read_left"}</tool_call><tool_response>\n123\n</tool_response>done',
                           "done"], "reset": "The key has <six> digits."}
    page = render_joint(row, ["left", "right"])
    assert "left's tool calls and results" in page and "&lt;tool_response&gt;" in page and "123" in page
    assert "reset added to each prompt</b>: The key has &lt;six&gt; digits." in page


def test_evaluation_leaves_no_environment_process_behind(tmp_path, monkeypatch):
    from kit.analysis import baselines
    from kit.analysis.evaluate import evaluate_run
    from kit.sandbox import envhost
    from kit.trainers.trainer import Trainer

    trainer = Trainer(key_cfg(tmp_path, tmp_path / "run", "num_steps=1", "save_every=1"), **QUIET)
    trainer.train()
    trainer.close()
    hosts = []
    real = envhost.EnvHost.__init__

    def track(self, *args, **kwargs):
        real(self, *args, **kwargs)
        hosts.append(self)

    monkeypatch.setattr(envhost.EnvHost, "__init__", track)
    evaluate_run(tmp_path / "run", "newest", n=1, num_items=1, **QUIET)
    baselines.compare(tmp_path / "run", ["naive"], n=1, num_items=1, **QUIET)
    assert len(hosts) == 2 and all(h._proc is None for h in hosts)


def test_a_reward_function_reads_the_world_its_joint_action_acted_on(tmp_path):
    import pickle

    from kit.analysis.evaluate import Acted, score
    from kit.tasks.rewards import RewardModel, Scorer

    host = EnvHost("scripted_envs:Ledger", timeout_s=10)
    try:
        host.reset([{"id": "a"}, {"id": "b"}])
        host.call(1, "note", {"text": "hi"})
        world = host.view(1)
        assert world.row == {"id": "b"} and world.notes == ["hi"] and host.view(0).notes == []
        assert world.shout("yes") == "YES"  # any method, not only the tools
        with pytest.raises(AttributeError, match="no attribute 'missing'"):
            world.missing
        with pytest.raises(TypeError, match="reward_pool=thread"):
            pickle.dumps(world)

        def ids(item, completions, environment):
            return float(environment.row["id"] == item["id"]) + len(environment.notes)

        model = RewardModel(None, [ids, lambda item, completions: 0.5], [1.0, 1.0])
        joints = [[Acted(("x", "y"), None, host.view(0))], [Acted(("x", "y"), None, host.view(1))]]
        for workers in (0, 2):  # in the trainer's thread and in reward threads
            got = score(Scorer(model, workers), [{"id": "a"}, {"id": "b"}], joints)
            assert [[r.total for r in per] for per in got] == [[1.5], [2.5]]
        assert pickle.loads(pickle.dumps(joints[0][0])) == ("x", "y")  # an Acted travels without its world
    finally:
        host.close()


def test_training_gives_each_joint_actions_world_to_the_reward_functions(tmp_path):
    from kit.run import rundir
    from kit.trainers.trainer import Trainer

    seen = []

    def same_world(item, completions, environment):
        seen.append((item["id"], environment.row["id"], environment.number))
        return float(environment.row["id"] == item["id"])

    cfg = key_cfg(tmp_path, tmp_path / "run", "environment=scripted_envs:Ledger", "num_steps=1")
    trainer = Trainer(cfg, reward_funcs=[same_world], **QUIET)
    trainer.train()
    trainer.close()
    assert len(seen) == 2 * 2 and all(a == b for a, b, _ in seen)  # 2 items x G=2 joint actions,
    assert len({world for _, _, world in seen}) == 4  # each its own world
    assert rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]["reward/mean"] == 1.0


def test_the_baselines_report_how_often_the_agents_called_a_tool(team, keys, tmp_path):
    from kit.analysis.baselines import run_method
    from kit.tasks import get_task

    task = get_task("rows", 2, file=str(key_rows(tmp_path / "rows.jsonl", 4)), num_eval=2, roles=["left", "right"])
    sampler = tools.ToolSampler(team, SamplingParams(max_new_tokens=200, temperature=1.0), keys, team.roles, 4)
    row = run_method("naive", sampler, task, load_config("tiny_cpu"), task.load("eval"), 2, scorer=None)
    assert row["tools/calls_per_completion"] == 2.0  # the scripted agents read their half, then submit it
    assert row["reward/mean"] == 1.0 and sampler.completions == 2 * 2 * 2  # items x agents x samples



def test_reset_gets_the_row_exactly_as_the_file_wrote_it(tmp_path, team):
    """task=rows: reset(**row) receives the JSONL row's own keys and no key of the kit's (an id, a reset row), so a
    TRL class whose reset names its fields without **kwargs works."""
    from kit.engine.rollout import SamplingParams
    from kit.sandbox.envhost import EnvHost
    from kit.tasks import get_task

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "hand in the key", "key": "123456", "note": "n"}) + "\n")
    task = get_task("rows", 2, file=str(path), num_eval=0, roles=["left", "right"])
    item = task.load("train")[0]
    host = EnvHost("scripted_envs:Strict")
    try:
        tools.act(team, [(a, p) for a, p in enumerate(task.prompts(item))], 1, SamplingParams(max_new_tokens=8),
                  worlds=[item], host=host, roles=team.roles, max_tool_calls=1, keys=[("t", a) for a in range(2)])
        assert json.loads(host.call(0, "show", {})) == {"prompt": "hand in the key", "key": "123456", "note": "n"}
    finally:
        host.close()


def test_the_helpers_aux_sent_after_mains_draft_runs_the_examples_with_mains_code():
    """CodeTests: main's tested entry point calls aux (a NameError then); the helper's aux sent next runs the
    examples with main's latest draft."""
    from kit.tasks.code import humaneval_problems
    from kit.tasks.environments import CodeTests

    env = CodeTests()
    env.reset(**humaneval_problems()[0])
    main = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    return aux(numbers) < threshold\n"
    assert "NameError" in env.run_tests(main)
    aux = "def aux(xs):\n    s = sorted(xs)\n    return min(b - a for a, b in zip(s, s[1:]))\n"
    assert env.run_tests(aux).count("ok: ") == 2
