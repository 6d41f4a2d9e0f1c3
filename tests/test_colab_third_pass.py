"""Colab, third pass (issue 34): what misled a new user or filled their Drive, one test per problem; each fails on
the code before its fix.

Run: python -m pytest tests/test_colab_third_pass.py
"""

import errno
import os
import shutil
import threading
from pathlib import Path

import pytest

from kit import colab
from kit.run import checkpoint, rundir
from kit.run.config import load_config
from kit.trainers.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent


def cfg_for(run_dir, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "progress=false", "num_steps=2", "batch_size=2",
                                              "num_generations=2", "eval_every=0", "save_every=1", *overrides])


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if ".partial" in p.name)


# 1. a Drive slower than save_every ----------------------------------------------------------------------------

def test_a_slow_drive_reports_no_failure_that_did_not_happen_and_leaves_no_partial_copy(tmp_path, monkeypatch):
    """The copy of step 1 is still reading it when the trainer's prune moves it to history/ (made certain, not
    left to timing: the copy waits until the prune has happened)."""
    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy, real_prune = shutil.copyfile, checkpoint.prune
    pruned = threading.Event()

    def prune(run_dir, keep_last, keep_history=0):
        real_prune(run_dir, keep_last, keep_history)
        if not (run / "ckpt" / "step_000001").exists():
            pruned.set()

    def slow_copy(src, dst, *args, **kwargs):
        if os.fspath(src).startswith(str(run / "ckpt" / "step_000001")):  # copytree passes DirEntry
            assert pruned.wait(120), "the trainer never pruned step 1"
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "prune", prune)
    monkeypatch.setattr(shutil, "copyfile", slow_copy)
    said = []
    trainer = Trainer(cfg_for(run, "num_steps=3", "keep_last=1", "keep_history=2", f"mirror_dir={drive}"),
                      log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert pruned.is_set()
    assert not [s for s in said if "fail" in s.lower()], said
    assert summary["backup"] == f"last good backup: step 3 ({drive})"
    assert leftovers(drive) == []
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000003"]
    assert [p.name for p in checkpoint.complete_checkpoints(drive, "history")] == ["step_000002", "step_000001"]


def test_a_partial_copy_left_by_an_earlier_runtime_is_removed_by_the_next_copy(tmp_path):
    run, drive = tmp_path / "run", tmp_path / "drive"
    stale = drive / "ckpt" / ".step_000045.partial"
    (stale / "adapters").mkdir(parents=True)
    (stale / "optim.pt").write_bytes(b"x" * 1000)
    (drive / ".metrics.jsonl.partial").write_text("{}")
    trainer = Trainer(cfg_for(run, "num_steps=1", f"mirror_dir={drive}"), log=lambda *_: None)
    colab.train_to_end(trainer, every=100)
    assert leftovers(drive) == []
    assert [p.name for p in checkpoint.complete_checkpoints(drive)] == ["step_000001"]


# 2. a full or read-only Drive --------------------------------------------------------------------------------

@pytest.mark.parametrize("code, why", [(errno.ENOSPC, "Drive is full (No space left on device)"),
                                       (errno.EROFS, "Drive is read-only (Read-only file system)"),
                                       (errno.EACCES, "no permission to write to Drive (Permission denied)")])
def test_a_failed_copy_says_why_in_words(code, why):
    from kit.run.mirror import reason

    assert reason(OSError(code, os.strerror(code), "/content/drive/MyDrive/x")) == why
    listed = shutil.Error([("/a", "/b", f"[Errno {code}] {os.strerror(code)}: '/b'")])  # copytree's list of tuples
    assert reason(listed) == f"[Errno {code}] {os.strerror(code)}: '/b'"


def test_a_full_drive_is_one_clear_reason_said_once_and_leaves_no_partial_copy(tmp_path, monkeypatch):
    code, reason = errno.ENOSPC, "Drive is full (No space left on device)"
    run, drive = tmp_path / "run", tmp_path / "drive"
    real_copy = shutil.copyfile

    def failing_copy(src, dst, *args, **kwargs):  # the logs still fit; a checkpoint (the big files) does not
        if os.fspath(dst).startswith(str(drive / "ckpt")):
            Path(dst).write_bytes(b"half a file")  # what a full disk leaves: the start of the file
            raise OSError(code, os.strerror(code), str(dst))
        return real_copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", failing_copy)
    said = []
    trainer = Trainer(cfg_for(run, "num_steps=4", f"mirror_dir={drive}"), log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert summary["steps"] == 4 and summary["backup"].startswith("last good backup: none yet")
    failures = [s for s in said if "fail" in s.lower()]
    assert failures and all(reason in s for s in failures), failures
    assert not any("[(" in s or "Errno" in s for s in failures), failures  # no raw shutil.Error or errno
    assert sum("!!!!" in s for s in failures) == 1  # the loud banner once ...
    assert len(failures) <= 4  # ... then "still failing" now and then, not a line per save (5 copies failed)
    assert any("still failing" in s for s in failures)
    assert leftovers(drive) == []


# 7. an installable package: the notebooks import it, they do not move into the repository ---------------------

def setup_cell() -> str:
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "02_evaluate.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if "colab.smoke()" in c.source)
    return "\n".join(line for line in source.splitlines() if not line.startswith("%"))


def test_the_setup_cell_stays_in_its_folder_where_the_kit_is_installed(tmp_path, monkeypatch):
    (tmp_path / "kit").mkdir()  # a checkout's kit/ above the notebook's folder, as in notebooks/
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    monkeypatch.syspath_prepend(str(ROOT))  # `kit` importable: installed
    exec(compile(setup_cell(), "setup-cell", "exec"), {})
    assert Path.cwd() == tmp_path / "notebooks"


# 3. tables that agree, 5. compare, 6. figures: from run folders written by hand (no model runs) ------------------

def fake_run(path: Path, seed: int = 0, steps: int = 60, held_out: dict | None = None, baselines=None) -> Path:
    """A run folder as the trainer, `kit eval` and `kit baselines` leave it: training reward step/100 at each step
    1..`steps`; the held-out rows and baselines given."""
    import json

    from kit.run.config import to_dict

    path.mkdir(parents=True)
    cfg = to_dict(load_config("tiny_cpu", overrides=[f"run_dir={path}", f"seed={seed}", f"num_steps={steps}"]))
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": s / 100, "reward/sum": s / 100})
                                                + "\n" for s in range(1, steps + 1)))
    (path / "eval").mkdir()
    for row in [held_out] if held_out else []:
        (path / "eval" / f"step_{row['step']:06d}.json").write_text(json.dumps(row))
    if baselines:
        (path / "eval" / "baselines.json").write_text(json.dumps(baselines))
    return path


