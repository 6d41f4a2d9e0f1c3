"""Browse a run's rollouts: the logic (tested without a browser) and an ipywidgets front end over it.

    log = RunLog("checkpoints/colab_a100")
    rows = log.rows(step=100, min_reward=1.0, part="tests", part_min=0.5)
    html = render_rows(rows, log.roles)               # prompts, each agent's completion, parts, advantages
    breakdown(rows[0])                                # the reward of one joint action, part by part
    log.rescore(rows[0], agent=1, text=edited_code)   # the task's reward with one completion replaced
    browser("checkpoints/colab_a100")                 # the widget (05_explore.ipynb)

A game run (kit/games.py) logs one row per episode; `log.replay(row)` rebuilds it move by move (the whole table
before each decision, who acted, the prompt, the completion and the move), and `browser` then steps through games
instead of joint actions.

Everything is read from the run directory's files (config.json, rollouts.jsonl), so it works after a reconnect,
on a finished run, and while a run is still writing (press "reload").
"""

from __future__ import annotations

import html
from pathlib import Path


class RunLog:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        path = self.run_dir / "rollouts.jsonl"
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist: train with log_rollouts=true (the default) first")
        from kit.rundir import open_run

        self.run = open_run(self.run_dir)
        self.cfg = self.run.cfg
        self.reload()

    def reload(self) -> None:
        from kit.rundir import ROLLOUTS, read_jsonl

        self.all_rows = read_jsonl(self.run_dir / ROLLOUTS)

    @property
    def task(self):
        return self.run.task

    @property
    def roles(self) -> list[str]:
        roles = getattr(self.task, "roles", None)
        return list(roles) if roles else [f"agent_{i}" for i in range(self.cfg.num_agents)]

    @property
    def is_game(self) -> bool:
        """Whether the run logged game episodes (kit/games.py) rather than joint actions."""
        from kit.tasks.game import is_game

        return is_game(self.task)

    def replay(self, row: dict) -> list[dict]:
        """A logged episode, one frame per decision (kit.games.replay)."""
        from kit.games import replay

        return replay(self.task, row)

    def steps(self) -> list[int]:
        return sorted({r["step"] for r in self.all_rows})

    def parts(self) -> list[str]:
        return sorted({k for r in self.all_rows for k in r.get("parts", {})})

    def rows(self, step: int | None = None, turn: int | None = None, item: str | None = None,
             min_reward: float | None = None, max_reward: float | None = None, part: str | None = None,
             part_min: float | None = None) -> list[dict]:
        """Joint actions matching every filter given (None: no filter)."""
        out = []
        for r in self.all_rows:
            if step is not None and r["step"] != step or turn is not None and r.get("turn", 0) != turn:
                continue
            if item is not None and r["item"] != item:
                continue
            if (min_reward is not None and r["reward"] < min_reward) or \
                    (max_reward is not None and r["reward"] > max_reward):
                continue
            if part is not None and (part not in r.get("parts", {}) or
                                     (part_min is not None and r["parts"][part] < part_min)):
                continue
            out.append(r)
        return out

    def best(self, step: int | None = None) -> dict:
        """The joint action with the highest reward in `step` (default: the newest step)."""
        steps = self.steps()
        if not steps:
            raise ValueError(f"{self.run_dir}/rollouts.jsonl has no joint actions yet")
        return max(self.rows(step=steps[-1] if step is None else step), key=lambda r: r["reward"])

    def item(self, item_id: str) -> dict:
        for split in ("train", "eval"):
            for it in self.task.load(split):
                if it["id"] == item_id:
                    return it
        raise KeyError(f"item {item_id!r} is not in task {self.cfg.task!r}")

    def rescore(self, row: dict, agent: int, text: str):
        """The task's reward for this joint action with agent `agent`'s completion replaced by `text`."""
        completions = list(row["completions"])
        if not 0 <= agent < len(completions):
            raise ValueError(f"agent={agent}; this joint action has agents 0..{len(completions) - 1}")
        completions[agent] = text
        from kit.rewards import as_reward

        return as_reward(self.task.reward(self.item(row["item"]), tuple(completions)))


def reward_bounds(rows: list[dict]) -> tuple[float, float]:
    """The reward slider's range: every logged reward, rounded outwards (0..1 for an empty log)."""
    import math

    rewards = [float(r["reward"]) for r in rows] or [0.0, 1.0]
    low, high = math.floor(min(rewards)), math.ceil(max(rewards))
    return float(low), float(high if high > low else low + 1)


def breakdown(row: dict) -> list[tuple[str, float]]:
    """(name, value) for each reward part, then the total, the return and each agent's advantage."""
    out = [(k, float(v)) for k, v in row.get("parts", {}).items()]
    out += [(k, float(row[k])) for k in ("score", "illegal", "length") if k in row]  # a game episode
    out.append(("total", float(row["reward"])))
    if "return" in row:
        out.append(("return", float(row["return"])))
    out += [(f"advantage[{i}]", float(a)) for i, a in enumerate(row.get("advantages", []))]
    if "advantage" in row:
        out.append(("advantage", float(row["advantage"])))
    return out


