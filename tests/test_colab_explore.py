"""Drive mirroring and restore, the notebook helpers, and the rollout browser's logic (no browser needed).

Run: python -m pytest tests/test_colab_explore.py
"""

import json
import shutil
from pathlib import Path

import pytest

from kit import colab
from kit.analysis import explore
from kit.run import mirror, rundir
from kit.run.checkpoint import complete_checkpoints
from kit.run.config import load_config
from kit.trainers.trainer import Trainer


def cfg_for(tmp_path, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={tmp_path / 'local'}", "progress=false", "num_steps=4",
                                              "save_every=2", "eval_every=0", "batch_size=2", "num_generations=2",
                                              *overrides])


def test_mirror_copies_each_checkpoint_and_the_logs(tmp_path):
    cfg = cfg_for(tmp_path, f"mirror_dir={tmp_path / 'drive'}")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train()
    trainer.close()
    drive = tmp_path / "drive"
    assert [p.name for p in complete_checkpoints(drive)] == ["step_000004", "step_000002"]
    assert (drive / "metrics.jsonl").read_text() == (tmp_path / "local" / "metrics.jsonl").read_text()
    assert not list(drive.rglob(".*partial"))  # no temporary copies left behind


def test_a_half_copied_checkpoint_on_drive_is_never_taken_as_complete(tmp_path):
    src = tmp_path / "src" / "ckpt" / "step_000002"
    src.mkdir(parents=True)
    (src / "COMPLETE").write_text("2")
    (src / "big.bin").write_bytes(b"x" * 1000)
    dst = tmp_path / "drive" / "ckpt" / "step_000002"
    real_copyfile = shutil.copyfile

    def dies_midway(a, b, **kw):  # COMPLETE is copied first (sorted), then the copy dies: the worst moment
        if not str(a).endswith("COMPLETE"):
            raise OSError("runtime disconnected")
        return real_copyfile(a, b, **kw)

    shutil.copyfile = dies_midway
    try:
        with pytest.raises(OSError):
            mirror._copy_tree(src, dst)
    finally:
        shutil.copyfile = real_copyfile
    assert complete_checkpoints(tmp_path / "drive") == [] and not dst.exists()


def test_restore_after_a_disconnect_then_resume_matches_an_uninterrupted_run(tmp_path):
    straight = Trainer(cfg_for(tmp_path / "a"), log=lambda *_: None)
    straight.train()
    cfg = cfg_for(tmp_path / "b", f"mirror_dir={tmp_path / 'b' / 'drive'}")
    first = Trainer(cfg, log=lambda *_: None)
    first.train(max_steps=2)
    first.close()
    shutil.rmtree(tmp_path / "b" / "local")  # the runtime's disk is gone
    resumed = colab.start_or_resume(cfg, log=lambda *_: None)
    assert resumed.step == 2
    resumed.train()
    resumed.close()
    a = [json.loads(line) for line in open(tmp_path / "a" / "local" / "metrics.jsonl")]
    b = [json.loads(line) for line in open(tmp_path / "b" / "local" / "metrics.jsonl")]

    def training(rows):
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]

    assert training(a) == training(b)


def test_start_or_resume_starts_fresh_when_there_is_nothing(tmp_path):
    trainer = colab.start_or_resume(cfg_for(tmp_path, f"mirror_dir={tmp_path / 'empty'}"), log=lambda *_: None)
    assert trainer.step == 0


def test_secret_comes_from_the_environment_only_outside_colab(monkeypatch):
    monkeypatch.setenv("KIT_TEST_SECRET", "s3cret")
    assert colab.secret("KIT_TEST_SECRET") == "s3cret"
    monkeypatch.delenv("KIT_TEST_SECRET")
    assert colab.secret("KIT_TEST_SECRET") is None


def test_outside_colab_drive_is_one_line_and_none():
    said = []
    assert colab.mount_drive(log=said.append) is None and len(said) == 1


def test_the_gpu_line_names_the_card_or_says_how_to_get_one(monkeypatch):
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "Change runtime type > GPU" in colab.gpu_summary()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    card = types.SimpleNamespace(name="NVIDIA A100-SXM4-40GB", total_memory=40 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: card)
    assert colab.gpu_summary() == "NVIDIA A100-SXM4-40GB, 40.0 GiB"


# --- the explorer


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("explore") / "code"
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={run}", "progress=false", "task=code",
                                             "task_args={dataset: coop}", "num_steps=2", "batch_size=2",
                                             "num_generations=2", "max_new_tokens=8", "eval_every=0"])
    Trainer(cfg, log=lambda *_: None).train()
    return run


def test_runlog_filters_by_step_reward_and_part(code_run):
    log = explore.RunLog(code_run)
    assert log.steps() == [1, 2] and log.roles == ["helper", "main"]
    assert len(log.rows(step=1)) == 2 * 2  # items x aligned joint actions
    assert {"structure", "syntax", "tests", "cooperation"} <= set(log.parts())
    assert log.rows(min_reward=0.1) == [r for r in log.all_rows if r["reward"] >= 0.1]
    assert log.rows(part="tests", part_min=0.5) == []


