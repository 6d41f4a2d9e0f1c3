"""Bad task arguments and data files: one message naming the argument or the file, item and field; no traceback.

Run: python -m pytest tests/test_bad_input.py
"""

import pytest

from kit.__main__ import main as cli
from kit.tasks import DataError, TaskArgError
from kit.tasks.code import CodeTask
from kit.tasks.toy import DigitSum
from kit.tasks.writing import WritingTask

PROBLEM = """- id: p1
  prompt: "def solve(x):\\n    '''Double x.'''\\n"
  entry_point: solve
  tests: ["assert candidate(1) == 2", "assert candidate(2) == 4"]
"""


@pytest.mark.parametrize("arg, value, allowed", [
    ("test_timeout", -1, "seconds > 0"), ("test_timeout", 0, "seconds > 0"), ("test_timeout", ".inf", "seconds > 0"),
    ("memory_mb", -5, ">= 64"), ("memory_mb", 0, ">= 64"), ("memory_mb", "lots", ">= 64"),
    ("train_range", "[0, x]", "start, stop"), ("max_failures_shown", -1, ">= 0"),
])
def test_code_task_arguments_are_refused_like_config_fields(tmp_path, capsys, arg, value, allowed):
    code = cli(["train", "--preset", "tiny_cpu", "--run-dir", str(tmp_path / "run"), "--set", "task=code",
                "--set", f"task_args={{dataset: coop, {arg}: {value}}}"])
    said = capsys.readouterr().err
    assert code == 2 and said.startswith(f"config error: task_args.{arg}=") and allowed in said
    assert "Traceback" not in said and not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("task, kwargs, name", [
    (DigitSum, {"copies": 0}, "copies"), (DigitSum, {"tolerance": -1.0}, "tolerance"),
    (WritingTask, {"num_eval": -1}, "num_eval"), (WritingTask, {"bands": {"length": [300, 8]}}, "bands.length"),
    (WritingTask, {"pass_threshold": float("nan")}, "pass_threshold"),
])
def test_other_task_arguments_name_the_argument(task, kwargs, name):
    with pytest.raises(TaskArgError, match=rf"^task_args\.{name}=.*allowed: "):
        task(**kwargs)


def write(tmp_path, text, name="problems.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_custom_coop_file_in_the_right_format_loads(tmp_path):
    items = CodeTask(dataset="coop", data_file=write(tmp_path, PROBLEM), train_range=[0, None]).load("train")
    assert [it["id"] for it in items] == ["p1"] and items[0]["tests"] == ["assert candidate(1) == 2",
                                                                          "assert candidate(2) == 4"]


@pytest.mark.parametrize("text, expected", [
    (PROBLEM.replace('tests: ["assert candidate(1) == 2", "assert candidate(2) == 4"]',
                     'tests: "assert candidate(1) == 2"'),
     r"item 0 \(id 'p1'\): field 'tests' is str .*expected a list of assert statements"),
    (PROBLEM.replace("  tests:", "  checks:"), r"item 0 \(id 'p1'\) has no field 'tests'; expected a list"),
    (PROBLEM + PROBLEM.replace("p1", "p2").replace("entry_point: solve", "entry_point: 3"),
     r"item 1 \(id 'p2'\): field 'entry_point' is int"),
    (PROBLEM + PROBLEM, r"item 1 \(id 'p1'\): id 'p1' is also the id of item 0"),
    ("", r"is empty; expected a list of items"),
    ("id: p1\nprompt: x\n", r"holds a mapping \(keys id, prompt\); expected a list of items"),
    ("- id: p1\n  prompt: [unclosed\n", r"is not valid YAML: .* at line \d+ column \d+"),
    ("- just a string\n", r"item 0 is a str .*expected a mapping with id, prompt, entry_point, tests"),
])
def test_a_broken_coop_file_names_file_item_field_and_what_was_expected(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(DataError, match=expected) as err:
        CodeTask(dataset="coop", data_file=path).load("train")
    assert str(err.value).startswith(f"data file {path}")


@pytest.mark.parametrize("kind, text, expected", [
    ("tldr", "- id: t1\n  subreddit: a\n  title: b\n", r"item 0 \(id 't1'\) has no field 'post'"),
    ("tldr", "- id: t1\n  subreddit: a\n  title: b\n  post: 7\n", r"field 'post' is int"),
    ("arxiv", "- id: a1\n  title: b\n  abstract: ''\n", r"field 'abstract' is str ''; expected the abstract"),
    ("arxiv", "", r"is empty"),
])
def test_a_broken_writing_sample_file_names_file_item_and_field(tmp_path, kind, text, expected):
    path = write(tmp_path, text, f"{kind}.yaml")
    with pytest.raises(DataError, match=expected):
        WritingTask(kind=kind, data_file=path).load("train")


def test_the_cli_reports_a_broken_data_file_in_one_line_before_any_model_loads(tmp_path, capsys):
    path = write(tmp_path, PROBLEM.replace("  tests:", "  checks:"))
    code = cli(["train", "--preset", "tiny_cpu", "--run-dir", str(tmp_path / "run"), "--set", "task=code",
                "--set", f"task_args={{dataset: coop, data_file: '{path}'}}"])
    said = capsys.readouterr().err
    assert code == 2 and said.startswith(f"error: data file {path} item 0 (id 'p1') has no field 'tests'")
    assert "Traceback" not in said
