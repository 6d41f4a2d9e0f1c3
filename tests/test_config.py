"""Config loading and validation: bad input fails before any model loads, naming field, value, allowed.

Run: python -m pytest tests/test_config.py
"""

import json

import pytest

from kit.run.config import ConfigError, TrainConfig, load_config, preset, training_diff, to_dict


def test_presets_exist_and_validate():
    from kit.run.presets import PRESETS

    assert {"tiny_cpu", "colab_t4", "colab_a100", "smol_writing", "smol_code", "smol_hanabi"} <= set(PRESETS)
    for name in PRESETS:
        assert load_config(name).num_generations >= 2


def test_a_preset_is_a_fresh_config_each_time():
    """Presets are plain data (kit/run/presets.py): changing one run's task_args must not change the next run's."""
    first = preset("smol_code")
    first.task_args["dataset"] = "humaneval"
    first.lora_r = 4
    second = preset("smol_code")
    assert second.task_args == {"dataset": "coop", "prefill": "helper"} and second.lora_r == 16
    assert preset("tiny_hanabi").task_args is not preset("tiny_hanabi").task_args


def test_a_preset_names_only_fields_of_the_config():
    from kit.run.presets import PRESETS

    fields = set(TrainConfig.__dataclass_fields__)
    assert {name: sorted(set(values) - fields) for name, values in PRESETS.items()
            if set(values) - fields} == {}


def test_colab_a100_is_the_paper_recipe_in_4bit():
    cfg = preset("colab_a100")
    assert (cfg.model_name, cfg.num_agents, cfg.num_generations, cfg.max_new_tokens) == \
        ("Qwen/Qwen2.5-Coder-3B-Instruct", 2, 4, 256)
    assert (cfg.temperature, cfg.top_p, cfg.lora_r, cfg.lora_alpha, cfg.quantization) == (0.7, 0.9, 16, 32, "auto")
    assert cfg.task == "code" and cfg.reward_workers > 0


def test_unknown_preset_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"preset='big'.*tiny_cpu, colab_t4, colab_a100"):
        load_config("big")


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="unknown config field 'num_generation'.*num_generations"):
        load_config("tiny_cpu", overrides=["num_generation=4"])


def test_wrong_type_names_field_value_and_type():
    with pytest.raises(ConfigError, match=r"num_generations='four'.*allowed: int"):
        load_config(overrides=["num_generations=four"])


def test_group_of_one_is_refused():
    with pytest.raises(ConfigError, match=r"num_generations=1 .*>= 2"):
        load_config(overrides=["num_generations=1"])


def test_zero_agents_is_refused():
    with pytest.raises(ConfigError, match=r"num_agents=0 .*>= 1"):
        load_config(overrides=["num_agents=0"])


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_top_p_outside_unit_interval_is_refused(value):
    with pytest.raises(ConfigError, match=r"top_p=.*\(0, 1\]"):
        load_config(overrides=[f"top_p={value}"])


def test_choice_fields_list_their_choices():
    with pytest.raises(ConfigError, match="joint_mode='pairs'.*aligned, cross"):
        load_config(overrides=["joint_mode=pairs"])


def test_unknown_task_lists_the_tasks():
    with pytest.raises(ConfigError, match="task='chess'.*toy"):
        load_config(overrides=["task=chess"])


def test_bad_reward_processor_is_named():
    with pytest.raises(ConfigError, match="reward_processor='scale\\(2\\)\\|cube'"):
        load_config(overrides=["reward_processor=scale(2)|cube"])


def test_overrides_parse_numbers_bools_lists_and_null():
    cfg = load_config(overrides=["learning_rate=1e-4", "use_wandb=true", "reward_weights=[1, 0.5]",
                                 "advantage_clip=null", "lora_target_modules=[q_proj, v_proj]"])
    assert cfg.learning_rate == 1e-4 and cfg.use_wandb is True
    assert cfg.reward_weights == [1.0, 0.5] and cfg.advantage_clip is None
    assert cfg.lora_target_modules == ["q_proj", "v_proj"]


def test_yaml_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("preset: tiny_cpu\nlearning_rate: 0.01\nnum_steps: 7\n")
    cfg = load_config(path=f, overrides=["num_steps=9"])
    assert (cfg.model_name, cfg.learning_rate, cfg.num_steps) == ("tiny", 0.01, 9)


