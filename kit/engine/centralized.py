"""algorithm=centralized (CoMLRL's CentralizedMAGRPO): ONE policy writes every agent's part in one completion.

    python -m kit train --preset tiny_cpu --set algorithm=centralized      # toy, code, writing

A single-agent upper bound for a team: the task is wrapped so that its one agent sees `task.single_prompt(item)`
(every part's instructions in one prompt) and its completion is split back into the N parts by
`task.split_single(item, text)` before the task's own joint reward scores them (the same pair the `single` baseline
uses, kit/analysis/baselines.py). Training is then MAGRPO with one agent (G completions per item, group-relative), so every
MAGRPO option applies. The team has one adapter (`agent_0`): `team_config` gives the config the team is built
from (num_agents = 1), while the run's config keeps the task's N (what config.json records and resumes with).

Multi-turn: the task's next-turn prompts (one per part) are joined into the one agent's next prompt.
Not covered: games (turn-based play has one mover per decision: self-play with `share_adapter=true` is the
one-policy version there), tasks without single_prompt/split_single (a ValueError says so).
"""

from __future__ import annotations

import dataclasses


def has(task, hook: str) -> bool:
    """The task has `hook` as a method (kit.tasks.has, here without importing kit.tasks, which imports this)."""
    return callable(getattr(task, hook, None))


def team_config(cfg):
    """The config a centralized team is built from: one agent, one adapter; any other config unchanged."""
    if cfg.algorithm != "centralized" or cfg.num_agents == 1:
        return cfg
    return dataclasses.replace(cfg, num_agents=1, agent_models=cfg.agent_models[:1] if cfg.agent_models else None,
                               agent_devices=cfg.agent_devices[:1] if cfg.agent_devices else None)


def wrap(cfg, task):
    """The task a run trains on: the task itself, or under algorithm=centralized its one-policy form."""
    if cfg.algorithm != "centralized" or isinstance(task, Centralized):
        return task
    return Centralized(task)


class Centralized:
    """One agent writes all N parts (see the module docstring)."""

    def __init__(self, task):
        name = getattr(task, "name", type(task).__name__)
        if not (has(task, "single_prompt") and has(task, "split_single")):
            raise ValueError(f"algorithm=centralized needs a task with single_prompt(item) and split_single(item, "
                             f"text) (one prompt for every part, and the text cut back into parts); task {name!r} "
                             "has not both")
        self.task, self.name, self.num_agents = task, name, 1
        self.parts = getattr(task, "num_agents", 2)
        self.roles = ["team"]

    def load(self, split: str = "train") -> list[dict]:
        return self.task.load(split)

    def prompts(self, item: dict) -> list[str]:
        return [self.task.single_prompt(item)]

    def split(self, item: dict, completions: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.task.split_single(item, completions[0]))

    def reward(self, item: dict, completions: tuple[str, ...]):
        return self.task.reward(item, self.split(item, completions))

    def is_pass(self, reward) -> bool:
        return self.task.is_pass(reward)

    def __getattr__(self, attr):
        if attr == "feedback" and has(self.task, "feedback"):
            return self._feedback
        if attr in ("task", "__setstate__"):  # not set yet (unpickling): no recursion
            raise AttributeError(attr)
        if attr in ("feedback", "single_prompt", "split_single", "is_game"):
            raise AttributeError(attr)  # these hooks are the wrapper's own to have or not
        return getattr(self.task, attr)

    def _feedback(self, item: dict, completions: tuple[str, ...], reward) -> list[str]:
        return ["\n".join(self.task.feedback(item, self.split(item, completions), reward))]
