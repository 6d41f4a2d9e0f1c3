"""The explorer's widgets driven as a user drives them (slider, dropdowns, editors, buttons), on a hand-made code
run whose rows differ at every step, and the game browser's view of an illegal move. Works under ipywidgets 7
and 8 (their dropdowns move their value differently when the options change).

Run: python -m pytest tests/test_explore_browser.py
"""

import html
import json

import pytest

from kit.analysis import explore
from kit.run.config import load_config, save
from kit.tasks import task_for

w = pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def code_log(tmp_path_factory):
    """A code run's files: step 1 holds the reference pair of two problems, step 2 a main that fails the asserts,
    so every row of step 2 differs from the row at the same place in step 1 (code, reward, parts)."""
    run = tmp_path_factory.mktemp("browser") / "code"
    run.mkdir()
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={run}", "task=code", "task_args={dataset: coop}"])
    save(cfg, run / "config.json")
    task = task_for(cfg)
    rows = []
    for step, broken in ((1, False), (2, True)):
        for item in task.load("train")[:2]:
            helper, main = item["reference_pair"]
            if broken:
                main = main.replace("return ", "return 1 + ", 1)
            r = task.reward(item, (helper, main))
            rows.append({"step": step, "item": item["id"], "turn": 0, "prompts": task.prompts(item),
                         "completions": [helper, main], "reward": r.total, "parts": r.parts, "return": r.total,
                         "advantages": [0.0, 0.0]})
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def widgets(box, kind, description=None):
    """Every widget of class `kind` in the browser (depth first), optionally with this description."""
    found = []
    for child in getattr(box, "children", ()):
        if type(child).__name__ == kind and (description is None or child.description == description):
            found.append(child)
        found += widgets(child, kind, description)
    return found


def the(box, kind, description):
    (widget,) = widgets(box, kind, description)
    return widget


def detail(box):
    """The HTML under the joint-action dropdown: the picked joint action's breakdown and prompts."""
    children = list(box.children)
    return children[children.index(the(box, "Dropdown", "joint action")) + 1].value


def result(box):
    """The re-score's answer, the browser's last widget."""
    return box.children[-1].value


def test_after_the_step_slider_moves_everything_shown_and_rescored_is_the_picked_joint_action(code_log):
    log = explore.RunLog(code_log)
    box = explore.browser(code_log)
    step, pick = the(box, "SelectionSlider", "step"), the(box, "Dropdown", "joint action")
    editors = widgets(box, "Textarea")
    assert step.value == 2 and len(editors) == 2
    pick.value = 0  # the sequence: joint action 0 picked, then the slider moved to another step
    step.value = 1
    first = log.rows(step=1)
    assert pick.value == 0 and "(reward 4.00)" in pick.label
    assert [e.value for e in editors] == first[0]["completions"]
    assert "total: 4.000" in detail(box).replace("</td><td>", ": ")
    pick.value = 1
    assert [e.value for e in editors] == first[1]["completions"] and first[1]["item"] in detail(box)
    the(box, "Button", "re-score").click()  # unedited: the logged reward of the joint action on screen
    assert f"total {first[1]['reward']:.3f}" in result(box)
    step.value = 2
    assert [e.value for e in editors] == log.rows(step=2)[0]["completions"]
    the(box, "Button", "re-score").click()
    assert f"total {log.rows(step=2)[0]['reward']:.3f}" in result(box)


def test_both_agents_are_edited_at_once_and_a_filter_that_keeps_the_row_keeps_the_edits(code_log):
    log = explore.RunLog(code_log)
    item = log.item(log.rows(step=2)[0]["item"])
    box = explore.browser(code_log)  # step 2: main adds 1 to the answer, so the asserts fail
    helper, main = widgets(box, "Textarea")
    helper.value = "# edited\n" + item["reference_pair"][0]
    main.value = item["reference_pair"][1]
    the(box, "Dropdown", "agent").value = 1  # the table shows only main; the picked joint action is unchanged
    the(box, "Button", "reload").click()  # so is the log (a reload reads new row objects)
    assert helper.value.startswith("# edited") and main.value == item["reference_pair"][1]
    the(box, "Button", "re-score").click()
    assert "total 4.000" in result(box)


def test_a_rescore_says_why_failing_asserts_and_what_they_got(code_log):
    box = explore.browser(code_log)  # step 2, joint action 0: main returns one more than it should
    the(box, "Button", "re-score").click()
    said = result(box)
    assert "failures" in said and "AssertionError: 4 != 3" in said and "num_passed: 0" in said
    helper, main = widgets(box, "Textarea")
    main.value = "def anagram_groups(words) return 0"
    the(box, "Button", "re-score").click()
    assert "syntax_errors" in result(box)


def test_the_whole_problem_prompt_is_shown_in_a_scrolling_box(code_log):
    log = explore.RunLog(code_log)
    row = log.rows(step=2)[0]
    box = explore.browser(code_log)
    shown = detail(box)
    for prompt in row["prompts"]:  # both agents' prompts, whole (the issue saw the last 300 characters)
        assert len(prompt) > 300 and html.escape(prompt) in shown
        assert html.escape(prompt) in explore.render_rows([row], log.roles)
    assert "overflow:auto" in shown


def test_a_game_browser_shows_the_illegal_answer_apart_from_the_move_played_for_it():
    from kit.tasks.games import replay
    from kit.tasks.game import OpenSpielGame

    task = OpenSpielGame(2, "tiny_hanabi")
    ep = task.reset(3)
    for answer in ("", None):  # "": no move named, so a random legal move is played instead
        prompt = task.prompt(ep, task.player(ep))
        task.step(ep, task.moves(ep)[0] if answer is None else answer)["prompt"] = prompt
    row = {"item": "deal_3", "episode": 0, "seed": 3, "score": task.game_score(ep), "reward": task.score(ep),
           "advantage": 0.0, "illegal": 1, "length": 2, "decisions": ep.decisions}
    played = ep.decisions[0]["move"]
    frame = explore.render_frame(replay(task, row)[0], task.roles)
    assert "(empty)" in frame and f"<b>{html.escape(played)}</b>" in frame and "random legal move" in frame
    table = explore.render_episodes([row], task.roles)
    assert "<s>" not in table and html.escape(played) in table and "(empty)" in table


def test_a_rescore_of_a_run_whose_environment_owns_the_reward_says_why_not_a_traceback(code_log, monkeypatch):
    """Colab sixth pass, item 3: a rows-task run (coder_keys) has no task.reward: the button says why it cannot
    re-score edited text (AttributeError before)."""
    class EnvironmentOwned:  # the run's task as a RowsTask is: everything but a reward function
        def __init__(self, task):
            self._task = task

        def __getattr__(self, name):
            if name == "reward":
                raise AttributeError(name)
            return getattr(self._task, name)

    real = explore.RunLog.task
    monkeypatch.setattr(explore.RunLog, "task", property(lambda self: EnvironmentOwned(real.fget(self))))
    box = explore.browser(code_log)
    the(box, "Button", "re-score").click()
    said = result(box)
    assert "get_reward()" in said and "cannot be re-scored" in said and "Traceback" not in said
