"""Tasks: one module per task, each exposing `make_task(num_agents, **task_args)`; the contract is `Task` below.

A task needs `name`, `num_agents`, `roles`, `load(split)`, `prompts(item)` and a reward (its own
`reward(item, completions) -> Reward | float`, or plain reward functions given to the trainer). Every other
member is an optional hook listed in `HOOKS` with what it turns on; `has(task, hook)` is the one test for them
and `describe(task)` says which are on. `from_functions` builds a task from plain functions for a notebook cell.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable


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
}


def has(task, hook: str) -> bool:
    """Whether `task` provides optional member `hook` (one of HOOKS)."""
    if hook not in HOOKS:
        raise KeyError(f"{hook!r} is not a task hook; hooks: {', '.join(HOOKS)}")
    return getattr(task, hook, None) is not None


def describe(task) -> str:
    """One line: the task, its agents, and which optional hooks it turns on."""
    from kit.tasks.game import is_game

    roles = ", ".join(getattr(task, "roles", []) or [])
    if is_game(task):  # played in episodes (kit/games.py): the one-shot hooks below do not apply
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
    """The task a TrainConfig names, built with its task_args."""
    return get_task(cfg.task, cfg.num_agents, **cfg.task_args)


def check_task(task, num_agents: int) -> None:
    """Fail early, naming what is missing, when an object does not meet the Task contract."""
    for attr in ("load", "prompts"):
        if not callable(getattr(task, attr, None)):
            raise TypeError(f"task {task!r} has no {attr}() method; see kit/tasks/__init__.py for the contract")
    n = getattr(task, "num_agents", num_agents)
    if n != num_agents:
        raise ValueError(f"task {getattr(task, 'name', task)!r} is for {n} agents but num_agents={num_agents}")


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