def test_best_is_the_highest_reward_of_the_newest_step(code_run):
    log = explore.RunLog(code_run)
    assert log.best() == max(log.rows(step=2), key=lambda r: r["reward"])
    assert log.best(step=1)["step"] == 1


def test_breakdown_and_render_show_parts_completions_and_advantages(code_run):
    log = explore.RunLog(code_run)
    row = log.rows(step=2)[0]
    names = [k for k, _ in explore.breakdown(row)]
    assert {"structure", "syntax", "tests", "cooperation"} <= set(names)
    assert {"total", "return", "advantage[0]", "advantage[1]"} <= set(names)
    row = dict(row, completions=["<script>x</script>", "ok"])
    page = explore.render_rows([row], log.roles)
    assert "&lt;script&gt;" in page and "<script>" not in page and "advantage" in page
    only_main = explore.render_rows([row], log.roles, agent=1)
    assert "<th>main</th>" in only_main and "<th>helper</th>" not in only_main


def test_rescore_an_edited_completion_with_the_tasks_reward(code_run):
    log = explore.RunLog(code_run)
    row = log.rows(step=1)[0]
    item = log.item(row["item"])
    helper, main = item["reference_pair"]
    assert log.rescore(dict(row, completions=[helper, row["completions"][1]]), 1, main).total == 4.0
    with pytest.raises(ValueError, match="agents 0..1"):
        log.rescore(row, 2, "x")


def test_browser_builds_its_widgets(code_run):
    pytest.importorskip("ipywidgets")
    box = explore.browser(code_run)
    html = [w for w in box.children if type(w).__name__ == "HTML"]
    assert any("<table>" in w.value for w in html)


def test_explorer_explains_a_run_without_rollouts(tmp_path):
    with pytest.raises(FileNotFoundError, match="log_rollouts"):
        explore.RunLog(tmp_path)


def test_restore_never_replaces_a_local_run_that_is_ahead_of_the_mirror(tmp_path):
    cfg = cfg_for(tmp_path, f"mirror_dir={tmp_path / 'drive'}", "keep_last=1")
    trainer = Trainer(cfg, log=lambda *_: None)
    trainer.train(max_steps=2)
    trainer.mirror.flush()
    trainer.mirror = None  # the mirror stops at step 2 (Drive unreachable)
    trainer.train()
    metrics = (tmp_path / "local" / "metrics.jsonl").read_text()
    assert mirror.restore(tmp_path / "drive", tmp_path / "local", log=lambda *_: None) == 4
    assert (tmp_path / "local" / "metrics.jsonl").read_text() == metrics


def test_notebook_config_mirrors_to_drive_and_smoke_swaps_in_the_tiny_preset(tmp_path, monkeypatch):
    import torch

    from kit.run.config import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # full mode needs a GPU (refused without)
    cfg = colab.notebook_config("colab_a100", "writing", {"kind": "arxiv"}, "mine", drive=tmp_path, num_steps=7,
                                judge_model="claude-sonnet-4-5", judge_budget_usd=3.0)
    assert cfg.model_name == "Qwen/Qwen2.5-Coder-3B-Instruct" and cfg.task_args == {"kind": "arxiv"}
    assert cfg.run_dir == str(Path("checkpoints/mine").absolute())  # absolute: the same after a chdir (issue 55)
    assert cfg.mirror_dir == str(tmp_path / "magrpo-kit/runs/mine")
    assert cfg.num_steps == 7 and cfg.use_judge_reward and cfg.judge_budget_usd == 3.0
    assert colab.notebook_config("colab_t4", "code", {}, "x", log=lambda *_: None).mirror_dir is None
    monkeypatch.setenv("KIT_SMOKE_DIR", str(tmp_path / "smoke"))
    smoke = colab.notebook_config("colab_a100", "code", {}, "x", judge_model="claude-sonnet-4-5", smoke=True)
    assert smoke.model_name == "tiny" and smoke.num_steps == 3 and smoke.judge_model is None
    with pytest.raises(ConfigError, match="task='poetry'"):
        colab.notebook_config("tiny_cpu", "poetry", {}, "x")


def test_a_colab_secret_is_never_exported_to_the_environment(monkeypatch):
    import sys
    import types as t

    userdata = t.SimpleNamespace(get=lambda name: "from-the-panel")
    monkeypatch.setitem(sys.modules, "google", t.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", t.SimpleNamespace(userdata=userdata))
    from kit import env

    monkeypatch.setattr(env, "in_colab", lambda: True)
    monkeypatch.delenv("KIT_TEST_SECRET", raising=False)
    assert colab.secret("KIT_TEST_SECRET") == "from-the-panel"
    assert "from-the-panel" not in repr(dict(__import__("os").environ))


def test_a_violation_is_shown_with_its_reason(code_run):
    log = explore.RunLog(code_run)
    row = dict(log.rows(step=2)[0], violation="refused: os.system")
    assert "violation</b>: refused: os.system" in explore.render_rows([row], log.roles)
