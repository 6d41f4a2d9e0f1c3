"""Tasks: one module per task, each exposing `make_task(num_agents, **task_args)`.

A task is any object with `name`, `num_agents`, `roles`, `load(split)`, `prompts(item)` and
`reward(item, completions) -> Reward | float`, and optionally `feedback(item, completions, reward)` for
multi-turn. `from_functions` builds one from plain functions for a notebook cell.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable


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
