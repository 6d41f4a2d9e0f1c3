"""What a new Colab user ran into (issue 13), one test per problem: each fails on the code before its fix.

Run: python -m pytest tests/test_colab_user.py
"""

import json
import re
import subprocess
import sys
import types
from concurrent.futures import wait
from pathlib import Path

import nbformat
import pytest
import torch

from kit import colab
from kit.run import checkpoint, mirror, rundir
from kit.analysis import explore, plots
from kit.__main__ import main as cli
from kit.run.config import load_config
from kit.analysis.evaluate import RunContext, evaluate_run
from kit.trainers.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent
QUIET = dict(log=lambda *_: None)


def cfg_for(run_dir, *overrides):
    return load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "progress=false", "num_steps=2", "batch_size=2",
                                              "num_generations=2", "eval_every=0", "save_every=1", *overrides])


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """A finished 2-step toy run (checkpoints at steps 1 and 2, rollouts logged)."""
    run = tmp_path_factory.mktemp("user") / "toy"
    trainer = Trainer(cfg_for(run), **QUIET)
    trainer.train()
    trainer.close()
    return run


# 1. the install cell ------------------------------------------------------------------------------------------

def install_cell(repo: str, kit_dir: Path) -> str:
    nb = nbformat.read(ROOT / "notebooks" / "01_train.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if "colab" in c.metadata.get("tags", []) and "REPO =" in c.source)
    source = re.sub(r'^REPO = ".*?"', f'REPO = "{repo}"', source, flags=re.M)
    return re.sub(r'^KIT_DIR = ".*?"', f'KIT_DIR = "{kit_dir}"', source, flags=re.M)


def test_install_cell_stops_with_one_clear_message_when_the_clone_fails(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.chdir(tmp_path)
    source = install_cell(f"file://{tmp_path}/no-such-repo", tmp_path / "kit_home")
    with pytest.raises(RuntimeError, match=r"could not get the kit from file://.*no-such-repo.*Set REPO"):
        exec(compile(source, "install-cell", "exec"), {})


def git_origin(tmp_path) -> Path:
    """A stand-in for the kit's repository, on branch main."""
    origin = tmp_path / "origin"
    (origin / "kit").mkdir(parents=True)
    (origin / "kit" / "__init__.py").write_text("")
    (origin / "requirements.txt").write_text("numpy\n")
    git = ["git", "-C", str(origin), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "kit"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    return origin


class FakePip:
    """pip's process: its lines come one by one, as a real install's do."""

    def __init__(self):
        self.stdout = iter(["Requirement already satisfied: numpy in /usr/lib\n", "Collecting peft>=0.13\n",
                            "Successfully installed peft-0.13.2\n"])

    def wait(self):
        return 0


def test_install_cell_clones_installs_and_enters_the_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.chdir(tmp_path)
    origin = git_origin(tmp_path)
    real_popen, calls = subprocess.Popen, []

    def popen(cmd, **kw):  # git for real; pip recorded, its output simulated
        calls.append(cmd)
        return real_popen(cmd, **kw) if cmd[0] == "git" else FakePip()

    monkeypatch.setattr(subprocess, "Popen", popen)
    exec(compile(install_cell(f"file://{origin}", tmp_path / "kit_home"), "install-cell", "exec"), {})
    assert (tmp_path / "kit_home" / "kit" / "__init__.py").exists()
    assert Path.cwd() == tmp_path / "kit_home"
    assert calls[-1][-2:] == ["off", str(tmp_path / "kit_home")]  # issue 34: the kit itself, as a package
    # issue 24: the install shows its progress as it goes, not nothing for minutes
    out = capsys.readouterr().out
    assert "Collecting peft" in out and "Successfully installed" in out and "already satisfied" not in out


def test_install_cell_blames_a_wrong_branch_on_branch_not_on_repo(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.chdir(tmp_path)
    source = install_cell(f"file://{git_origin(tmp_path)}", tmp_path / "kit_home").replace(
        'BRANCH = "main"', 'BRANCH = "no-such-branch"')
    with pytest.raises(RuntimeError, match="has no branch 'no-such-branch': set BRANCH") as err:
        exec(compile(source, "install-cell", "exec"), {})
    assert "Set REPO" not in str(err.value)


def test_the_repository_url_is_set_in_one_place_and_the_readme_says_where():
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import build_notebooks
    finally:
        sys.path.pop(0)
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        text = path.read_text()
        assert f'REPO = \\"{build_notebooks.REPO}\\"' in text, path.name
    readme = (ROOT / "README.md").read_text()
    assert "REPO" in readme and "build_notebooks.py" in readme and "your fork" in readme


# 2. 02-05 find the run on Drive --------------------------------------------------------------------------------

def test_analysis_notebooks_find_the_run_on_drive_in_a_new_runtime(toy_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a new runtime: no checkpoints/ folder on this disk
    monkeypatch.delenv("KIT_SMOKE", raising=False)
    drive = tmp_path / "MyDrive"
    mirror.Mirror(toy_run, drive / rundir.DRIVE_FOLDER / "magrpo_code").push().result()
    assert colab.run_to_analyse("magrpo_code", drive, **QUIET) == drive / rundir.DRIVE_FOLDER / "magrpo_code"
    with pytest.raises(FileNotFoundError, match="Google Drive is not mounted"):
        colab.run_to_analyse("magrpo_code", None, **QUIET)
    with pytest.raises(FileNotFoundError, match="same RUN_NAME"):
        colab.run_to_analyse("other", drive, **QUIET)
    for path in sorted((ROOT / "notebooks").glob("0[2-5]_*.ipynb")):
        assert "colab.run_to_analyse(RUN_NAME" in path.read_text(), path.name


def test_the_newer_of_the_local_run_and_its_drive_copy_is_analysed(toy_run, tmp_path):
    local = tmp_path / "checkpoints" / "r"
    drive = tmp_path / "MyDrive"
    remote = drive / rundir.DRIVE_FOLDER / "r"
    mirror.Mirror(toy_run, remote).push().result()
    mirror.Mirror(toy_run, local).push().result()
    assert rundir.find_run("r", drive, local_root=tmp_path / "checkpoints") == local  # a tie: this disk
    (remote / "ckpt" / "step_000002").rename(remote / "ckpt" / "step_000009")
    assert rundir.find_run("r", drive, local_root=tmp_path / "checkpoints") == remote


# 3. ipywidgets 7 (Colab's) and 8 ------------------------------------------------------------------------------

BROWSE = """
import sys
import ipywidgets as w
from kit.analysis import explore

def walk(box):
    for child in getattr(box, "children", ()):
        yield child
        yield from walk(child)

box = explore.browser(sys.argv[1])
found = {type(x).__name__ + ":" + (getattr(x, "description", "") or ""): x for x in walk(box)}
step, pick = found["SelectionSlider:step"], found["Dropdown:joint action"]
step.value = step.options[0]
assert pick.options, "no joint actions listed"
pick.value = pick.options[-1][1]
found["Button:re-score"].click()
assert "total" in found["HTML:"].value or any("total" in x.value for x in walk(box) if type(x).__name__ == "HTML")
found["Button:reload"].click()
print("browser ok", w.__version__)
"""


def test_requirements_accept_the_ipywidgets_colab_ships():
    line = next(x for x in (ROOT / "requirements.txt").read_text().splitlines() if x.startswith("ipywidgets"))
    assert re.match(r"ipywidgets>=7\.\d", line), line


@pytest.mark.parametrize("version", ["7", "8"])
def test_the_browser_works_with_ipywidgets_7_and_8(toy_run, tmp_path, version):
    env = {"PYTHONPATH": str(ROOT)}
    if version == "7":  # Colab's version, installed beside (not over) the test environment's 8.x
        target = tmp_path / "ipywidgets7"
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                              "ipywidgets==7.8.5", "ipython_genutils==0.2.0"], capture_output=True, text=True)
        assert pip.returncode == 0, pip.stderr
        env["PYTHONPATH"] = f"{target}:{ROOT}"
    import os

    out = subprocess.run([sys.executable, "-W", "ignore", "-c", BROWSE, str(toy_run)], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"browser ok {version}." in out.stdout


# 4. a thinned adapter history: "evaluate every checkpoint" shows the whole run -----------------------------------

def test_thinned_keeps_at_most_k_evenly_spread_steps():
    assert checkpoint.thinned(list(range(5, 55, 5)), 4) == {20, 40}
    assert checkpoint.thinned([25, 50, 75, 100], 4) == {25, 50, 75, 100}
    assert checkpoint.thinned([25, 50, 75, 100, 125], 4) == {50, 100}
    assert checkpoint.thinned([1, 2, 3], 0) == set()


def test_evaluation_covers_the_whole_run_not_only_the_last_checkpoints(tmp_path):
    run, drive = tmp_path / "run", tmp_path / "drive"
    trainer = Trainer(cfg_for(run, "num_steps=8", "keep_last=2", "keep_history=4", f"mirror_dir={drive}"), **QUIET)
    trainer.train(max_steps=4)
    weights_at_4 = {k: v.clone() for k, v in trainer.team.models[0].state_dict().items() if "lora_" in k}
    trainer.train()
    trainer.close()
    assert [p.name for p in checkpoint.complete_checkpoints(run)] == ["step_000008", "step_000007"]
    # steps 1-6 left the full checkpoints; the history keeps the multiples of 2 (at most 4 steps)
    assert sorted(checkpoint.saved_steps(run)) == [2, 4, 6, 7, 8]
    assert set(checkpoint.saved_steps(run)) <= set(checkpoint.saved_steps(drive))
    assert len(checkpoint.complete_checkpoints(drive, "history")) <= 4
    assert not (run / "history" / "step_000004" / "optim.pt").exists()  # adapters only
    ctx = RunContext(run, num_items=2, **QUIET)
    rows = evaluate_run(run, "all", n=1, ctx=ctx, **QUIET)
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 7, 8]
    ctx.use_step(4)
    for k, v in ctx.team.models[0].state_dict().items():
        if k in weights_at_4:
            assert torch.equal(v, weights_at_4[k]), k
    ctx.close()


# 5. a torn last line ------------------------------------------------------------------------------------------

def test_a_torn_last_log_line_is_dropped_with_a_warning_and_resume_works(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run, "num_steps=3"), **QUIET)
    trainer.train(max_steps=2)
    trainer.close()
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        with open(run / name, "a") as f:
            f.write('{"step": 3, "reward/me')  # the runtime died mid-line
    with pytest.warns(RuntimeWarning, match="half-written last line"):
        assert [r["step"] for r in plots.read_metrics(run)] == [1, 2]
    with pytest.warns(RuntimeWarning, match="half-written"):
        resumed = Trainer(cfg_for(run, "num_steps=3"), resume=True, **QUIET)
    resumed.train()
    resumed.close()
    assert [r["step"] for r in rundir.read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], "{torn", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="metrics.jsonl line 2 is not valid JSON"):
        rundir.read_jsonl(run / "metrics.jsonl")


# 6, 7, 9. full mode needs a GPU; no Drive is said loudly; smoke has its own Drive folder --------------------------

def test_full_mode_without_a_gpu_stops_with_how_to_switch_the_runtime(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for preset in ("colab_a100", "colab_t4"):
        with pytest.raises(RuntimeError, match="Change runtime type > GPU"):
            colab.notebook_config(preset, "code", {}, "x", **QUIET)
        assert "Change runtime type > GPU" in colab.preset_smoke_test(preset, **QUIET)  # a FAIL line (issue 34)
    assert colab.notebook_config("tiny_cpu", "toy", {}, "x", **QUIET).model_name == "tiny"
    assert colab.notebook_config("colab_a100", "code", {}, "x", smoke=True, **QUIET).model_name == "tiny"


def test_no_drive_means_a_loud_warning_that_nothing_is_backed_up(tmp_path):
    said = []
    colab.notebook_config("tiny_cpu", "toy", {}, "x", drive=None, log=said.append)
    assert any("NOTHING IS BACKED UP" in s for s in said)
    said.clear()
    colab.notebook_config("tiny_cpu", "toy", {}, "x", drive=tmp_path, log=said.append)
    assert [s.split(",")[0] for s in said] == ["[kit] the run: preset 'tiny_cpu'"]  # the plan only, no warning


def test_smoke_mode_mirrors_to_its_own_drive_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    full = colab.notebook_config("colab_a100", "code", {}, "magrpo_code", drive=tmp_path, **QUIET)
    smoke = colab.notebook_config("colab_a100", "code", {}, "magrpo_code", drive=tmp_path, smoke=True, **QUIET)
    assert full.mirror_dir == str(tmp_path / rundir.DRIVE_FOLDER / "magrpo_code")
    assert smoke.mirror_dir == str(tmp_path / rundir.DRIVE_FOLDER / "_smoke" / "magrpo_code")
    assert not Path(smoke.mirror_dir).is_relative_to(full.mirror_dir)


# 8. a changed setting is refused before the model loads ----------------------------------------------------------

def test_a_changed_setting_is_refused_before_the_model_loads(toy_run, tmp_path, monkeypatch):
    import kit.engine.models

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")

    monkeypatch.setattr(kit.engine.models, "build_team", no_loading)
    changed = cfg_for(toy_run, "learning_rate=0.5")
    with pytest.raises(ValueError, match=r"learning_rate: 0.003 -> 0.5"):
        Trainer(changed, resume=True, **QUIET)
    local = tmp_path / "new_runtime"  # the run is only on Drive: refused before minutes of copying from it
    with pytest.raises(ValueError, match="learning_rate"):
        colab.start_or_resume(cfg_for(local, "learning_rate=0.5", f"mirror_dir={toy_run}"), **QUIET)
    assert not local.exists()


# 10. learning_curves.png reaches Drive; the live curve shows the whole run after a resume ---------------------------

def test_training_cell_puts_the_learning_curves_on_drive(tmp_path):
    run, drive = tmp_path / "run", tmp_path / "drive"
    summary = colab.train_to_end(Trainer(cfg_for(run, f"mirror_dir={drive}"), **QUIET), every=1)
    assert summary["steps"] == 2
    assert (drive / "eval" / "learning_curves.png").read_bytes() == (run / "eval" / "learning_curves.png").read_bytes()


def test_the_live_curve_after_a_resume_starts_from_step_one(tmp_path):
    run = tmp_path / "run"
    first = Trainer(cfg_for(run, "num_steps=3"), **QUIET)
    first.train(max_steps=2)
    first.close()
    live = plots.LiveCurve(every=1, run_dir=run)
    resumed = Trainer(cfg_for(run, "num_steps=3"), resume=True, **QUIET)
    resumed.train(on_step=live)
    resumed.close()
    assert [r["step"] for r in live.rows] == [1, 2, 3]
    assert live.figure().axes[0].get_ylabel()


# 11. the command line ---------------------------------------------------------------------------------------

def test_cli_resume_on_an_empty_folder_says_it_starts_a_new_run(tmp_path, capsys):
    assert cli(["train", "--preset", "tiny_cpu", "--resume", "--run-dir", str(tmp_path / "empty"),
                "--set", "num_steps=1", "--set", "progress=false", "--set", "eval_every=0"]) == 0
    assert "nothing to resume" in capsys.readouterr().out


def test_cli_resume_with_only_the_run_dir_continues_with_the_runs_own_config(tmp_path, capsys):
    run = tmp_path / "r"
    trainer = Trainer(cfg_for(run), **QUIET)  # tiny_cpu with num_generations=2, batch_size=2, 2 steps
    trainer.train()
    trainer.close()
    assert cli(["train", "--run-dir", str(run), "--resume", "--set", "num_steps=3"]) == 0
    assert "step_000003" in capsys.readouterr().out
    saved = json.loads((run / "config.json").read_text())
    assert saved["num_steps"] == 3 and saved["num_generations"] == 2


@pytest.mark.parametrize("args, message", [
    (["eval", "--n", "0"], "argument --n: 0 is too small"),
    (["eval", "--steps", "abc"], "argument --steps: 'abc': give all, newest, or step numbers"),
    (["baselines", "--methods", "single,foo"], "unknown method(s) foo"),
    (["baselines", "--n", "-1"], "argument --n"),
])
def test_cli_bad_arguments_exit_2_with_a_message_before_any_work(args, message, toy_run, capsys):
    with pytest.raises(SystemExit) as stop:
        cli([*args, "--run-dir", str(toy_run)])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (toy_run / "eval" / "baselines.json").exists()


def test_cli_a_cuda_device_on_a_cpu_machine_is_an_error_not_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli(["train", "--preset", "tiny_cpu", "--run-dir", str(tmp_path / "r"), "--set", "device=cuda"]) == 2
    assert "device='cuda' but this machine has no CUDA GPU" in capsys.readouterr().err


def test_eval_and_baselines_without_checkpoints_say_the_team_is_missing(tmp_path):
    run = tmp_path / "run"
    Trainer(cfg_for(run), **QUIET)  # config.json only: stopped before the first checkpoint
    said = []
    from kit.analysis.baselines import compare

    ctx = RunContext(run, num_items=2, **QUIET)
    rows = compare(run, ["naive"], n=1, ctx=ctx, log=said.append)
    assert [r["method"] for r in rows] == ["naive"]
    assert any("trained team (magrpo) is NOT in this table" in s for s in said)
    said.clear()
    assert [r["step"] for r in evaluate_run(run, "all", n=1, ctx=ctx, log=said.append)] == [0]
    assert any("only the untrained base" in s for s in said)
    with pytest.raises(ValueError, match=r"no saved adapters for step\(s\) \[5\]"):
        evaluate_run(run, [5], n=1, ctx=ctx, **QUIET)
    ctx.close()


# 12. plots and the explorer's reward slider ------------------------------------------------------------------

def test_plot_axes_are_labelled_the_legend_names_every_line_and_pass_at_k_never_runs_negative():
    rows = [{"step": s, "pass@1": 0.0, "pass@3": 0.0, "reward/mean": 0.1 * s, "cooperation_rate": 0.5}
            for s in (0, 10)]
    fig = plots.eval_curves(rows)
    ax_pass, ax_reward = fig.axes[:2]
    assert ax_pass.get_ylabel() == "pass@k" and ax_reward.get_ylabel() == "mean reward"
    assert "cooperation rate" in [t.get_text() for t in ax_reward.get_legend().get_texts()]
    bars = plots.baseline_bars([{"method": m, "pass@1": 0.0, "pass@3": 0.0} for m in ("single", "magrpo")])
    assert bars.axes[0].get_ylim()[0] == 0.0


def test_the_reward_slider_covers_every_logged_reward(toy_run, tmp_path):
    run = tmp_path / "wide"
    run.mkdir()
    (run / "config.json").write_text((toy_run / "config.json").read_text())
    rows = [json.loads(line) for line in (toy_run / "rollouts.jsonl").read_text().splitlines()]
    rows[-1]["reward"], rows[-2]["reward"] = 25.0, -12.5  # in the step the browser opens on
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert explore.reward_bounds(rows) == (-13.0, 25.0)
    box = explore.browser(run)
    slider = next(w for w in box.children[1].children if type(w).__name__ == "FloatRangeSlider")
    assert slider.min <= -12.5 and slider.max >= 25.0 and slider.value == (slider.min, slider.max)
    table = next(w for w in box.children if type(w).__name__ == "HTML" and "<table>" in w.value)
    step_rows = [r for r in rows if r["step"] == rows[-1]["step"]]
    assert table.value.count("<tr>") == len(step_rows) + 1


# Issue 24 (second pass) --------------------------------------------------------------------------------------

def test_a_failing_drive_backup_is_said_at_once_retried_at_the_next_save_and_the_summary_still_comes(tmp_path):
    run, blocker = tmp_path / "run", tmp_path / "drive_file"
    blocker.write_text("a file where Drive's folder should be")  # every copy fails: NotADirectoryError
    said = []
    trainer = Trainer(cfg_for(run, "num_steps=3", "save_every=2", f"mirror_dir={blocker / 'run'}"), log=said.append)
    trainer.train(max_steps=2)  # step 2 is saved and its copy queued
    wait(trainer.mirror._pending)  # ...and it fails long before the next save
    blocker.unlink()  # Drive is back: the next save (step 3, the last) copies everything that is missing
    summary = colab.train_to_end(trainer, every=100)
    loud = [s for s in said if "FAILED: NotADirectoryError" in s]
    assert len(loud) == 1 and "retried at the next save" in loud[0] and "last good backup: none yet" in loud[0]
    assert summary["backup"] == f"last good backup: step 3 ({blocker / 'run'})"
    assert any("works again" in s for s in said)
    assert [p.name for p in checkpoint.complete_checkpoints(blocker / "run")] == ["step_000003", "step_000002"]


def test_a_drive_that_stays_broken_ends_with_a_warning_and_the_summary_not_an_exception(tmp_path):
    blocker = tmp_path / "drive_file"
    blocker.write_text("")
    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=1", f"mirror_dir={blocker / 'run'}"), log=said.append)
    summary = colab.train_to_end(trainer, every=100)
    assert summary["steps"] == 1 and summary["backup"].startswith("last good backup: none yet")
    assert any("last backup to Drive FAILED" in s for s in said)


def test_the_training_cell_run_again_after_the_end_says_the_run_is_complete(tmp_path):
    said = []
    trainer = Trainer(cfg_for(tmp_path / "run", "num_steps=1", f"mirror_dir={tmp_path / 'drive'}"), log=said.append)
    colab.train_to_end(trainer, every=100)
    said.clear()
    assert colab.train_to_end(trainer, every=100)["steps"] == 1
    assert any("the run is complete (1 of 1 steps)" in s for s in said)


def without_timings(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def test_a_stop_while_the_rollouts_are_written_loses_no_row_and_the_run_stays_exact(toy_run, tmp_path, monkeypatch):
    import json as json_module
    import os
    import signal

    run = tmp_path / "run"
    trainer = Trainer(cfg_for(run), **QUIET)  # the same run as toy_run
    real_dumps, written = json_module.dumps, []
    # Python's own SIGINT handler, as in a notebook: an earlier test or library in this process may have left another
    # one (the kit hands the held-back interrupt to whatever handler was there before)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    def dumps(row, *a, **k):  # Colab's stop button (SIGINT) arrives midway through step 2's rollouts
        if isinstance(row, dict) and row.get("step") == 2 and "completions" in row:
            written.append(row)
            if len(written) == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return real_dumps(row, *a, **k)

    monkeypatch.setattr(json_module, "dumps", dumps)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train()
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(json_module, "dumps", real_dumps)
    steps = [r["step"] for r in rundir.read_jsonl(run / "rollouts.jsonl")]
    assert steps.count(2) == steps.count(1) > 0  # the stopped step's rows are all there
    trainer.train()  # the training cell run again: goes on exactly
    trainer.close()
    assert (run / "rollouts.jsonl").read_text() == (toy_run / "rollouts.jsonl").read_text()
    assert without_timings(rundir.read_jsonl(run / "metrics.jsonl")) == \
        without_timings(rundir.read_jsonl(toy_run / "metrics.jsonl"))


def test_a_restart_before_the_first_checkpoint_says_so_and_writes_the_step_0_eval_once(tmp_path):
    cfg = cfg_for(tmp_path / "run", "eval_every=1", "save_every=5", "num_steps=2", "num_eval_items=1")
    first = Trainer(cfg, **QUIET)
    first.train(max_steps=1)  # the step-0 eval and step 1 are logged; no checkpoint yet
    first.close()
    said = []
    trainer = colab.start_or_resume(cfg, log=said.append)
    assert not any("continuing the run" in s for s in said)
    assert any("stopped before its first checkpoint: starting it again from step 0" in s for s in said)
    trainer.train()
    trainer.close()
    assert [r["step"] for r in rundir.read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2]


def test_cli_a_gpu_preset_without_a_gpu_is_the_notebooks_refusal_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli(["train", "--preset", "colab_a100", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs a GPU" in err and "Change runtime type > GPU" in err and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_cli_a_model_that_cannot_be_loaded_is_one_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    # no network, as in a Colab without it: the name is looked up in the local cache only, and is not there
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert cli(["train", "--preset", "tiny_cpu", "--run-dir", str(tmp_path / "r"), "--set",
                "model_name=kit-tests/no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: could not load model 'kit-tests/no-such-model'") and "\n" not in err


def test_the_smoke_cell_without_a_gpu_prints_a_fail_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    said = []
    line = colab.preset_smoke_test("colab_t4", log=said.append)  # issue 34: returned, not raised (said once)
    assert said == [line] and line.startswith("FAIL: preset 'colab_t4' needs a GPU")


class NotebookAccessError(Exception):  # google.colab.userdata's names for the two cases
    pass


class SecretNotFoundError(Exception):
    pass


@pytest.mark.parametrize("error, line", [(NotebookAccessError, "grant access"), (SecretNotFoundError, "not set")])
def test_a_colab_secret_not_granted_to_the_notebook_says_grant_access(error, line, monkeypatch):
    from kit import env

    def get(name):
        raise error(name)

    monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
    monkeypatch.setitem(sys.modules, "google.colab", types.SimpleNamespace(userdata=types.SimpleNamespace(get=get)))
    monkeypatch.setattr(env, "in_colab", lambda: True)
    monkeypatch.delenv("KIT_TEST_SECRET", raising=False)
    said = []
    assert colab.secret("KIT_TEST_SECRET", log=said.append) is None
    assert line in colab.secret_status("KIT_TEST_SECRET")
    assert bool(said) == (error is NotebookAccessError)
    cells = nbformat.read(ROOT / "notebooks" / "00_setup.ipynb", as_version=4).cells
    assert any('colab.secret_status("ANTHROPIC_API_KEY")' in c.source for c in cells)


def test_01_sets_save_every(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert colab.notebook_config("colab_a100", "code", {}, "x", save_every=7, **QUIET).save_every == 7
    nb = nbformat.read(ROOT / "notebooks" / "01_train.ipynb", as_version=4)
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    assert re.search(r"^SAVE_EVERY = None", params, flags=re.M)
    assert any("save_every=SAVE_EVERY" in c.source for c in nb.cells)


def test_a_sibling_of_the_drive_mount_is_not_taken_for_the_mount(monkeypatch):
    """/content/drive2 is a folder of this disk next to the mount point, not under it (review 6)."""
    from kit import env

    monkeypatch.setattr(env, "drive_mounted", lambda root=None: False)
    assert env.unmounted_drive("/content/drive/MyDrive/runs") and env.unmounted_drive("/content/drive")
    assert not env.unmounted_drive("/content/drive2/runs") and not env.unmounted_drive("/content/drive_backup")