def held_row(step=60, n=4, pass1=0.092, reward=0.5):
    return {"step": step, "pass@1": pass1, "reward/mean": reward, "num_items": 8, "num_samples": n, "split": "eval"}


def section(text: str, title: str) -> str:
    return text[text.index(f"## {title}"):].split("\n## ")[0]


def test_table_1_states_its_samples_per_item_and_says_why_it_differs_from_the_held_out_section(tmp_path):
    from kit.analysis.report import write_report

    team = {**held_row(n=10, pass1=0.111), "method": "magrpo"}
    run = fake_run(tmp_path / "run", held_out=held_row(n=4), baselines=[{**held_row(n=10, pass1=0.05),
                                                                          "method": "naive"}, team])
    text = write_report(run, log=lambda *_: None).read_text()
    table1 = section(text, "Table 1")
    assert "10 samples per item" in table1 and "4 samples per item" in section(text, "Held-out")
    assert "different samplings (10 samples per item here, 4 there)" in table1
    assert "0.111 here, 0.092 there" in table1


def test_the_report_and_compare_give_the_same_final_train_reward(tmp_path):
    from kit.analysis.compare import compare_runs
    from kit.analysis.report import write_report

    run = fake_run(tmp_path / "run")
    # 60 steps: the last 6 (a tenth), steps 55..60, rewards 0.55..0.60: mean 0.575
    assert "0.575 over the last 6" in write_report(run, log=lambda *_: None).read_text()
    compared = compare_runs([run], out_dir=tmp_path / "cmp", log=lambda *_: None).read_text()
    assert "| run | 0 | 60 | 0.575 (last 6) |" in compared


