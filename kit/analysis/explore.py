"""Browse a run's rollouts: the logic (tested without a browser) and an ipywidgets front end over it. Past 400 lines
on purpose (about 450): the browser's logic and its front end stay together, so what a widget shows is next to the
tested function that computes it.

    log = RunLog("checkpoints/colab_a100")
    rows = log.rows(step=100, min_reward=1.0, part="tests", part_min=0.5)
    html = render_rows(rows, log.roles)               # prompts, each agent's completion, parts, advantages
    breakdown(rows[0])                                # the reward of one joint action, part by part
    log.rescore(rows[0], agent=1, text=edited_code)   # the task's reward with one completion replaced
    log.rescore(rows[0], completions=[helper, main])  # ... or all of them; render_reward(...) adds its diagnosis
    browser("checkpoints/colab_a100")                 # the widget (05_explore.ipynb)

The browser's breakdown, prompts and editors always show the joint action picked in its dropdown (a filter or the
step slider that changes the list picks the first row again unless the picked one still matches); each agent has
its own editor, and "re-score" scores them together.

A game run (kit/tasks/games.py) logs one row per episode; `log.replay(row)` rebuilds it move by move (the whole table
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
        from kit.run.rundir import open_run

        self.run = open_run(self.run_dir)
        self.cfg = self.run.cfg
        self.reload()

    def reload(self) -> None:
        from kit.run.rundir import ROLLOUTS, read_jsonl

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
        """Whether the run logged game episodes (kit/tasks/games.py) rather than joint actions."""
        from kit.tasks.game import is_game

        return is_game(self.task)

    def replay(self, row: dict) -> list[dict]:
        """A logged episode, one frame per decision (kit.tasks.games.replay)."""
        from kit.tasks.games import replay

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

    def rescore(self, row: dict, agent: int | None = None, text: str | None = None,
                completions: list[str] | None = None):
        """The task's reward for this joint action with agent `agent`'s completion replaced by `text`, or with
        every completion replaced by `completions` (the browser's editors, one per agent)."""
        if completions is None:
            completions = list(row["completions"])
            if agent is None or not 0 <= agent < len(completions):
                raise ValueError(f"agent={agent}; this joint action has agents 0..{len(completions) - 1}")
            completions[agent] = text
        elif len(completions) != len(row["completions"]):
            raise ValueError(f"{len(completions)} completions; this joint action has {len(row['completions'])}")
        from kit.tasks.rewards import as_reward

        if not callable(getattr(self.task, "reward", None)):  # the environment owns the reward (task=rows)
            raise ValueError(f"this run's reward is its environment's get_reward() after the agents acted on it "
                             f"({self.cfg.environment or 'no environment'}), not a function of the text: edited text "
                             "cannot be re-scored without replaying its tool calls, which the explorer does not do. "
                             "The logged reward and its parts above are what the run saw.")
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
    out += [(f"logged {k}", float(v)) for k, v in row.get("logged", {}).items()]  # kit.tasks.rewards.log_metric
    out += [(k, float(row[k])) for k in ("score", "illegal", "length") if k in row]  # a game episode
    out.append(("total", float(row["reward"])))
    if "return" in row:
        out.append(("return", float(row["return"])))
    out += [(f"advantage[{i}]", float(a)) for i, a in enumerate(row.get("advantages", []))]
    if "advantage" in row:
        out.append(("advantage", float(row["advantage"])))
    return out


def breakdown_table(row: dict) -> str:
    """`breakdown` as a markdown table headed by the joint action's step and item: 05's cell without widgets."""
    from kit.analysis.evaluate import format_table

    head = f"step {row.get('step')}, item {row.get('item')}"
    return f"{head}\n\n" + format_table([{"part": k, "value": v} for k, v in breakdown(row)], ["part", "value"])


SCROLL = "max-height:16em;overflow:auto;white-space:pre-wrap"  # long text scrolls in its box instead of being cut


def _scroll(text: str) -> str:
    return f"<pre style='{SCROLL}'>{html.escape(text)}</pre>"


def render_rows(rows: list[dict], roles: list[str], agent: int | None = None, limit: int = 20,
                max_chars: int = 1500) -> str:
    """An HTML table: one row per joint action, one column per agent (or only `agent`), parts at the end.
    Each agent's whole prompt is one click away (scrollable)."""
    if not rows:
        return "<p>No joint actions match these filters.</p>"
    agents = range(len(roles)) if agent is None else [agent]
    head = "".join(f"<th>{html.escape(roles[a])}</th>" for a in agents)
    body = []
    for r in rows[:limit]:
        cells = []
        for a in agents:
            text = html.escape(r["completions"][a][:max_chars])
            adv = r.get("advantages", [None] * len(roles))[a]
            cells.append(f"<td><details><summary>prompt</summary>{_scroll(r['prompts'][a])}</details>"
                         f"<pre>{text}</pre><small>advantage {adv if adv is None else f'{adv:+.3f}'}</small></td>")
        parts = "<br>".join(f"{html.escape(k)}: {v:.3f}" for k, v in breakdown(r) if not k.startswith("advantage"))
        if r.get("violation"):  # what the sandbox refused, and why the row earned no test credit
            parts += f"<br><b>violation</b>: {html.escape(str(r['violation']))}"
        body.append(f"<tr><td>{html.escape(str(r['item']))}<br>turn {r.get('turn', 0)}</td>{''.join(cells)}"
                    f"<td>{parts}</td></tr>")
    more = f"<p>{len(rows) - limit} more not shown.</p>" if len(rows) > limit else ""
    return (f"<table><tr><th>item</th>{head}<th>reward</th></tr>{''.join(body)}</table>{more}")


def render_joint(row: dict, roles: list[str]) -> str:
    """One joint action in full: its breakdown, then every agent's whole prompt side by side (scrollable)."""
    parts = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>" for k, v in breakdown(row))
    if row.get("violation"):
        parts += f"<tr><td><b>violation</b></td><td>{html.escape(str(row['violation']))}</td></tr>"
    head = "".join(f"<th>{html.escape(role)}'s prompt</th>" for role in roles)
    prompts = "".join(f"<td style='vertical-align:top'>{_scroll(p)}</td>" for p in row["prompts"])
    acted = ""
    if row.get("reset"):  # what the environment's reset(**row) added to every agent's prompt above
        acted += (f"<tr><td colspan='{len(roles)}'><b>the environment's reset added to each prompt</b>: "
                  f"{html.escape(str(row['reset']))}</td></tr>")
    if row.get("transcripts"):  # a run with an environment: each agent's tool calls and their results
        acted += ("<tr>" + "".join(f"<th>{html.escape(role)}'s tool calls and results</th>" for role in roles)
                 + "</tr><tr>" + "".join(f"<td style='vertical-align:top'>{_scroll(t)}</td>"
                                         for t in row["transcripts"]) + "</tr>")
    return (f"<p>{html.escape(str(row['item']))} · step {row['step']} · turn {row.get('turn', 0)}</p>"
            f"<table>{parts}</table><table style='width:100%'><tr>{head}</tr><tr>{prompts}</tr>{acted}</table>")


def render_details(details: dict) -> str:
    """What a task found while scoring (Reward.details: failing asserts, errors, the level reached), as HTML;
    multi-line values (the extracted code) fold away."""
    lines = []
    for key, value in (details or {}).items():
        name = html.escape(str(key))
        if value is None or value == "" or (isinstance(value, (list, tuple, dict)) and not value):
            continue
        if isinstance(value, str) and "\n" in value:
            lines.append(f"<details><summary>{name}</summary>{_scroll(value)}</details>")
        elif isinstance(value, (list, tuple)):
            items = "".join("<li><code>" + " → ".join(html.escape(str(x)) for x in
                                                       (v if isinstance(v, (list, tuple)) else [v])) + "</code></li>"
                            for v in value)
            lines.append(f"{name}:<ul>{items}</ul>")
        elif isinstance(value, dict):
            lines.append(f"{name}: " + ", ".join(f"{html.escape(str(k))}={html.escape(str(v))}"
                                                 for k, v in value.items()))
        else:
            lines.append(f"{name}: {html.escape(str(value))}")
    return "<br>".join(lines)


def render_reward(reward) -> str:
    """A re-score: the total, each part, and the task's diagnosis (its details), so a new reward comes with why."""
    parts = ", ".join(f"{html.escape(k)} {v:.3f}" for k, v in reward.parts.items())
    diagnosis = render_details(reward.details)
    return f"<p><b>total {reward.total:.3f}</b>: {parts}</p>" + (f"<div>{diagnosis}</div>" if diagnosis else "")


def _key(row: dict) -> tuple:
    """What names a joint action across reloads of the log (a reload makes new row objects)."""
    return (row["step"], row["item"], row.get("turn", 0), row.get("node"), tuple(row.get("joint", ())),
            tuple(row["completions"]))


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


def _answer(decision: dict, limit: int) -> str:
    """The model's answer as it wrote it (escaped, cut to `limit`), or "(empty)"."""
    text = decision["completion"].strip()
    if not text:
        return "(empty)"
    return html.escape(text[:limit] + ("…" if len(text) > limit else ""))


def _played(decision: dict) -> str:
    """The move played: the move itself, or for an illegal answer what was played in its place."""
    if decision["legal"]:
        return html.escape(str(decision["move"]))
    instead = "the game ended" if decision["move"] is None else html.escape(str(decision["move"]))
    return (f"<span style='color:#c00' title='illegal answer: {_answer(decision, 200)}'>"
            f"✗ {_answer(decision, 24)} → {instead}</span>")


def render_episodes(rows: list[dict], roles: list[str], limit: int = 20) -> str:
    """An HTML table of game episodes: deal, score, return, advantage, and the moves played in order. An illegal
    answer is shown in red beside what was played for it (a random legal move, or the end of the game)."""
    if not rows:
        return "<p>No episodes match these filters.</p>"
    body = []
    for r in rows[:limit]:
        moves = " ".join(f"<span title='{html.escape(roles[d['player']])}'>{_played(d)}</span>"
                         for d in r["decisions"])
        body.append(f"<tr><td>{html.escape(str(r['item']))} #{r['episode']}</td><td>{r['score']:g}</td>"
                    f"<td>{r['reward']:g}</td><td>{r['advantage']:+.3f}</td><td>{moves}</td></tr>")
    more = f"<p>{len(rows) - limit} more not shown.</p>" if len(rows) > limit else ""
    return ("<table><tr><th>deal</th><th>score</th><th>return</th><th>advantage</th><th>moves</th></tr>"
            f"{''.join(body)}</table>{more}")


def render_frame(frame: dict, roles: list[str], max_chars: int = 3000) -> str:
    """One decision of a replayed game: the whole table before it, who acts, what it saw and answered, and the
    move played (for an illegal answer: the answer and its replacement, apart)."""
    who = "-" if frame["player"] is None else html.escape(roles[frame["player"]])
    prompt = f"<details><summary>prompt</summary>{_scroll(frame['prompt'])}</details>" if frame["prompt"] else ""
    if frame["player"] is None:
        outcome = f"<p><b>{html.escape(str(frame['move']))}</b></p>"
    elif frame["legal"]:
        outcome = (f"<p>answer: <code>{_answer(frame, max_chars)}</code> → move "
                   f"<b>{html.escape(str(frame['move']))}</b></p>")
    else:
        instead = ("the game ended (illegal answers end it)" if frame["move"] is None else
                   f"a random legal move was played instead: <b>{html.escape(str(frame['move']))}</b>")
        outcome = (f"<p>answer: <code>{_answer(frame, max_chars)}</code> "
                   f"<b style='color:#c00'>not a legal move</b></p><p>{instead}</p>")
    return (f"<p>decision {frame['decision']} · <b>{who}</b> · score so far {frame['score']:g}</p>"
            f"<pre>{html.escape(frame['state'][:max_chars])}</pre>{prompt}{outcome}")


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
    written = "code" if log.cfg.task == "code" else "text"  # what an agent writes: code, or a writing run's text
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
    pick = w.Dropdown(description="joint action", layout=w.Layout(width="60%"))
    detail = w.HTML()
    n = len(log.roles)  # one editor per agent, side by side: every agent's code can be changed at once
    editors = [w.Textarea(layout=w.Layout(width="100%", height="220px")) for _ in range(n)]
    edit_box = w.HBox([w.VBox([w.HTML(f"<b>{html.escape(role)}</b>"), ed], layout=w.Layout(width=f"{100 / n:.0f}%"))
                       for role, ed in zip(log.roles, editors)])
    rescore = w.Button(description="re-score")
    result = w.HTML()
    state = {"rows": [], "quiet": False}

    def selected() -> dict | None:
        i = pick.value
        return state["rows"][i] if i is not None and 0 <= i < len(state["rows"]) else None

    def refresh(*_):
        """New filters: the table, and the dropdown's joint actions. The picked joint action stays picked (with
        its edits) while it still matches, a reload included; otherwise the first one is picked and shown. Options are set
        quietly: ipywidgets 7 and 8 move the value differently when options change, and neither may reach
        `show` with a half-updated dropdown."""
        before = selected()
        chosen = None if part.value == "(any)" else part.value
        state["rows"] = log.rows(step=step.value, min_reward=reward.value[0], max_reward=reward.value[1],
                                 part=chosen, part_min=part_min.value if chosen else None)
        table.value = render_rows(state["rows"], log.roles, None if agent.value < 0 else agent.value)
        keep = next((i for i, r in enumerate(state["rows"]) if before and _key(r) == _key(before)), None)
        state["quiet"] = True
        try:
            pick.options = [(f"{i}: {r['item']} (reward {r['reward']:.2f})", i) for i, r in enumerate(state["rows"])]
            pick.value = keep if keep is not None else (0 if state["rows"] else None)
        finally:
            state["quiet"] = False
        if keep is None:
            show()

    def show(*_):
        """Everything about one joint action follows the dropdown: breakdown, prompts, the editors."""
        if state["quiet"]:
            return
        row = selected()
        detail.value = "" if row is None else render_joint(row, log.roles)
        for a, ed in enumerate(editors):
            ed.value = "" if row is None else row["completions"][a]
        result.value = ""

    def on_rescore(_):
        row = selected()
        if row is None:
            result.value = "<p>No joint action is picked.</p>"
            return
        try:
            result.value = render_reward(log.rescore(row, completions=[ed.value for ed in editors]))
        except ValueError as err:  # a run whose reward cannot be recomputed from the text: said, not a traceback
            result.value = f"<p>{html.escape(str(err))}</p>"

    for widget in (step, agent, reward, part, part_min):
        widget.observe(refresh, names="value")
    pick.observe(show, names="value")
    reload.on_click(lambda _: reload_log(log, step, reward, refresh))
    rescore.on_click(on_rescore)
    refresh()
    return w.VBox([w.HBox([step, reload]), w.HBox([agent, reward]), w.HBox([part, part_min]), table,
                   w.HTML(f"<b>One joint action</b> (edit any agent's {written}, then re-score)"), pick, detail,
                   edit_box,
                   rescore, result])
