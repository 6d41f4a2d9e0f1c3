"""The numbered notebooks are generated from this file: edit here, then run `python notebooks/build_notebooks.py`.

Why generated: the repository URL (badges, install cell) lives in one place, every notebook shares the same
setup cells, and diffs stay readable. Notebooks are written without outputs. Cells tagged `colab` run only in
Colab (install, Drive); tests/test_notebooks.py drops them and executes the rest with nbclient and KIT_SMOKE=1.
"""

from pathlib import Path

import nbformat

REPO = "https://github.com/magrpo-kit/magrpo-kit"  # the one place the repository URL is set (badges, install)
BRANCH = "main"
DRIVE_FOLDER = "magrpo-kit/runs"  # kit.run.rundir.DRIVE_FOLDER
HERE = Path(__file__).resolve().parent


def badge(name: str) -> str:
    colab = REPO.replace("https://github.com/", "https://colab.research.google.com/github/")
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab}/blob/{BRANCH}/notebooks/{name})"


def md(text: str, tags=()):
    return nbformat.v4.new_markdown_cell(text.strip(), metadata={"tags": list(tags)} if tags else {})


def code(text: str, tags=()):
    return nbformat.v4.new_code_cell(text.strip(), metadata={"tags": list(tags)} if tags else {})


INSTALL = code(f"""
# Colab only (tagged `colab`): get the kit and install it as a package (`import kit` then works from any folder).
# Pins nothing: its dependencies are requirements.txt's lower bounds and constraints.txt is left out on purpose, so
# Colab's own torch (its CUDA build) and packages stay wherever they meet the bounds; constraints.txt holds the
# exact versions the tests ran on (torch==2.13.0, the CPU wheel). Not `pip install -e`: an editable install is
# seen only after a kernel restart.
REPO = "{REPO}"  # the kit's git repository: put your fork's URL here
BRANCH = "{BRANCH}"
KIT_DIR = "/content/magrpo-kit"
import os, subprocess, sys
if "google.colab" in sys.modules:
    if not os.path.isdir(os.path.join(KIT_DIR, "kit")):
        print(f"getting the kit from {{REPO}} (branch {{BRANCH}}) ...", flush=True)
        got = subprocess.run(["git", "clone", "-q", "--depth", "1", "-b", BRANCH, REPO, KIT_DIR],
                             capture_output=True, text=True)
        if got.returncode != 0:
            if "remote branch" in got.stderr.lower():  # the repository is there, the branch is not
                raise RuntimeError(f"{{REPO}} has no branch {{BRANCH!r}}: set BRANCH at the top of this cell to one "
                                   "of its branches, then run this cell again.") from None
            why = (got.stderr.strip().splitlines() or ["git clone failed"])[-1]
            raise RuntimeError(f"could not get the kit from {{REPO}} (branch {{BRANCH}}): {{why}}. "
                               "Set REPO at the top of this cell to the kit's repository (your fork; a private one "
                               f"as https://<token>@github.com/...) or upload the repository to {{KIT_DIR}}, then "
                               "run this cell again.") from None
    # pip's own lines as they come (Colab shows nothing of a process that is not streamed): a minute or two
    print("installing the kit ...", flush=True)
    pip = subprocess.Popen([sys.executable, "-m", "pip", "install", "--progress-bar", "off", KIT_DIR],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    for line in pip.stdout:
        said.append(line.rstrip())
        if not line.startswith("Requirement already satisfied"):
            print(line, end="", flush=True)
    if pip.wait() != 0:
        raise RuntimeError("pip could not install the kit: " + "\\n".join(said[-15:])) from None
    print("the kit is installed", flush=True)
    os.chdir(KIT_DIR)  # runs are written under checkpoints/ of the checkout, as on a local machine
""", tags=["colab"])

SETUP = code("""
# The kit is installed (Colab: the cell above; locally: the checkout, editable). A checkout that is not installed is
# used from its root, the folder above notebooks/.
import importlib.util, os
if importlib.util.find_spec("kit") is None and os.path.isdir("../kit"):
    os.chdir("..")
%matplotlib inline
from kit import colab
SMOKE = colab.smoke()  # KIT_SMOKE=1: tiny CPU model, a few steps (how CI runs this notebook)
print("smoke mode" if SMOKE else "full mode", "|", colab.gpu_summary())
""")