def test_compare_names_a_seed_group_by_its_label_or_config_fills_its_held_out_cells_and_counts_one_run(tmp_path):
    from kit.analysis.compare import compare_runs

    runs = [fake_run(tmp_path / f"seed{s}", seed=s, held_out=held_row(pass1=0.1 * (s + 1), reward=0.5 + s / 10))
            for s in range(3)]
    by_config = compare_runs(runs, out_dir=tmp_path / "a", log=lambda *_: None).read_text()
    group = next(line for line in by_config.splitlines() if "(3 seeds): mean" in line)
    assert group.startswith("| **tiny_cpu (3 seeds): mean** |"), group  # the preset it is, not "seed0"
    # the held-out columns: pass@1 0.1, 0.2, 0.3 and reward 0.5, 0.6, 0.7: mean [lowest, highest]
    assert "| 0.200 [0.100, 0.300] | 0.600 [0.500, 0.700] |" in group
    shared = compare_runs(runs, ["shared"] * 3, out_dir=tmp_path / "b", log=lambda *_: None).read_text()
    assert "| **shared (3 seeds): mean** |" in shared
    one = compare_runs(runs[:1], out_dir=tmp_path / "c", log=lambda *_: None).read_text()
    assert one.startswith("# Comparison of 1 run\n")


def test_every_report_and_compare_figure_labels_its_y_axis(tmp_path, monkeypatch):
    from kit.analysis import compare, report, runinfo

    figures = []

    def recording(*args, **kwargs):
        fig, axes = runinfo.figure(*args, **kwargs)
        figures.append(fig)
        return fig, axes

    monkeypatch.setattr(report, "figure", recording)
    monkeypatch.setattr(compare, "figure", recording)
    run = fake_run(tmp_path / "run", held_out=held_row())
    report.write_report(run, log=lambda *_: None)
    compare.compare_runs([run], out_dir=tmp_path / "cmp", log=lambda *_: None)
    axes = [ax for fig in figures for ax in fig.axes]
    assert len(axes) >= 5 and all(ax.get_ylabel() for ax in axes), [ax.get_title() for ax in axes]


def test_a_scheme_example_without_code_shows_no_empty_code_block(tmp_path, monkeypatch):
    from kit.analysis import report, schemes

    shares = [{"step": 1, "count": 1, **{k: 0.0 for k in schemes.SCHEMES}}]
    shares[0][schemes.SCHEMES[0]] = 1.0
    monkeypatch.setattr(schemes, "scheme_shares", lambda run_dir: shares)
    monkeypatch.setattr(schemes, "examples", lambda run_dir, per_scheme=2: {
        schemes.SCHEMES[0]: [{"step": 1, "item": "p1", "reward": 0.0, "helper": "", "main": "  "}]})
    text = report.schemes_section({"path": tmp_path}, tmp_path)
    assert "```" not in text and "(no code in either completion)" in text


def test_the_curves_title_states_the_window_it_really_averages(tmp_path):
    from kit.analysis import plots

    fig = plots.learning_curves(fake_run(tmp_path / "run", steps=3))  # a tenth of 3 steps: each step as it is
    assert "each step" in fig.axes[0].get_title()
    fig = plots.learning_curves(fake_run(tmp_path / "long", steps=30), window=3)
    assert "mean over the last 3 steps" in fig.axes[0].get_title()


# 4. smoke mode never touches a real run's folders -------------------------------------------------------------

