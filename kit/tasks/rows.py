"""Rows as a task: a JSONL file, one row per line, each passed whole to the environment's `reset(**row)` (TRL's
dataset rows with `environment_factory`).

    task=rows  task_args={file: rows.jsonl, eval_file: null, num_eval: 8, roles: [scout, solver]}
    environment=my_module:MyEnv

A row needs `prompt`: a string, or a list of chat messages ({"role", "content"}) as TRL reads it. Every agent gets
that prompt with its role said first ("You are the scout, one of a team of 2 agents: scout, solver."), as the other
tasks tell each agent its part. `answer_start` starts every agent's answer (as the code task's prefill), e.g.
'<tool_call>{"name": "' to have a small model's first words be a tool call. `id` is optional (the line number otherwise). Held-out rows: `eval_file`, else the
first `num_eval` rows of `file` (and training the rest).

The reward: the environment's get_reward() when it has one; otherwise reward functions given to the trainer
(a rows task has no reward of its own). Bad rows are a DataError naming the file, line and field.
"""

from __future__ import annotations

import json
from pathlib import Path

from kit.env import data_path

from kit.engine.prompts import Chat, Prompt

DATA = Path(__file__).resolve().parent.parent / "data"
from kit.tasks import DataError, check_arg, is_text


class RowsTask:
    name = "rows"

    def __init__(self, num_agents: int = 2, file: str | None = None, eval_file: str | None = None, num_eval: int = 8,
                 roles: list[str] | None = None, answer_start: str = ""):
        file, eval_file = bundled(file), bundled(eval_file)
        check_arg(isinstance(file, str) and Path(file).is_file(), "file", file,
                  "the path of a JSONL file of rows (or the name of one in kit/data/)")
        check_arg(eval_file is None or Path(str(eval_file)).is_file(), "eval_file", eval_file,
                  "null or the path of a JSONL file of held-out rows")
        check_arg(isinstance(num_eval, int) and num_eval >= 0, "num_eval", num_eval, "an integer >= 0")
        roles = list(roles) if roles else [f"agent_{i}" for i in range(num_agents)]
        check_arg(len(roles) == num_agents and all(is_text(r) for r in roles), "roles", roles,
                  f"one non-empty name per agent ({num_agents})")
        check_arg(isinstance(answer_start, str), "answer_start", answer_start, "a string (\"\": none)")
        self.num_agents, self.roles, self.answer_start = num_agents, roles, answer_start
        self.file, self.eval_file, self.num_eval = file, eval_file, num_eval

    def load(self, split: str) -> list[dict]:
        rows = read_rows(self.file)
        if self.eval_file:
            return read_rows(self.eval_file) if split == "eval" else rows
        return rows[: self.num_eval] if split == "eval" else rows[self.num_eval:]

    def prompts(self, item: dict) -> list[str]:
        who = ", ".join(self.roles)
        out = []
        for role in self.roles:
            said = f"You are the {role}, one of a team of {self.num_agents} agents: {who}."
            prompt = item["prompt"]
            if isinstance(prompt, str):
                out.append(Prompt(f"{said}\n\n{prompt}", self.answer_start))
                continue
            messages = [dict(m) for m in prompt]
            if messages[0]["role"] == "system":
                messages[0]["content"] = f"{said}\n\n{messages[0]['content']}"
            else:
                messages.insert(0, {"role": "system", "content": said})
            out.append(Chat(messages, self.answer_start))
        return out


def bundled(file):
    """A data file as the user names it: the path as given, else in data/ (kit.env.data_path: the user's own data),
    else a file bundled in kit/data/ (key_rows.jsonl: KeyHalves' 64 rows); unchanged when none exists (reading it
    then says what is missing)."""
    if not isinstance(file, str):
        return file
    found = data_path(file)
    if found is not None:
        return str(found)
    return str(DATA / file) if (DATA / file).is_file() else file


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a JSONL file; each needs `prompt` (a string or chat messages); `id` defaults to the line number."""
    rows, seen = [], set()
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise DataError(f"{path}, line {line_no}: not JSON ({err.msg}); each line is one JSON object") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {line_no}: a JSON object is expected, got {type(row).__name__}")
        prompt = row.get("prompt")
        chat = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant") and isinstance(m.get("content"),
                                                                                                  str) for m in prompt)
        if not (is_text(prompt) or chat):
            got = repr(prompt)[:200]
            raise DataError(f"{path}, line {line_no}, field 'prompt': a non-empty string or a list of chat messages "
                            f"({{'role': 'system'|'user'|'assistant', 'content': str}}) is expected, got {got}")
        item = {**row, "id": row.get("id", f"row{line_no}"), "reset_row": row}  # reset(**row) gets the row as written
        if item["id"] in seen:
            raise DataError(f"{path}, line {line_no}, field 'id': {item['id']!r} is used twice; ids must be unique")
        seen.add(item["id"])
        rows.append(item)
    if not rows:
        raise DataError(f"{path}: no rows (one JSON object per line is expected)")
    return rows


def make_task(num_agents: int = 2, **task_args) -> RowsTask:
    return RowsTask(num_agents=num_agents, **task_args)