def render_rows(rows: list[dict], roles: list[str], agent: int | None = None, limit: int = 20,
                max_chars: int = 1500) -> str:
    """An HTML table: one row per joint action, one column per agent (or only `agent`), parts at the end."""
    if not rows:
        return "<p>No joint actions match these filters.</p>"
    agents = range(len(roles)) if agent is None else [agent]
    head = "".join(f"<th>{html.escape(roles[a])}</th>" for a in agents)
    body = []
    for r in rows[:limit]:
        cells = []
        for a in agents:
            prompt = html.escape(r["prompts"][a][-300:])
            text = html.escape(r["completions"][a][:max_chars])
            adv = r.get("advantages", [None] * len(roles))[a]
            cells.append(f"<td><details><summary>prompt</summary><pre>{prompt}</pre></details>"
                         f"<pre>{text}</pre><small>advantage {adv if adv is None else f'{adv:+.3f}'}</small></td>")
        parts = "<br>".join(f"{html.escape(k)}: {v:.3f}" for k, v in breakdown(r) if not k.startswith("advantage"))
        if r.get("violation"):  # what the sandbox refused, and why the row earned no test credit
            parts += f"<br><b>violation</b>: {html.escape(str(r['violation']))}"
        body.append(f"<tr><td>{html.escape(str(r['item']))}<br>turn {r.get('turn', 0)}</td>{''.join(cells)}"
                    f"<td>{parts}</td></tr>")
    more = f"<p>{len(rows) - limit} more not shown.</p>" if len(rows) > limit else ""
    return (f"<table><tr><th>item</th>{head}<th>reward</th></tr>{''.join(body)}</table>{more}")


def reload_log(log: RunLog, step, reward, refresh) -> None:
    """A browser's reload button: read the log again, offer its new steps, widen the reward slider to the new
    rewards (a slider over the whole range stays whole), and redraw."""
    log.reload()
    step.options = log.steps() or [0]
    low, high = reward_bounds(log.all_rows)
    whole = reward.value == (reward.min, reward.max)
    reward.min, reward.max = min(reward.min, low), max(reward.max, high)
    if whole:
        reward.value = (reward.min, reward.max)
    refresh()


def episode_label(row: dict) -> str:
    return (f"{row['item']} #{row['episode']}: score {row['score']:g}, return {row['reward']:g}, "
            f"{row['length']} moves, {row['illegal']} illegal")


def render_episodes(rows: list[dict], roles: list[str], limit: int = 20) -> str:
    """An HTML table of game episodes: deal, score, return, advantage, and the moves in order (illegal ones
    struck through: a random legal move or the end of the game replaced them)."""
    if not rows:
        return "<p>No episodes match these filters.</p>"
    body = []
    for r in rows[:limit]:
        moves = " ".join(f"<span title='{html.escape(roles[d['player']])}'>"
                         + (html.escape(str(d["move"])) if d["legal"] else f"<s>{html.escape(str(d['move']))}</s>")
                         + "</span>" for d in r["decisions"])
        body.append(f"<tr><td>{html.escape(str(r['item']))} #{r['episode']}</td><td>{r['score']:g}</td>"
                    f"<td>{r['reward']:g}</td><td>{r['advantage']:+.3f}</td><td>{moves}</td></tr>")
    more = f"<p>{len(rows) - limit} more not shown.</p>" if len(rows) > limit else ""
    return ("<table><tr><th>deal</th><th>score</th><th>return</th><th>advantage</th><th>moves</th></tr>"
            f"{''.join(body)}</table>{more}")


def render_frame(frame: dict, roles: list[str], max_chars: int = 3000) -> str:
    """One decision of a replayed game: the whole table before it, who acts, what it saw and said, the move."""
    who = "-" if frame["player"] is None else html.escape(roles[frame["player"]])
    verdict = "" if frame["legal"] else " <b style='color:#c00'>(illegal: replaced)</b>"
    prompt = f"<details><summary>prompt</summary><pre>{html.escape(frame['prompt'][-max_chars:])}</pre></details>" \
        if frame["prompt"] else ""
    return (f"<p>decision {frame['decision']} · <b>{who}</b> · score so far {frame['score']:g}</p>"
            f"<pre>{html.escape(frame['state'][:max_chars])}</pre>{prompt}"
            f"<p>completion: <code>{html.escape(frame['completion'][:max_chars])}</code> → move "
            f"<b>{html.escape(str(frame['move']))}</b>{verdict}</p>")