def test_smoke_mode_analyses_the_run_01_trained_in_smoke_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_SMOKE", "1")
    monkeypatch.setenv("KIT_SMOKE_DIR", str(tmp_path / "smoke"))
    cfg = colab.notebook_config("colab_a100", "code", {}, "mine", smoke=True, log=lambda *_: None)  # 01, smoke mode
    (Path(cfg.run_dir) / "ckpt" / f"step_{cfg.num_steps:06d}").mkdir(parents=True)  # as 01 leaves it: trained
    (Path(cfg.run_dir) / "ckpt" / f"step_{cfg.num_steps:06d}" / "COMPLETE").write_text("")
    (Path(cfg.run_dir) / "config.json").write_text("{}")
    assert colab.run_to_analyse("mine", log=lambda *_: None) == Path(cfg.run_dir)


def test_07_in_smoke_mode_copies_its_report_only_under_smoke_on_drive(tmp_path, monkeypatch):
    import nbformat

    monkeypatch.setenv("KIT_SMOKE", "1")
    drive, report_dir = tmp_path / "MyDrive", tmp_path / "smoke" / "report"
    report_dir.mkdir(parents=True)
    (report_dir / "RESULTS.md").write_text("# Results")
    cells = nbformat.read(ROOT / "notebooks" / "07_report.ipynb", as_version=4).cells
    source = next(c.source for c in cells if "report on Drive" in c.source or "report_to_drive" in c.source)
    exec(compile(source, "07-drive-cell", "exec"), {"colab": colab, "Path": Path, "drive": drive,
                                                   "DRIVE_FOLDER": "magrpo-kit/runs", "RUN_NAME": "mine",
                                                   "RUN_DIR": str(tmp_path / "smoke"),
                                                   "results": report_dir / "RESULTS.md"})
    written = sorted(str(p.relative_to(drive)) for p in drive.rglob("RESULTS.md"))
    assert written == ["magrpo-kit/runs/_smoke/mine/report/RESULTS.md"]


# 6. small things ---------------------------------------------------------------------------------------------

def test_00_full_mode_on_a_cpu_says_fail_once_and_how_to_set_smoke_mode_in_colab(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = []
    line = colab.preset_smoke_test("colab_a100", log=said.append)  # no traceback repeating it
    assert said == [line] and line.startswith("FAIL: preset 'colab_a100' needs a GPU")
    assert "%env KIT_SMOKE=1" in line


def test_a_resume_after_a_kill_says_which_logged_steps_are_dropped_and_redone(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=4", "save_every=2"), log=lambda *_: None)
    trainer.train(max_steps=3)  # killed after step 3: the checkpoint is step 2's, step 3 is logged after it
    said = []
    colab.start_or_resume(cfg_for(run, "num_steps=4", "save_every=2"), log=said.append)
    line = next(s for s in said if "continuing the run" in s)
    assert line.endswith("from its checkpoint at step 2; the logged step after it (step 3) is dropped from the logs "
                         "and will be trained again")
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in (1, 2, 3, 4, 4)))  # two more, by hand
    assert rundir.dropped(run, 2) == ("; the 2 logged steps after it (steps 3-4) are dropped from the logs and will "
                                     "be trained again")


def test_the_cli_resume_says_the_same_line_as_the_notebook(tmp_path, capsys):
    from kit.__main__ import main as cli

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=4", "save_every=2"), log=lambda *_: None)
    trainer.train(max_steps=3)  # killed after step 3
    trainer.close()
    capsys.readouterr()
    assert cli(["train", "--run-dir", str(run), "--resume", "--set", "num_steps=3"]) == 0
    assert (f"[kit] continuing the run in {run} from its checkpoint at step 2; the logged step after it (step 3) is "
            "dropped from the logs and will be trained again") in capsys.readouterr().out


def test_07_scores_table_1_at_the_held_out_evaluations_samples_per_item(tmp_path, monkeypatch):
    from kit.analysis import baselines

    run = fake_run(tmp_path / "run", held_out=held_row(n=4))
    asked = []
    monkeypatch.setattr(baselines, "compare", lambda run_dir, methods=None, n=10, log=print: asked.append(n))
    said = []
    colab.evaluate_missing(run, 10, log=said.append)  # 07's N = 10; `kit eval --n 4` made the held-out rows
    assert asked == [4] and any("as the held-out evaluation (not 10)" in s for s in said)