def test_json_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"num_generations": 6}))
    assert load_config(path=f).num_generations == 6


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(path=tmp_path / "nope.yaml")


def test_training_diff_ignores_logging_fields_and_lists_training_ones():
    old = to_dict(TrainConfig())
    new = TrainConfig(save_every=1, eval_every=3, learning_rate=0.5, seed=3)
    assert training_diff(old, new) == ["learning_rate: 0.0001 -> 0.5", "seed: 0 -> 3"]


@pytest.mark.parametrize("override", ["learning_rate=.inf", "learning_rate=.nan", "weight_decay=-.inf",
                                      "judge_budget_usd=.inf", "advantage_clip=.nan", "reward_weights=[1, .inf]"])
def test_infinite_and_nan_floats_are_refused_by_name(override):
    name = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{name}=.*allowed: a finite number"):
        load_config("tiny_cpu", overrides=[override])


@pytest.mark.parametrize("override, allowed", [("judge_timeout_s=0", "> 0"), ("judge_max_retries=-1", ">= 0"),
                                               ("judge_max_failures=0", ">= 1"), ("judge_cooldown_s=-5", ">= 0")])
def test_the_judge_failure_policy_fields_are_validated(override, allowed):
    with pytest.raises(ConfigError, match=rf"^{override.split('=')[0]}=.*allowed: .*{allowed}"):
        load_config("tiny_cpu", overrides=[override])


def test_a_yaml_syntax_error_in_the_config_file_names_the_file_and_line(tmp_path, capsys):
    from kit.__main__ import main as cli

    path = tmp_path / "my.yaml"
    path.write_text("learning_rate: 1e-4\ntask_args: {dataset: coop\n")
    assert cli(["train", "--preset", "tiny_cpu", "--config", str(path)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("config error:") and str(path) in said and "line 3" in said and "Traceback" not in said


def test_a_json_error_in_a_runs_config_names_the_file(tmp_path, capsys):
    from kit.__main__ import main as cli

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"task": "toy",\n')
    assert cli(["train", "--run-dir", str(tmp_path / "run"), "--resume"]) == 2
    said = capsys.readouterr().err
    assert str(tmp_path / "run" / "config.json") in said and "not valid JSON" in said
    from kit.run.config import check_resume

    with pytest.raises(ConfigError, match="config.json' is not valid JSON"):  # what 01_train's resume calls
        check_resume(tmp_path / "run" / "config.json", preset("tiny_cpu"))


@pytest.mark.parametrize("preset_name, says", [("tiny_cpu", "one turn: every row of a step answers one prompt"),
                                               ("tiny_hanabi", "the first mover's first decision has one state")])
def test_a_v_critic_that_advantage_normalization_cancels_is_warned(preset_name, says):
    """batch_size=1: one prompt (one deal) a step, so a V critic's value there is one number that the normalisation
    takes away with the mean. Two prompts a step, or no normalisation, and it is not."""
    import warnings

    for algorithm in ("iac", "maac"):
        base = [f"algorithm={algorithm}", "critic_type=v", "batch_size=1"]
        with pytest.warns(UserWarning, match=says):
            load_config(preset_name, overrides=base)
        for fix in ("batch_size=2", "advantage_normalization=false", "critic_type=q"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                load_config(preset_name, overrides=[*base, fix])


@pytest.mark.parametrize("name, run", [("coder_mbpp", "table_mbpp_team_s41"),
                                       ("coder_mbpp_single", "table_mbpp_single_s41")])
def test_the_code_table_presets_are_the_configs_its_rows_were_trained_with(name, run):
    """The code table (bench/code_table.py, issue 78) trains the presets as they are: the team's and the trained
    single model's presets must train the same maths as the table's fresh-seed runs (seed, folder, evaluation and
    save cadence and progress bars aside), so the README's `--preset coder_mbpp` is the table's MAGRPO row."""
    import dataclasses
    import json
    from pathlib import Path

    kept = Path(__file__).resolve().parents[1] / "bench" / "results" / "runs" / run / "config.json"
    measured = json.loads(kept.read_text())
    ours = dataclasses.asdict(preset(name))
    differ = {k for k in ours if k in measured and ours[k] != measured[k]}
    assert differ <= {"seed", "run_dir", "eval_every", "save_every", "progress", "model_sources"}, differ
    assert ours["num_steps"] == 30 and ours["learning_rate"] == 3e-5 and ours["task_args"]["dataset"] == "mbpp"