DRIVE = code("""
drive = colab.mount_drive()  # Colab: mounts Google Drive once; elsewhere: None
""", tags=["colab"])


def run_cells(samples: bool = True) -> list:
    """The parameters, Drive and run cells of 02-05; samples=False: the notebook reads the run's files (04, 05), so
    the run cell says nothing of how long evaluations take."""
    find = "RUN_DIR = colab.run_to_analyse(RUN_NAME, globals().get(\"drive\"), DRIVE_FOLDER, RUN_DIR" + \
        ("" if samples else ", samples=False") + ")  # smoke: a tiny run"
    return [code(f"""
# The run to look at: by default the one 01_train made with this RUN_NAME, on this disk or on Drive.
RUN_NAME = "magrpo_code"  # as in 01_train
DRIVE_FOLDER = "{DRIVE_FOLDER}"  # under MyDrive, as in 01_train
RUN_DIR = None  # or a run folder, which overrides RUN_NAME
""", tags=["parameters"]), DRIVE, code("\n" + find + "\n")]


def train_cells(comment: str) -> list:
    """The resume cell (start or continue the run) and the training cell, shared by 01 and 06."""
    return [md("""
## ▶ Resume cell

This cell starts the run, or continues it. **After a disconnect**: reconnect, run the cells above (install,
parameters, Drive, config), then this one. It copies the newest complete checkpoint back from Drive when the
runtime's disk lost it, and training continues exactly where that checkpoint stopped (same data order, same
random state). A changed training setting is refused with the list of fields that differ.
"""), code("""
trainer = colab.start_or_resume(cfg)
"""), code(comment + """
summary = colab.train_to_end(trainer, every=1 if SMOKE else 5)
summary
""")]


def notebook(name: str, title: str, purpose: str, cells: list) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}, "accelerator": "GPU", "colab": {"provenance": []}}
    nb.cells = [md(f"# {title}\n\n{badge(name)}\n\n{purpose}"), INSTALL, SETUP, *cells]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name.split('_')[0]}-{i:02d}"  # stable ids: clean diffs
    nbformat.write(nb, HERE / name)


