"""A run whose checkpoints are all unreadable stops with a message and touches nothing; --from-scratch starts over.

Run: python -m pytest tests/test_damaged_run.py
"""

import shutil

import pytest

from kit.__main__ import main as cli
from kit.run.checkpoint import DamagedCheckpoints
from kit.run.config import load_config
from kit.trainers.trainer import Trainer

STEPS = ["num_steps=2", "save_every=1", "keep_last=2", "keep_history=0", "eval_every=0", "batch_size=2",
         "num_generations=2", "progress=false"]


def snapshot(run_dir):
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 2-step run with checkpoints at steps 1 and 2, trained once for the module; each test damages a copy."""
    run = tmp_path_factory.mktemp("trained") / "run"
    trainer = Trainer(load_config("tiny_cpu", overrides=[f"run_dir={run}", *STEPS]), log=lambda *_: None)
    trainer.train()
    trainer.close()
    return run


@pytest.fixture
def damaged_run(tmp_path, trained_run):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={run}", *STEPS])
    for adapters in run.glob("ckpt/step_*/adapters/*/adapter_model.safetensors"):
        adapters.write_bytes(adapters.read_bytes()[:100])  # truncated on a flaky Drive
    return cfg, run


def test_all_checkpoints_unreadable_stops_naming_them_and_leaves_every_file_as_it_was(damaged_run, monkeypatch):
    cfg, run = damaged_run
    before = snapshot(run)

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for a run that cannot resume")

    monkeypatch.setattr("kit.engine.models.build_team", no_model)
    with pytest.raises(DamagedCheckpoints) as err:
        Trainer(cfg, resume=True, log=lambda *_: None)
    message = str(err.value)
    assert "step_000002" in message and "step_000001" in message and "--from-scratch" in message
    assert snapshot(run) == before  # metrics, rollouts, checkpoints and config: not a byte changed


def test_when_the_files_read_but_no_checkpoint_fits_the_model_it_still_stops_untouched(damaged_run):
    """Files that read but do not load into the team (an adapter's weights renamed) fail in resume_latest."""
    import torch
    from safetensors.torch import save_file

    cfg, run = damaged_run
    for weights in run.glob("ckpt/step_*/adapters/*/adapter_model.safetensors"):
        save_file({"unrelated.weight": torch.zeros(2)}, str(weights))
    before = snapshot(run)
    with pytest.warns(UserWarning, match="unreadable"), pytest.raises(DamagedCheckpoints):
        Trainer(cfg, resume=True, log=lambda *_: None)
    assert snapshot(run) == before


def test_the_cli_says_it_in_one_line_and_from_scratch_starts_over_keeping_the_old_files(damaged_run, capsys):
    _, run = damaged_run
    old_metrics = (run / "metrics.jsonl").read_bytes()
    assert cli(["train", "--run-dir", str(run), "--resume"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: every checkpoint") and "Traceback" not in said
    assert (run / "metrics.jsonl").read_bytes() == old_metrics
    assert cli(["train", "--run-dir", str(run), "--from-scratch"]) == 0
    (aside,) = run.glob("previous_*")
    assert (aside / "metrics.jsonl").read_bytes() == old_metrics and (aside / "ckpt" / "step_000002").is_dir()
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["step_000001", "step_000002"]
    Trainer(load_config(path=run / "config.json"), resume=True, log=lambda *_: None)  # the new run resumes


def test_a_run_whose_full_checkpoints_are_gone_but_whose_history_remains_stops_too(tmp_path):
    run = tmp_path / "run"
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={run}", *STEPS, "keep_last=1", "keep_history=2"])
    Trainer(cfg, log=lambda *_: None).train()
    assert (run / "history" / "step_000001").is_dir()
    shutil.rmtree(run / "ckpt")  # a partial restore from Drive
    before = snapshot(run)
    with pytest.raises(DamagedCheckpoints, match="holds no complete checkpoint.*history/ keeps .*step_000001"):
        Trainer(cfg, resume=True, log=lambda *_: None)
    assert snapshot(run) == before
