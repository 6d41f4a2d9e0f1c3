"""Agents that call tools: the joint rollout with an environment (kit/sandbox/envhost.py runs it in a child process).

    sampler = ToolSampler(team, params, host, roles, max_tool_calls=4)
    ro = sampler.sample(requests, G, keys=keys, worlds=items)    # as Sampler.sample, plus one row per world group

A world is one joint rollout: the N agents' g-th samples of one item act on one environment instance (the team
shares a world; `tools_by_role` gives a role its own tools). Requests come in groups of N, one per agent, as the
trainer builds them; `worlds[n]` is the row of group n, passed whole to `reset(**row)`, and what reset returns is
added to every agent's prompt of that world.

A rollout runs in rounds. Each round is one batched engine call per base for every live row of every world, each
row on its agent's adapter. A row whose new text holds tool calls (and has calls left: `max_tool_calls` per agent
per turn) gets each call run in its world, in agent order, and the results appended as the chat template's tool
turn, rendered by the template and tokenized on its own: the ids of the history are extended, never re-tokenized.
The results of an agent's last allowed call end with NO_CALLS_LEFT (its next text is its answer), and that answer
is started with the prompt's `final_start` when it has one (kit/engine/prompts.py: the code task's
`code_after_tools`), off the mask like the tool turn and in front of the text the reward reads; a round before it is
started with the prompt's `round_starts` (a schedule of calls: the code task's `prefill: discussion`, a post, then a
read), parsed with its start as a prefilled first call is.
A round stops at the end of its first complete call (`</tool_call>`, a stop string as vLLM-served agents use), or of
the last of several written one after another (parallel calls: their results come back in one tool turn); what
follows is dropped, and the template's end of the assistant turn opens the tool turn. A row without a call (or out
of calls, or of its `max_new_tokens` budget) is done; its text for the reward is its last round's answer (after the
final start, if one was put before it), its whole transcript (calls and results) is kept for logs.

The update sees one Segment per base as from `generate`: the prompt, then every round's generated tokens and the
tool turns between them. The completion mask is 1 on generated tokens and 0 on tool-turn tokens, so the policy
loss, the old and reference log-probs, the rollout correction and any critic skip them (they all read the mask),
while attention covers them (the model reads the results). Sampler log-probs are 0 off the mask.

Tool calls are parsed from the text as Qwen's (Hermes) format, `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`: the chat templates that support tools (Qwen2.5's among them) prompt for it, and a template without tool
support (SmolLM2's) gets the same format described in a system turn and the results as a user turn
`<tool_response>...</tool_response>` (kit/engine/toolcalls.py). A text with no <tool_call> block may still call a tool with a JSON object that
names one of the environment's tools and gives its arguments (Qwen2.5-Coder-0.5B answers a tool prompt with a
```json block of exactly that).

On the HF engine a round goes on from each row's KV cache of the round before (kit/engine/carry.py). Not covered:
truncating a tool prompt to max_prompt_tokens; the compiled engine (CUDA) forwards each round's whole context.

May import: kit.engine, kit.sandbox.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import torch

from kit.engine import carry
from kit.engine.prompts import answer_start, final_start, round_start, round_starts, starts
from kit.engine.rollout import (Rollout, Sampler, Segment, completion_mask, engine_for, eos_ids, left_pad,
                                sampling_config)
from kit.engine.sampling import row_seed
from kit.engine.toolcalls import (call_end, parse_calls, prompt_ids, started_calls, template_has_tools,
                                  tool_turn_text)

# added to the last result of an agent's last call of the turn (max_tool_calls): a call after it is not run, and its
# text is what the reward reads (the untrained 0.5B coder, told by a result to test again, wrote the call anyway)
NO_CALLS_LEFT = "(You have no tool calls left: give your final answer now, without a call.)"


@dataclass
class _Row:
    k: int  # request
    g: int  # sample
    agent: int
    world: int
    prompt: list[int]
    ids: list[int]
    mask: list[int]
    logp: list[float]
    calls_left: int
    answer: str = ""
    finished: bool = False
    live: bool = True
    calls: int = 0
    pending: list = field(default_factory=list)  # this round's calls, run after every base's generation
    end_text: str = ""  # how the round's text ended (its EOS token's text; "" when stopped at </tool_call>)
    answer_round: int = 0
    lead: str = ""  # the start put after the tool turn of its last round: its final answer's, or its next round's
    kv: list | None = None  # per layer (keys, values) of the row's first `cached` tokens, carried between rounds
    cached: int = 0


class ToolSampler(Sampler):
    """A Sampler whose agents act on an environment (module docstring). Without `worlds` it samples as Sampler.
    `acts` tells the callers (the trainer, evaluation) to pass the worlds; a plain sampler never gets them."""

    acts = True

    def __init__(self, team, params, host, roles: list[str], max_tool_calls: int = 4, seed: int = 0,
                 agent_rewards: bool = False):
        super().__init__(team, params, seed)
        self.host, self.roles, self.max_tool_calls = host, list(roles), max_tool_calls
        self.agent_rewards = agent_rewards  # read get_agent_rewards() after each rollout (local_reward_weight > 0)
        self.tool_calls, self.completions = 0, 0  # counted over every acted sample (evaluation reads the rate)

    def sample(self, requests, n, params=None, keys=None, worlds=None) -> Rollout:
        if worlds is None:
            return super().sample(requests, n, params, keys)
        out = act(self.team, requests, n, params or self.params, worlds=worlds, host=self.host, roles=self.roles,
                  max_tool_calls=self.max_tool_calls, keys=keys, seed=self.seed, agent_rewards=self.agent_rewards)
        self.tool_calls, self.completions = self.tool_calls + out.tool_calls, self.completions + len(requests) * n
        return out


def sampler_for(team, cfg, log=print) -> Sampler:
    """The run's sampler: with `cfg.environment`, a ToolSampler whose agents (team.roles) act on it, its class run
    in a child process (kit/sandbox/envhost.py; `tool_workers` > 1: that many, envpool.py); otherwise the plain one.
    Training and evaluation build it alike."""
    if not getattr(cfg, "environment", None):
        return Sampler.from_config(team, cfg)
    from kit.engine.rollout import SamplingParams
    from kit.sandbox.envhost import EnvHost
    from kit.sandbox.envpool import EnvPool

    workers, options = getattr(cfg, "tool_workers", 1), dict(timeout_s=cfg.tool_timeout_s,
                                                             args=getattr(cfg, "environment_args", None))
    host = EnvHost(cfg.environment, **options) if workers == 1 else EnvPool(cfg.environment, workers, **options)
    log(f"[kit] environment {cfg.environment}: tools {', '.join(sorted(host.tools)) or 'none'}"
        + (f" (by role: {host.by_role})" if host.by_role else "")
        + ("; it owns the reward (get_reward)" if host.has_reward else "")
        + (" and gives each agent its share (get_agent_rewards: local_0 ..)" if host.has_agent_rewards else ""))
    roles = list(getattr(team, "roles", None) or [f"agent_{i}" for i in range(cfg.num_agents)])
    return ToolSampler(team, SamplingParams.from_config(cfg), host, roles, cfg.max_tool_calls, cfg.seed,
                       agent_rewards=host.has_reward and getattr(cfg, "local_reward_weight", 0) > 0)


def act(team, requests, G: int, params, *, worlds: list[dict], host, roles: list[str], max_tool_calls: int,
        keys=None, seed: int = 0, agent_rewards: bool = False) -> Rollout:
    """G samples of each request, its agents acting on the world of its group (module docstring); with
    `agent_rewards`, each world's get_agent_rewards() too (a float per role, `out.agent_rewards[group][g]`)."""
    N = len(roles)
    if len(requests) != len(worlds) * N:
        raise ValueError(f"{len(requests)} requests for {len(worlds)} worlds of {N} agents: give one row per group "
                         "of N requests (one request per agent)")
    for agent, prompt in requests:  # an answer (or a round) started as a call of a tool its agent lacks: refused
        lacking = [(f"round {i}" if i else "answer", t)
                   for i, start in enumerate((answer_start(prompt), *round_starts(prompt)))
                   for t in started_calls(start) if t not in host.tools_for(roles[agent])]
        if lacking:
            (part, tool), where = lacking[0], getattr(host, "spec", "the environment")
            why = (f"{where} gives it to another role (tools_by_role)" if tool in host.tools else
                   f"{where} has no such tool ({sorted(host.tools)})")
            raise ValueError(f"{roles[agent]}'s {part} is started as a call of {tool!r}, and {why}: run it with an "
                             "environment that offers that tool to this role, or start it otherwise")
    tool_before = host.tool_seconds
    # reset(**row): an item's `reset_row` when it has one (the rows task keeps the row as written), else the item
    # each world's randomness seeded from (seed, its group's key, sample), as the kit seeds its own sampling
    world_keys = [("world", *keys[n * N][:-1]) if keys else ("world", n) for n in range(len(worlds))]
    added = host.reset([dict(worlds[w // G].get("reset_row", worlds[w // G])) for w in range(len(worlds) * G)],
                       [row_seed(seed, world_keys[w // G], w % G) for w in range(len(worlds) * G)])
    stray = sorted(set(host.by_role) - set(roles))
    if stray and not getattr(host, "_said_roles", False):
        host._said_roles = True
        print(f"[kit] WARNING: the environment's tools_by_role names {stray}, which are not roles of this team "
              f"({roles}): those tools are offered to no agent")
    out = Rollout(requests, [[""] * G for _ in requests])
    out.transcripts = [[""] * G for _ in requests]
    out.reset_texts = [[added[w * G + g] for g in range(G)] for w in range(len(worlds))]
    out.tool_calls = 0
    rows: list[_Row] = []
    for k, (agent, prompt) in enumerate(requests):
        base = team.base_of[agent]
        tok = team.tokenizers[base]
        schemas = list(host.tools_for(roles[agent]).values())
        for g in range(G):
            world = (k // N) * G + g
            text = prompt if not added[world] else _with(prompt, added[world])
            ids = prompt_ids(tok, text, schemas, params.use_chat_template)
            rows.append(_Row(k, g, agent, world, ids, [], [], [], max_tool_calls))
    config_for = {}
    native = {b: template_has_tools(team.tokenizers[b], list(host.tools.values())) for b in range(len(team.models))}
    round_ = 0
    while any(r.live for r in rows):
        for base, model in enumerate(team.models):
            live = [r for r in rows if r.live and team.base_of[r.agent] == base]
            if not live:
                continue
            tok = team.tokenizers[base]
            eos = eos_ids(model, tok)
            budget = [params.max_new_tokens - sum(r.mask) for r in live]
            config = config_for.setdefault((base, max(budget)), sampling_config(
                max(budget), params.temperature, params.top_p, params.top_k, eos, tok.pad_token_id))
            device = next(model.parameters()).device
            seeds = None
            if config.do_sample:
                seeds = torch.tensor([row_seed(seed, (*keys[r.k], "round", round_) if keys else (r.k, round_), r.g)
                                      for r in live])
            engine = engine_for(team, base)
            engine.sync()
            adapters = [team.adapter_of[r.agent] for r in live]
            t0 = time.perf_counter()
            if getattr(engine, "carries_cache", False):  # each row goes on from its cache of the last round
                enc, past = carry.inputs(live, tok.pad_token_id, model.config, device)
                comp, logprobs, cache = engine.generate_carried(enc["input_ids"], enc["attention_mask"], adapters,
                                                                config, seeds, past)
            else:
                enc, cache = left_pad([r.prompt + r.ids for r in live], tok.pad_token_id, device), None
                comp, logprobs = engine.generate(enc["input_ids"], enc["attention_mask"], adapters, config, seeds)
            out.seconds += time.perf_counter() - t0
            cmask = completion_mask(comp, eos)
            logprobs = torch.zeros(comp.shape) if logprobs is None else logprobs
            before = [len(r.ids) for r in live]
            for i, (r, room) in enumerate(zip(live, budget)):
                length = min(int(cmask[i].sum()), room)
                new = comp[i, :length].tolist()
                ended = length > 0 and new[-1] in eos
                called = call_end(tok, new)  # a round stops after its first complete call(s) (a stop string)
                stopped = called is not None and r.calls_left > 0
                if stopped:
                    new, length = new[:called], called
                r.ids += new
                r.mask += [1] * length
                r.logp += logprobs[i, :length].float().tolist()
                text = tok.decode(new, skip_special_tokens=True)
                start = answer_start(requests[r.k][1]) if round_ == 0 else r.lead  # a started call: its start too
                calls = parse_calls(start + text, host.tools) if (ended or stopped) and r.calls_left > 0 else []
                if calls and sum(r.mask) < params.max_new_tokens:
                    r.end_text = tok.decode(new[-1:]) if new[-1] in eos else ""  # stopped at </tool_call>: the
                    # template's end of the assistant turn is part of the tool turn (off the mask)
                    r.answer, r.answer_round = text, round_
                    r.pending = calls[: r.calls_left]
                else:  # finished: ended with EOS (a round cut at </tool_call> by the budget did not)
                    r.answer, r.answer_round, r.finished, r.live = text, round_, ended, False
            if cache is not None:
                carry.keep(cache, live, enc["attention_mask"], [len(r.ids) - n for r, n in zip(live, before)])
            past = cache = None  # the rows hold their columns now: the batch's cache is not kept through the tools
        # every base has generated: the round's calls run in (world, agent) order, whichever base an agent is on
        # (in one batch: with tool_workers > 1 the worlds' calls run in parallel, each world's in this order)
        calling = sorted((r for r in rows if r.live and r.pending), key=lambda r: (r.world, r.agent))
        answers = iter(_run(host, [(r, call) for r in calling for call in r.pending], roles))
        for r in calling:
            base = team.base_of[r.agent]
            tok = team.tokenizers[base]
            results = [next(answers) for _ in r.pending]
            r.calls_left -= len(r.pending)
            if r.calls_left <= 0:  # told, so that its next text is its answer and not a call that will not run
                results[-1] = f"{results[-1]}\n{NO_CALLS_LEFT}"
                r.lead = final_start(requests[r.k][1])  # and that answer started, if the prompt says how
            else:  # its next round started, if the prompt schedules it (round_starts)
                r.lead = round_start(requests[r.k][1], round_ + 1)
            r.calls += len(r.pending)
            out.tool_calls += len(r.pending)
            r.pending = []
            suffix = tok(tool_turn_text(tok, results, r.end_text, params.use_chat_template, native[base]) + r.lead,
                         add_special_tokens=False).input_ids
            r.ids += suffix
            r.mask += [0] * len(suffix)
            r.logp += [0.0] * len(suffix)
        round_ += 1
    out.tool_seconds = host.tool_seconds - tool_before
    out.views = [host.view(w) for w in range(len(worlds) * G)]  # world w = group w // G's g-th joint rollout
    _segments(team, requests, G, rows, out)
    if host.has_reward:
        worlds_rewards = host.rewards(list(range(len(worlds) * G)))
        out.world_rewards = [[worlds_rewards[w * G + g] for g in range(G)] for w in range(len(worlds))]
    if agent_rewards:  # each agent's own share (the parts local_0 .. that local_reward_weight mixes)
        per_agent = host.agent_rewards(list(range(len(worlds) * G)), roles)
        out.agent_rewards = [[per_agent[w * G + g] for g in range(G)] for w in range(len(worlds))]
    return out


def _with(prompt, extra: str):
    """The prompt with what reset returned added to its (last user) content, keeping its answer starts."""
    from kit.engine.prompts import Prompt

    if getattr(prompt, "messages", None):
        messages = [dict(m) for m in prompt.messages]
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last]["content"] += "\n\n" + extra
        return type(prompt)(messages, **starts(prompt))
    return Prompt(f"{prompt}\n\n{extra}", **starts(prompt))


def _run(host, calls: list[tuple[_Row, dict]], roles: list[str]) -> list[str]:
    """Each (row, call)'s result, in order: a call that cannot run (unparsed, another role's tool) answers its error
    here; the others go to the environment in one batch (host.call_many)."""
    out, runs = [], []
    for row, call in calls:
        mine = host.tools_for(roles[row.agent])
        if "error" in call:
            out.append(json.dumps({"error": call["error"]}))
        elif call["name"] not in mine:
            out.append(json.dumps({"error": f"tool {call['name']!r} is not one of {roles[row.agent]}'s tools: "
                                            f"{sorted(mine)}"}))
        else:
            out.append(None)
            runs.append((row.world, call["name"], call["arguments"], roles[row.agent]))
    answers = iter(host.call_many(runs))
    return [next(answers) if result is None else result for result in out]


def _segments(team, requests, G: int, rows: list[_Row], out: Rollout) -> None:
    """One Segment per base from the rows (each adapter's rows in one block, as `generate` orders them)."""
    order = {a: i for i, a in enumerate(team.adapters)}
    for base, model in enumerate(team.models):
        mine = sorted((r for r in rows if team.base_of[r.agent] == base),
                      key=lambda r: (order[team.adapter_of[r.agent]], r.k, r.g))
        if not mine:
            continue
        tok = team.tokenizers[base]
        device = next(model.parameters()).device
        enc = left_pad([r.prompt for r in mine], tok.pad_token_id, device)
        T = max(1, max(len(r.ids) for r in mine))
        pad = tok.pad_token_id
        comp = torch.tensor([r.ids + [pad] * (T - len(r.ids)) for r in mine], device=device)
        cmask = torch.tensor([r.mask + [0] * (T - len(r.mask)) for r in mine], device=device)
        seen = torch.tensor([[1] * len(r.ids) + [0] * (T - len(r.ids)) for r in mine], device=device)
        logp = torch.tensor([r.logp + [0.0] * (T - len(r.logp)) for r in mine], dtype=torch.float32, device=device)
        out.segments.append(Segment(
            base, torch.cat([enc["input_ids"], comp], 1), torch.cat([enc["attention_mask"], seen], 1), cmask,
            enc["input_ids"].shape[1], torch.tensor([r.k * G + r.g for r in mine], device=device),
            torch.tensor([r.agent for r in mine], device=device), logp,
            torch.tensor([r.finished for r in mine], device=device)))
        for r in mine:  # the answer start was the prompt's only in the first round; a later answer's, the lead
            out.texts[r.k][r.g] = (answer_start(requests[r.k][1]) if r.answer_round == 0 else r.lead) + r.answer
            out.transcripts[r.k][r.g] = answer_start(requests[r.k][1]) + tok.decode(r.ids, skip_special_tokens=True)
            out.num_tokens += sum(r.mask)
