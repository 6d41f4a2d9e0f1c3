"""Tasks: one module per task, each exposing `make_task(num_agents, **task_args)`; the contract is `Task` below.

A task needs `name`, `num_agents`, `roles`, `load(split)`, `prompts(item)` (a prompt may be a `Prompt` whose answer
is started for the model) and a reward (its own `reward(item, completions) -> Reward | float`, or plain reward
functions given to the trainer). Every other
member is an optional hook listed in `HOOKS` with what it turns on; `has(task, hook)` is the one test for them
and `describe(task)` says which are on. `from_functions` builds a task from plain functions for a notebook cell.

Bad input is refused the way config fields are: `check_arg` for task arguments (`task_args.name=value is not
allowed; allowed: ...`, a TaskArgError), `read_items` for data files (the file, the item's index and id, the
field, and what was expected, a DataError).

Beside the tasks (code, writing, toy, game, rows: a JSONL of rows for an environment) this package holds what
they share: rewards.py (Reward, reward functions, batched scoring), codeparse.py (reading generated code),
signatures.py (the entry point's parameters, for prompts that say how to call aux), code_data.py (the code task's
datasets), games.py and coordination.py (turn-based games, the Tiny Hanabi suite),
environments.py (built-in environments the agents act on: KeyHalves, Board, CodeTests). May import: kit.engine, kit.judge,
kit.sandbox, kit.maths, kit.env; not runs, analysis or trainers.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from kit.engine.prompts import Prompt, answer_start, starts  # noqa: F401  (the tasks' prompts; re-exported)


@runtime_checkable
class Task(Protocol):
    """What the trainer, evaluation and baselines need from a task."""

    name: str
    num_agents: int
    roles: list[str]  # a short name per agent, e.g. ["helper", "main"]

    def load(self, split: str) -> list[dict]:
        """Items of "train" or "eval"; each has an "id". Offline samples where the real set is on a hub."""
        ...

    def prompts(self, item: dict) -> list[str]:
        """One prompt per agent for the first turn."""
        ...


HOOKS = {  # optional members and what each one turns on
    "reward": "the task's own joint reward(item, completions) -> Reward | float (else: reward functions only)",
    "feedback": "multi-turn training (num_turns > 1): feedback(item, completions, reward) -> next-turn prompts",
    "is_pass": "pass@k in evaluation and baselines: is_pass(reward) -> bool",
    "single_prompt": "the single-model baseline: single_prompt(item) -> one prompt for the whole solution",
    "split_single": "the single-model baseline: split_single(item, text) -> one completion per agent",
    "sequential_prompt": "the sequential baseline's prompts (default: the teammates' text appended)",
    "discussion_prompt": "the discussion baseline's prompts (default: the first answers appended)",
    "judge_rubric": "the Claude judge's rubric for this task (default: a generic one)",
    "attach_judge": "judge_feedback=true: attach_judge(judge) puts the judge's advice in next-turn prompts",
    "headline": "the metric reports, compare and the baseline figure judge the task by (default: pass@1 with "
                "is_pass, else the mean reward); a graded task whose pass is a threshold on its grade says "
                "'reward/mean'",
}


def has(task, hook: str) -> bool:
    """Whether `task` provides optional member `hook` (one of HOOKS)."""
    if hook not in HOOKS:
        raise KeyError(f"{hook!r} is not a task hook; hooks: {', '.join(HOOKS)}")
    return getattr(task, hook, None) is not None


def headline(task) -> str:
    """The metric the task is judged by: its own `headline`, else pass@1 when it has passes, else the mean reward."""
    return getattr(task, "headline", None) or ("pass@1" if has(task, "is_pass") else "reward/mean")


def headline_of(task_name: str) -> str | None:
    """The headline a built-in task names (its module's HEADLINE, e.g. writing's "reward/mean"), without building it;
    None for the others."""
    if not isinstance(task_name, str) or not task_name.isidentifier():
        return None
    try:
        module = importlib.import_module(f"kit.tasks.{task_name}")
    except ImportError:
        return None
    return getattr(module, "HEADLINE", None)


def describe(task) -> str:
    """One line: the task, its agents, and which optional hooks it turns on."""
    from kit.tasks.game import is_game

    roles = ", ".join(getattr(task, "roles", []) or [])
    if is_game(task):  # played in episodes (kit/tasks/games.py): the one-shot hooks below do not apply
        return f"game {getattr(task, 'name', type(task).__name__)!r} ({roles}): turn-based episodes, return = score"
    on = [h for h in HOOKS if has(task, h)]
    off = [h for h in HOOKS if h not in on]
    return (f"task {getattr(task, 'name', type(task).__name__)!r} ({roles}): hooks on: {', '.join(on) or 'none'}"
            f"; off: {', '.join(off) or 'none'}")


def get_task(name: str, num_agents: int, **task_args):
    module = importlib.import_module(f"kit.tasks.{name}")
    try:
        task = module.make_task(num_agents=num_agents, **task_args)
    except TypeError as err:
        raise ValueError(f"task_args={task_args!r} do not fit task {name!r}: {err}. "
                         f"See make_task in kit/tasks/{name}.py for its arguments") from None
    check_task(task, num_agents)
    return task


def task_for(cfg):
    """The task a TrainConfig names, built with its task_args (algorithm=centralized: its one-policy form)."""
    from kit.engine.centralized import wrap

    return wrap(cfg, get_task(cfg.task, cfg.num_agents, **cfg.task_args))


def check_task(task, num_agents: int) -> None:
    """Fail early, naming what is missing, when an object does not meet the Task contract."""
    for attr in ("load", "prompts"):
        if not callable(getattr(task, attr, None)):
            raise TypeError(f"task {task!r} has no {attr}() method; see kit/tasks/__init__.py for the contract")
    n = getattr(task, "num_agents", num_agents)
    if n != num_agents:
        raise ValueError(f"task {getattr(task, 'name', task)!r} is for {n} agents but num_agents={num_agents}")


# --- bad input: task arguments and data files


class TaskArgError(ValueError):
    """A bad task argument; the message names it, its value and what is allowed (as kit.run.config.ConfigError)."""


def check_arg(ok: bool, name: str, value, allowed: str) -> None:
    """Refuse task argument `name` unless `ok`, as config fields are refused (field, value, what is allowed)."""
    if not ok:
        raise TaskArgError(f"task_args.{name}={value!r} is not allowed; allowed: {allowed}")


def is_number(value) -> bool:
    """A finite int or float (not a bool, inf or nan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DataError(ValueError):
    """A data file that does not hold what its task reads; the message names the file, item, field and what was
    expected."""


def is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def is_id(value) -> bool:
    return is_text(value) or is_int(value)


def is_text_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(is_text(v) for v in value)


def read_items(path: str | Path, fields: dict[str, tuple[Callable, str]], optional: dict | None = None) -> list[dict]:
    """The items of a YAML data file: a non-empty list of mappings, each with every field of `fields` (name ->
    (check, what is expected)), a unique `id`, and where present those of `optional`. Anything else is a DataError
    naming the file, the item (index from 0, and id), the field and what was expected."""
    import yaml

    path = Path(path)
    shape = "a list of items, each a mapping with " + ", ".join(fields)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist; expected a YAML file holding {shape}")
    try:
        rows = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise DataError(f"data file {path} is not valid YAML: {yaml_problem(err)}") from None
    if rows is None or rows == []:
        raise DataError(f"data file {path} is empty; expected {shape}")
    if not isinstance(rows, list):
        got = f"a mapping (keys {', '.join(map(str, list(rows)[:5]))})" if isinstance(rows, dict) else \
            f"a {type(rows).__name__}"
        raise DataError(f"data file {path} holds {got}; expected {shape} (each item starts with '- ')")
    seen: dict = {}
    checks = {**fields, **(optional or {})}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"data file {path} item {i} is a {type(row).__name__} ({str(row)[:60]!r}); expected a "
                            f"mapping with {', '.join(fields)}")
        where = f"data file {path} item {i}" + (f" (id {row['id']!r})" if "id" in row else "")
        for name, (ok, expected) in checks.items():
            if name not in row:
                if name in fields:
                    raise DataError(f"{where} has no field {name!r}; expected {expected}")
                continue
            if not ok(row[name]):
                raise DataError(f"{where}: field {name!r} is {type(row[name]).__name__} {str(row[name])[:60]!r}; "
                                f"expected {expected}")
        if row["id"] in seen:
            raise DataError(f"{where}: id {row['id']!r} is also the id of item {seen[row['id']]}; ids must be unique")
        seen[row["id"]] = i
    return rows