def build() -> None:
    notebook("00_setup.ipynb", "00 · Setup and smoke test",
             "Checks the runtime before a long run: the GPU (name and memory), the install, Google Drive and API "
             "keys from Colab secrets. It then trains a few steps of the chosen preset on the real model and prints "
             "one PASS or FAIL line. Run it once per new Colab runtime.", [
                 DRIVE,
                 code("""
# API keys come from the environment or Colab secrets (the key icon on the left); they are never printed.
# Not set: the optional Claude judge stays off.
print(colab.secret_status("ANTHROPIC_API_KEY"))
"""),
                 code("""
PRESET = "colab_a100"  # colab_a100 (A100), colab_t4 (free T4), colab_hanabi (06: Hanabi, A100); a CPU: tiny_cpu,
#          smol_writing (SmolLM2-135M) or coder_code (Qwen2.5-Coder-0.5B: a code team that passes tests)
""", tags=["parameters"]),
                 code("""
# Two training steps of the preset on its real model, in a throw-away folder: one PASS or FAIL line.
result = colab.preset_smoke_test("tiny_cpu" if SMOKE else PRESET)
"""),
             ])

    notebook("01_train.ipynb", "01 · Train a team with MAGRPO",
             "Trains a helper/main team of LoRA agents on one 4-bit base model with MAGRPO. **Run all** starts a "
             "new run, or continues the newest one. Checkpoints are written on the runtime's disk first and then "
             "copied to Google Drive, so a slow Drive never corrupts one; after a disconnect, the **resume cell** "
             "below continues from the newest complete checkpoint on Drive.", [
                 code("""
PRESET = "colab_a100"  # GPU: colab_a100 (A100, the paper's recipe in 4-bit), colab_t4. CPU: tiny_cpu (the toy task),
#          smol_writing, smol_code (SmolLM2-135M), coder_code, coder_mbpp, coder_keys (Qwen2.5-Coder-0.5B, minutes a step)
# Below, None means the preset's own setting; set one to replace it (the config cell says what it replaced).
TASK = None  # code, writing (both need a real model: a GPU preset or smol/coder), toy (what the tiny model learns)
ALGORITHM = None  # magrpo, iac, maac (critics on the shared base), centralized (one policy writes every part),
#             madpo or marlhf (learning from preferences: README)
TASK_ARGS = None  # code: {"dataset": "humaneval"} (or coop, mbpp, hub:<name>); writing: {"kind": "tldr"};
#           rows (a JSONL of rows, ENVIRONMENT set): {"file": "key_rows.jsonl", "num_eval": 8, "roles": ["left", "right"]}
ENVIRONMENT = None  # a TRL-style environment class the agents act on with tools (README: Teams that act): a class
#             defined in a cell above, or "module.path:ClassName", e.g. "kit.tasks.environments:CodeTests" (the code
#             task's test tool)
JUDGE_MODEL = None  # e.g. "claude-sonnet-4-5": adds the judge's score as a reward (needs ANTHROPIC_API_KEY)
JUDGE_BUDGET_USD = 15.0  # hard cap on judge spend for this run
RUN_NAME = "magrpo_code"  # the run's folder name, here and on Drive
DRIVE_FOLDER = "{DRIVE_FOLDER}"  # under MyDrive; 02-05 find the run there by RUN_NAME
NUM_STEPS = None  # None: the preset's
SAVE_EVERY = None  # a checkpoint (and a Drive copy) every this many steps; None: the preset's
""".replace("{DRIVE_FOLDER}", DRIVE_FOLDER), tags=["parameters"]),
                 DRIVE,
                 code("""
cfg = colab.notebook_config(PRESET, TASK, TASK_ARGS, RUN_NAME, globals().get("drive"), DRIVE_FOLDER, NUM_STEPS,
                            JUDGE_MODEL, JUDGE_BUDGET_USD, smoke=SMOKE, save_every=SAVE_EVERY,
                            algorithm=ALGORITHM, environment=ENVIRONMENT)
print(f"run: {cfg.run_dir}  mirror: {cfg.mirror_dir}  model: {cfg.model_name}  task: {cfg.task} {cfg.task_args}"
      f"  algorithm: {cfg.algorithm}")
"""),
                 *train_cells("# Trains with a live reward curve (the whole run, also after a resume), writes "
                             "eval/learning_curves.png,\n# then closes the trainer, which waits for the last copy to "
                             "Drive."),
                 code("""
from kit.analysis import plots

plots.learning_curves(cfg.run_dir)
"""),
                 code("""
colab.flush_drive(cfg)  # checks that Drive has the run, then flushes: every file before the runtime goes away
""", tags=["colab"]),
             ])

    notebook("02_evaluate.ipynb", "02 · Evaluate checkpoints",
             "Scores the untrained base and every saved checkpoint of a run on held-out items: pass@1/3/5/10 with "
             "the unbiased estimator, the mean reward and each part, the cooperation rate and tokens/s. The table "
             "and the curves show whether training improved the team on data it did not train on.", [
                 *run_cells(),
                 code("""
N = colab.samples_per_item(RUN_DIR, smoke_n=3)  # 10 on a GPU or the tiny model, 4 for a real model on a CPU (pass@k: k <= N)
from IPython.display import Markdown, display
from kit.analysis.evaluate import evaluate_run, format_table
from kit.analysis import plots

rows = evaluate_run(RUN_DIR, "all", n=N)
display(Markdown(format_table(rows)))
"""),
                 code("""
plots.eval_curves(rows, path=f"{RUN_DIR}/eval/eval_curves.png")
"""),
                 code("""
plots.learning_curves(RUN_DIR)
"""),
             ])

    notebook("03_baselines.ipynb", "03 · Baselines vs the trained team",
             "The paper's Table 1 on the same held-out items, sampling and scoring: a fixed single model, naive "
             "concatenation, a sequential pipeline and one-round discussion (all on the untrained base), against "
             "the MAGRPO team from the run's newest checkpoint.", [
                 *run_cells(),
                 code("""
N = colab.samples_per_item(RUN_DIR, smoke_n=2)  # 10 on a GPU or the tiny model, 4 for a real model on a CPU
from IPython.display import Markdown, display
from kit.analysis.baselines import compare
from kit.analysis.evaluate import format_table
from kit.analysis import plots

rows = compare(RUN_DIR, n=N)
display(Markdown(format_table(rows, first="method")))
"""),
                 code("""
plots.baseline_bars(rows, path=f"{RUN_DIR}/eval/baselines.png")
"""),
             ])

    notebook("04_schemes.ipynb", "04 · Cooperation schemes",
             "How does the main agent use the helper's `aux`? Each program is classified from its AST (fallback, "
             "decorator, coordinator, strategy filter, wrapper, no use): shares over training from the run's "
             "rollouts, shares on fresh samples from the newest checkpoint, and an example program for each "
             "scheme.", [
                 *run_cells(samples=False),
                 code("""
from IPython.display import Markdown, display
from kit.analysis import plots, schemes
from kit.analysis.evaluate import format_table

shares = schemes.scheme_shares(RUN_DIR)
display(Markdown(format_table(shares, ["step", "count", *schemes.SCHEMES])))
plots.scheme_area(shares)
"""),
                 code("""
# Fresh samples from the newest checkpoint on held-out items
schemes.fresh_shares(RUN_DIR, n=2 if SMOKE else 8)
"""),
                 code("""
display(Markdown(schemes.examples_markdown(RUN_DIR)))  # one example program per scheme
"""),
             ])

    notebook("05_explore.ipynb", "05 · Explore rewards and trajectories",
             "Browse every joint action the team produced: a step slider and filters (agent, reward range, "
             "reward part) show the prompts, each agent's completion, the reward parts and the advantages side "
             "by side; pick one for its whole prompts and reward breakdown, edit any agent's completion and "
             "re-score it with the task's own reward, which says why (failing asserts, errors). The widgets read "
             "the run's files, so they work after a reconnect and on a finished run.", [
                 *run_cells(samples=False),
                 code("""
from kit.analysis import explore

explore.browser(RUN_DIR)
"""),
                 code("""
# The same, without widgets: the best joint action of the newest step and its breakdown
from IPython.display import Markdown, display

display(Markdown(explore.breakdown_table(explore.RunLog(RUN_DIR).best())))
"""),
             ])

    notebook("06_hanabi.ipynb", "06 · Hanabi: one LoRA adapter per player",
             "Cooperative Hanabi through OpenSpiel: each player is an agent with its own LoRA adapter on one 4-bit "
             "base, trained by MAGRPO self-play on the game score. A step plays G episodes of each deal (the same "
             "cards, so the group mean is a fair baseline), all live episodes together with one batched generate "
             "per decision; every player updates on its own decisions only. An illegal move costs a penalty and is "
             "replaced by a random legal one. Then: evaluation over checkpoints, the random-legal and rule-based "
             "baselines on the same held-out deals, and a move-by-move browser of the games.", [
                 code("""
PRESET = "colab_hanabi"  # A100: Qwen2.5-3B-Instruct in 4-bit; on a CPU: smol_hanabi (SmolLM2-135M, game tiny_hanabi),
#          tiny_hanabi (the tiny CPU model, game tiny_hanabi)
TASK_ARGS = {"game": "hanabi", "prompt_style": "full", "max_decisions": 80, "illegal": "random",
             "illegal_penalty": 1.0}  # game: hanabi or tiny_hanabi (a CPU: {"game": "tiny_hanabi",
#             "prompt_style": "compact"}); illegal: random (a random legal move) or end
RUN_NAME = "magrpo_hanabi"  # the run's folder name, here and on Drive
DRIVE_FOLDER = "{DRIVE_FOLDER}"  # under MyDrive
NUM_STEPS = None  # None: the preset's
SAVE_EVERY = None  # a checkpoint (and a Drive copy) every this many steps; None: the preset's
""".replace("{DRIVE_FOLDER}", DRIVE_FOLDER), tags=["parameters"]),
                 DRIVE,
                 code("""
cfg = colab.notebook_config(PRESET, "game", TASK_ARGS, RUN_NAME, globals().get("drive"), DRIVE_FOLDER, NUM_STEPS,
                            smoke=SMOKE, save_every=SAVE_EVERY)
print(f"run: {cfg.run_dir}  mirror: {cfg.mirror_dir}  model: {cfg.model_name}  game: {cfg.task_args}")
"""),
                 *train_cells("# Live curves of the sampled score (greedy held-out points) and the illegal-move rate; writes\n"
                             "# eval/learning_curves.png. Decisions per player and the return are in metrics.jsonl."),
                 code("""
# Training: the score (sampled, and greedy on held-out deals), the illegal-move rate, the episode length
from kit.analysis import plots

plots.learning_curves(cfg.run_dir)
"""),
                 code("""
# Held-out deals, every checkpoint: sampled and greedy score, illegal-move rate, episode length
N = 2 if SMOKE else 8  # sampled episodes per deal
from IPython.display import Markdown, display
from kit.analysis.evaluate import evaluate_run, format_table
from kit.analysis import plots

rows = evaluate_run(cfg.run_dir, "all", n=N)
display(Markdown(format_table(rows)))
plots.eval_curves(rows, path=f"{cfg.run_dir}/eval/eval_curves.png")
"""),
                 code("""
# The same held-out deals: random legal moves, the rule-based player, the untrained team, the trained team
from kit.analysis.baselines import compare

table = compare(cfg.run_dir, n=N)
display(Markdown(format_table(table, ["method", "score/mean", "greedy/score_mean", "illegal/rate",
                                      "episode/length"], first="method")))
plots.baseline_bars(table, path=f"{cfg.run_dir}/eval/baselines.png")
"""),
                 code("""
# Step through the logged games move by move: the whole table before each decision, who acted, the move
from kit.analysis import explore

explore.browser(cfg.run_dir)
"""),
                 code("""
colab.flush_drive(cfg)  # checks that Drive has the run, then flushes: every file before the runtime goes away
""", tags=["colab"]),
             ])

    notebook("07_report.ipynb", "07 · Results report and comparison",
             "The write-up of a run: what was trained and at what cost, the learning curves, held-out pass@k over "
             "checkpoints, Table 1 (baselines vs the trained team) or the game baselines, cooperation schemes and "
             "the best and worst joint actions, with a bootstrap interval over items on every compared number. It "
             "is written to `<run>/report/RESULTS.md` with its figures (`python -m kit report --run-dir D` does the "
             "same). The last cells compare runs: seeds of one config as a mean with a band, ablations side by side.", [
                 *run_cells(),
                 code("""
# The report reads what the run holds. Without held-out results its evaluation and Table 1 sections say so;
# EVALUATE_MISSING runs `kit eval` (every checkpoint), `kit baselines` and, for the code task, the schemes of fresh
# samples first when their files are missing.
EVALUATE_MISSING = True
N = colab.samples_per_item(RUN_DIR, smoke_n=2)  # samples per agent per item: 10 on a GPU, 4 for a real model on a CPU
RUNS_TO_COMPARE = []  # other run folders to put beside this one, e.g. ["checkpoints/seed1", "checkpoints/separate"]
LABELS = None  # one label per run (this one first), or None for the folder names
""", tags=["parameters"]),
                 code("""
from pathlib import Path
from kit.analysis import report

if EVALUATE_MISSING:  # Table 1 at the held-out evaluation's samples per item, so the two tables agree
    colab.evaluate_missing(RUN_DIR, N, steps="newest" if SMOKE else "all")
results = report.write_report(RUN_DIR)
report.show(results)
"""),
                 code("""
# Colab: the report beside the run on Drive (the mirror copies checkpoints and logs, not the report); smoke mode
# puts it under DRIVE_FOLDER/_smoke/, never into a real run's folder
colab.report_to_drive(results, RUN_DIR, globals().get("drive"), DRIVE_FOLDER, RUN_NAME)
""", tags=["colab"]),
                 md("""
## Compare runs

Runs with the same config and different seeds are drawn as one line (the mean) with a band (lowest to highest
seed); the table gives each run's newest held-out numbers with intervals, and the paired difference with the
first run where both were scored on the same items.
"""),
                 code("""
from kit.analysis.compare import compare_runs

compared = compare_runs([RUN_DIR, *RUNS_TO_COMPARE], LABELS, out_dir=Path(RUN_DIR) / "report" / "compare")
report.show(compared)
"""),
             ])


if __name__ == "__main__":
    build()
    print("wrote", ", ".join(sorted(p.name for p in HERE.glob("*.ipynb"))))