def game_browser(log: RunLog):
    """The ipywidgets browser for game runs: step slider and return range, an episode picker, and a decision
    slider (with previous/next) that steps through the picked game move by move."""
    import ipywidgets as w

    steps = log.steps() or [0]
    step = w.SelectionSlider(options=steps, value=steps[-1], description="step", continuous_update=False)
    low, high = reward_bounds(log.all_rows)
    reward = w.FloatRangeSlider(value=(low, high), min=low, max=high, step=(high - low) / 100, description="return")
    reload = w.Button(description="reload")
    table = w.HTML()
    pick = w.Dropdown(description="episode", layout=w.Layout(width="60%"))
    decision = w.IntSlider(value=0, min=0, max=0, description="decision", continuous_update=False)
    back, forward = w.Button(description="◀ previous"), w.Button(description="next ▶")
    frame = w.HTML()
    state = {"rows": [], "frames": []}

    def refresh(*_):
        rows = log.rows(step=step.value, min_reward=reward.value[0], max_reward=reward.value[1])
        state["rows"] = sorted(rows, key=lambda r: -r["reward"])
        table.value = render_episodes(state["rows"], log.roles)
        pick.options = [(episode_label(r), i) for i, r in enumerate(state["rows"])]
        pick.value = 0 if state["rows"] else None  # ipywidgets 8 leaves no selection after new options
        open_episode()

    def open_episode(*_):
        if pick.value is None or pick.value >= len(state["rows"]):
            state["frames"], frame.value = [], ""
            return
        state["frames"] = log.replay(state["rows"][pick.value])
        decision.max = len(state["frames"]) - 1
        decision.value = 0
        show()

    def show(*_):
        if state["frames"]:
            frame.value = render_frame(state["frames"][min(decision.value, len(state["frames"]) - 1)], log.roles)

    step.observe(refresh, names="value")
    reward.observe(refresh, names="value")
    pick.observe(open_episode, names="value")
    decision.observe(show, names="value")
    back.on_click(lambda _: setattr(decision, "value", max(decision.value - 1, 0)))
    forward.on_click(lambda _: setattr(decision, "value", min(decision.value + 1, decision.max)))
    reload.on_click(lambda _: reload_log(log, step, reward, refresh))
    refresh()
    return w.VBox([w.HBox([step, reload]), reward, table, w.HTML("<b>One game, move by move</b>"), pick,
                   w.HBox([back, decision, forward]), frame])


def browser(run_dir: str | Path):
    """The ipywidgets browser: step slider, agent / reward range / part filters, breakdown, and re-scoring
    (a game run: episodes, stepped through move by move)."""
    try:
        import ipywidgets as w
    except ImportError:
        raise RuntimeError("the browser needs ipywidgets: pip install ipywidgets (Colab has it)") from None
    log = RunLog(run_dir)
    if log.is_game:
        return game_browser(log)
    steps = log.steps() or [0]
    step = w.SelectionSlider(options=steps, value=steps[-1], description="step", continuous_update=False)
    agent = w.Dropdown(options=[("all", -1)] + [(r, i) for i, r in enumerate(log.roles)], value=-1,
                       description="agent")
    low, high = reward_bounds(log.all_rows)
    reward = w.FloatRangeSlider(value=(low, high), min=low, max=high, step=(high - low) / 100, description="reward")
    part = w.Dropdown(options=["(any)"] + log.parts(), description="part")
    part_min = w.FloatText(value=0.0, description="part >=")
    reload = w.Button(description="reload")
    table = w.HTML()
    pick = w.Dropdown(description="joint action")
    detail = w.HTML()
    which = w.Dropdown(options=[(r, i) for i, r in enumerate(log.roles)], description="replace")
    editor = w.Textarea(layout=w.Layout(width="100%", height="160px"))
    rescore = w.Button(description="re-score")
    result = w.HTML()
    state = {"rows": []}

    def refresh(*_):
        chosen = None if part.value == "(any)" else part.value
        state["rows"] = log.rows(step=step.value, min_reward=reward.value[0], max_reward=reward.value[1],
                                 part=chosen, part_min=part_min.value if chosen else None)
        table.value = render_rows(state["rows"], log.roles, None if agent.value < 0 else agent.value)
        pick.options = [(f"{i}: {r['item']} (reward {r['reward']:.2f})", i) for i, r in enumerate(state["rows"])]

    def show(*_):
        if pick.value is None or pick.value >= len(state["rows"]):
            detail.value = ""
            return
        row = state["rows"][pick.value]
        detail.value = "<br>".join(f"{html.escape(k)}: {v:.3f}" for k, v in breakdown(row))
        editor.value = row["completions"][which.value]

    def on_rescore(_):
        if pick.value is None:
            return
        r = log.rescore(state["rows"][pick.value], which.value, editor.value)
        result.value = f"total {r.total:.3f}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.parts.items())

    for widget in (step, agent, reward, part, part_min):
        widget.observe(refresh, names="value")
    for widget in (pick, which):
        widget.observe(show, names="value")
    reload.on_click(lambda _: reload_log(log, step, reward, refresh))
    rescore.on_click(on_rescore)
    refresh()
    show()
    return w.VBox([w.HBox([step, reload]), w.HBox([agent, reward]), w.HBox([part, part_min]), table,
                   w.HTML("<b>One joint action</b>"), pick, detail, which, editor, rescore, result])