def yaml_problem(err) -> str:
    """A YAML error in one line: what is wrong and where (line and column, counted from 1)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return f"{getattr(err, 'problem', None) or err}{where}"


@dataclass
class FunctionTask:
    """A task from plain functions: items, a prompt builder, and (optionally) a reward and feedback."""

    items: dict[str, list[dict]]
    prompt_fn: Callable[[dict], list[str]]
    reward_fn: Callable | None = None
    feedback_fn: Callable | None = None
    num_agents: int = 2
    name: str = "custom"
    roles: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.roles = self.roles or [f"agent_{i}" for i in range(self.num_agents)]
        if self.reward_fn is not None:
            self.reward = self.reward_fn
        if self.feedback_fn is not None:
            self.feedback = self.feedback_fn

    def load(self, split: str = "train") -> list[dict]:
        if split not in self.items:
            raise ValueError(f"split={split!r}; this task has {', '.join(self.items)}")
        return self.items[split]

    def prompts(self, item: dict) -> list[str]:
        return self.prompt_fn(item)


def from_functions(items, prompt_fn, reward_fn=None, feedback_fn=None, num_agents: int = 2, name: str = "custom"):
    """`items` is a list (train = eval) or a dict of splits."""
    splits = items if isinstance(items, dict) else {"train": items, "eval": items}
    return FunctionTask(splits, prompt_fn, reward_fn, feedback_fn, num_agents, name)
