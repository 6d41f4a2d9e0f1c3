"""Batched generation for all agents at once, behind one entry point and several engines.

`generate(team, requests, ...)` takes a list of (agent, prompt) requests, expands each into G samples and runs
ONE engine call per base model (one in the usual homogeneous team), the rows of each adapter in one contiguous
block. Prompts get the tokenizer's chat template when it has one and are left-padded; generation stops at EOS.
The token ids and masks are kept so the update can score the exact tokens that were sampled. The trainer,
evaluation and baselines call only `generate`; which engine ran is the team's `rollout_engine`:

    hf        PEFT's own `generate`, every row routed to its adapter through `adapter_names` (eager)
    compiled  kit/engine/compiled.py: a generation model with all adapters stacked, static KV cache, CUDA graphs
    auto      compiled on CUDA, hf on a CPU

An engine is anything with `generate(input_ids, attention_mask, adapters, generation_config, row_seeds) -> ((R, T)
completion ids, (R, T) sampler log-probs)` and `sync()` (see `Engine`); a vLLM engine would slot in beside these
two, returning the log-probs vLLM computes (`logprobs_mode="processed_logprobs"`).

Sampling is exactly the config's: `sampling_config` sets every field that changes the distribution, so none is
inherited from a hub model's generation_config (Qwen's sets repetition_penalty=1.05 and top_k=20). Every sampled
row is seeded (kit/engine/sampling.py), and the engine returns, beside each token, its log-prob under the distribution
it was drawn from (temperature, top-k, top-p). The Segment keeps them; the update scores the same tokens at the
same temperature (kit/engine/forward.py) and corrects for the rest (top-k/top-p, numerics) by importance
weights (kit/maths/losses.py).

Not covered: speculative decoding; inference servers (vLLM, SGLang) are not wired in yet.

Past 400 lines on purpose (about 430): the one entry point to generation and the engines behind it; the
update's forward is kit/engine/forward.py.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kit.engine.batching import decode_watchers, generate_bounded, rows_that_fit
from kit.engine.forward import position_ids, prompt_groups
from kit.engine.prompts import answer_start
from kit.engine.sampling import row_seed, sampled_logprobs, seeded_config


@dataclass
class Segment:
    """The rows of one base model's generate call.

    input_ids / attention_mask: (R, P + T), the left-padded prompt followed by the completion.
    completion_mask: (R, T), 1 on completion tokens up to and including the first EOS.
    sample: (R,) index of each row in the flattened sample list (request * G + g).
    agent: (R,) the agent of each row.
    sampler_logprobs: (R, T) float32, each sampled token's log-prob under the sampler's distribution (0 off the
        completion mask; 0 everywhere for greedy rows).
    finished: (R,) bool, the completion ended with EOS (False: cut at max_new_tokens).
    """

    base: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    sample: torch.Tensor
    agent: torch.Tensor
    sampler_logprobs: torch.Tensor
    finished: torch.Tensor

    def slice(self, lo: int, hi: int) -> "Segment":
        """Rows lo..hi (a micro-batch of the update)."""
        return Segment(self.base, self.input_ids[lo:hi], self.attention_mask[lo:hi], self.completion_mask[lo:hi],
                       self.prompt_len, self.sample[lo:hi], self.agent[lo:hi], self.sampler_logprobs[lo:hi],
                       self.finished[lo:hi])

    def rows(self, agents: list[int]) -> "Segment":
        """The sub-batch of the given agents' rows, with all-padding columns trimmed away."""
        keep = torch.isin(self.agent, torch.tensor(agents, device=self.agent.device))
        ids, att, comp = self.input_ids[keep], self.attention_mask[keep], self.completion_mask[keep]
        first = int(att[:, : self.prompt_len].any(0).int().argmax()) if self.prompt_len else 0
        # the completion's attended length (tool turns inside it are attended but off the completion mask)
        length = int(att[:, self.prompt_len:].sum(-1).max()) if comp.numel() else 0
        end = self.prompt_len + max(length, 1)
        return Segment(self.base, ids[:, first:end], att[:, first:end], comp[:, : end - self.prompt_len],
                       self.prompt_len - first, self.sample[keep], self.agent[keep],
                       self.sampler_logprobs[keep][:, : end - self.prompt_len], self.finished[keep])


@dataclass
class Rollout:
    """G completions for each request. `texts[k][g]` is the g-th completion of request k (after the request's
    `answer_start`, when its prompt is a `Prompt` that has one)."""

    requests: list[tuple[int, str]]
    texts: list[list[str]]
    segments: list[Segment] = field(default_factory=list)
    num_tokens: int = 0
    seconds: float = 0.0  # wall time inside generate calls (compilation excluded)
    compile_seconds: float = 0.0  # wall time spent compiling new shapes (compiled engine, first calls only)
    # with an environment (kit/engine/tools.py): each sample's whole transcript (tool calls and results), the
    # calls made, the time inside tools, get_reward() per world [group][g] when the environment owns the reward,
    # and get_agent_rewards() per world [group][g][agent] when it gives each agent its own share
    transcripts: list[list[str]] | None = None
    tool_calls: int = 0
    tool_seconds: float = 0.0
    world_rewards: list[list[float]] | None = None
    agent_rewards: list[list[list[float]]] | None = None
    reset_texts: list[list[str | None]] | None = None  # what reset(**row) added to the prompts, per world [group][g]

    def segment(self, base: int) -> Segment | None:
        """The rows generated on `base`; None when no request of this call was for it."""
        return next((s for s in self.segments if s.base == base), None)


def eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    return eos


def format_prompt(tokenizer, prompt: str, use_chat_template: bool = True) -> str:
    """The text the model sees: the chat template's user turn when the tokenizer has one (a `Chat` prompt: its
    messages)."""
    messages = getattr(prompt, "messages", None) or [{"role": "user", "content": str(prompt)}]
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) if getattr(prompt, "messages", None) else prompt


def encode_prompt(tok, prompt: str, use_chat_template: bool = True, max_tokens: int | None = None) -> list[int]:
    """The token ids the model sees for `prompt` (and its `answer_start`, after the assistant header); a prompt over
    `max_tokens` loses the middle of its user content.

    Never the chat template: the assistant header at its end is where the completion starts. Never just one end
    of the content: the kit's prompts state the task first and end with the instructions (and, for code, what to
    write), while the middle holds what can best be spared (the problem's body, the previous turn's code).
    """
    start = answer_start(prompt)
    ids = tok(format_prompt(tok, prompt, use_chat_template) + start, add_special_tokens=False).input_ids
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    mark = "\x00"  # the template's text around a user turn: what comes before and after the mark
    before, _, after = format_prompt(tok, mark, use_chat_template).partition(mark)
    after += start
    before, after = (tok(t, add_special_tokens=False).input_ids if t else [] for t in (before, after))
    room = max_tokens - len(before) - len(after)
    if room < 1:
        raise ValueError(f"max_prompt_tokens={max_tokens} leaves no room for the prompt: the chat template alone "
                         f"takes {len(before) + len(after)} tokens")
    content = tok(str(prompt), add_special_tokens=False).input_ids
    if len(content) > room:
        head = room // 2
        tail = room - head  # >= 1
        content = content[:head] + content[-tail:]
    return before + content + after


def kept_prompt(tok, prompt: str, use_chat_template: bool = True, max_tokens: int | None = None) -> str:
    """The prompt's own text as the sampler kept it under `max_tokens` (its middle cut exactly as encode_prompt
    cuts it, with the chat template's tokens counted), without the template and without the answer start, which
    begins the completion: what a reader of (prompt, completion) pairs should see."""
    ids = encode_prompt(tok, prompt, use_chat_template, max_tokens)
    if max_tokens is None or ids == encode_prompt(tok, prompt, use_chat_template, None):
        return str(prompt)
    mark = "\x00"
    before, _, after = format_prompt(tok, mark, use_chat_template).partition(mark)
    after += answer_start(prompt)
    b, a = (len(tok(t, add_special_tokens=False).input_ids) if t else 0 for t in (before, after))
    return tok.decode(ids[b:len(ids) - a])


def left_pad(rows: list[list[int]], pad_id: int, device) -> dict[str, torch.Tensor]:
    """input_ids and attention_mask (R, P): generation continues from the right edge of every row."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return {"input_ids": ids, "attention_mask": mask}


def completion_mask(completion: torch.Tensor, eos: list[int]) -> torch.Tensor:
    """(R, T) -> (R, T) long: 1 up to and including the first EOS, 0 after (padding)."""
    is_eos = torch.isin(completion, torch.tensor(eos, device=completion.device)).long()
    seen_before = torch.cumsum(is_eos, dim=-1) - is_eos  # EOS strictly before position t
    return (seen_before == 0).long()


def sampling_config(max_new_tokens: int, temperature: float, top_p: float, top_k: int, eos: list[int],
                    pad_token_id: int):
    """A GenerationConfig with every distribution-changing field set (temperature 0: greedy)."""
    from transformers import GenerationConfig

    sample = temperature > 0
    # greedy: transformers' global defaults (1.0, 1.0, 50), which it neither warns about nor fills from the model
    return GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, temperature=temperature if sample else 1.0,
                            top_p=top_p if sample else 1.0, top_k=top_k if sample else 50, repetition_penalty=1.0,
                            no_repeat_ngram_size=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                            eos_token_id=eos, pad_token_id=pad_token_id)


class Engine(Protocol):
    """A rollout engine: prompt token ids in, completion ids out, rows in the order given."""

    name: str
    compile_seconds: float  # cumulative time spent compiling

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, adapters: list[str],
                 generation_config, row_seeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(R, P) left-padded prompts, each row's adapter -> (R, T) completion ids (EOS, then padding) and (R, T)
        float32 log-probs of those tokens under the distribution sampled from (0 for greedy decoding).
        With `row_seeds` (R,) int64, sampling is per-row seeded (see `seeded_config`)."""
        ...

    def sync(self) -> None:
        """Pick up the adapters' current weights (after an optimizer step or a checkpoint load)."""
        ...


@contextmanager
def restored(model):
    """The model as it was, whatever happens inside: its train/eval mode, and no forward pre-hook added.

    PEFT's `generate(adapter_names=...)` routes rows to adapters with pre-hooks on every LoRA layer and removes them
    after the call, but not when the call raises (no try/finally around its context's `yield`, up to peft 0.21
    at least): a stop (KeyboardInterrupt) inside generation would leave them on, and every later forward would route a
    batch of another size by the stopped call's adapter names (`Length of adapter_names should be the same as the
    number of inputs`). Hooks that were there before are kept."""
    modules = list(model.modules())
    before = [set(m._forward_pre_hooks) for m in modules]
    was_training = model.training
    try:
        yield model
    finally:
        for m, keep in zip(modules, before):
            for key in [k for k in m._forward_pre_hooks if k not in keep]:
                m._forward_pre_hooks.pop(key, None)  # what the hook's handle.remove() does
                m._forward_pre_hooks_with_kwargs.pop(key, None)
        model.train(was_training)


class HFEngine:
    """PEFT's eager generate with mixed `adapter_names`: works for every model PEFT supports."""

    name = "hf"
    compile_seconds = 0.0
    carries_cache = True  # generate_carried: agents acting in rounds go on from their KV cache (kit/engine/tools.py)

    def __init__(self, model, share_prompts: bool = True):
        self.model, self.share_prompts = model, share_prompts

    def sync(self) -> None:  # PEFT reads its own weights
        pass

    def generate(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None):
        return self.generate_carried(input_ids, attention_mask, adapters, generation_config, row_seeds)[:2]

    @torch.no_grad()
    def generate_carried(self, input_ids, attention_mask, adapters, generation_config, row_seeds=None, past=None):
        """`generate`, going on from `past` when given (a KV cache of the first `past.get_seq_length()` columns of
        `input_ids`, made on the same adapters), and also returning the cache it ends with: (completion, sampler
        log-probs, cache). The cache holds every input column and the completion's columns but its last."""
        config, processors = seeded_config(generation_config, row_seeds)
        config = copy.copy(config)  # seeded_config may return the caller's own
        config.return_dict_in_generate = True
        with restored(self.model):
            self.model.eval()
            if past is None and self.share_prompts:
                past = self.prefill(input_ids, attention_mask, adapters)
            out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, adapter_names=adapters,
                                      generation_config=config, logits_processor=processors,
                                      stopping_criteria=decode_watchers(config.max_new_tokens),
                                      past_key_values=past)  # None: generate makes its own
        completion = out.sequences[:, input_ids.shape[1]:]
        return completion, sampled_logprobs(generation_config, processors, completion), out.past_key_values

    def prefill(self, input_ids, attention_mask, adapters):
        """The KV cache of every row's prompt but its last token, each distinct (prompt, adapter) forwarded once
        and its keys and values indexed out to its rows; `generate` goes on from it (the last token, then the
        completion). None when no two rows share a prompt."""
        from transformers import DynamicCache

        if input_ids.shape[1] < 2:  # a one-token prompt: nothing before its last token
            return None
        names = {a: i for i, a in enumerate(dict.fromkeys(adapters))}
        adapter = torch.tensor([names[a] for a in adapters], device=input_ids.device)[:, None]
        groups = prompt_groups(torch.cat([input_ids, adapter], dim=1), torch.cat([attention_mask, adapter], dim=1))
        if groups is None:
            return None
        first, group = groups
        cache = DynamicCache(config=self.model.config)
        mask = attention_mask[first, :-1]
        self.model(input_ids=input_ids[first, :-1], attention_mask=mask, position_ids=position_ids(mask),
                   adapter_names=[adapters[i] for i in first.tolist()], past_key_values=cache, use_cache=True,
                   logits_to_keep=1)
        cache.batch_select_indices(group)
        return cache


def auto_engine(device: torch.device) -> str:
    """What rollout_engine=auto picks: CUDA graphs pay off on a GPU; on a CPU the eager PEFT path is as fast."""
    return "compiled" if device.type == "cuda" else "hf"


def sampler_differs(team, cfg) -> str:
    """Why the sampler's distribution is not the trainer's (beyond the temperature, which the update applies too),
    or "" when they are the same computation up to float rounding: PEFT's own generate on a float32 base,
    without top-k/top-p."""
    if cfg.top_k > 0 or cfg.top_p < 1.0:
        return f"top_k={cfg.top_k}/top_p={cfg.top_p} truncate the sampled distribution"
    if getattr(cfg, "lora_dropout", 0.0) > 0:
        return f"lora_dropout={cfg.lora_dropout} makes the update's forward noisier than sampling"
    for model in team.models:
        hf = model.get_base_model() if hasattr(model, "get_base_model") else model
        engine = team.rollout_engine
        if engine == "auto":
            engine = auto_engine(next(model.parameters()).device)
        if engine != "hf":
            return f"the {engine} engine samples, with its own weights and kernels"
        if getattr(hf, "is_loaded_in_4bit", False) or getattr(hf, "is_loaded_in_8bit", False):
            return "the quantized base runs other kernels in generation than in the update"
        if getattr(hf, "dtype", torch.float32) != torch.float32:
            return f"{hf.dtype} rounds the KV-cached decode and the update's full forward differently"
    return ""


def rollout_correction(cfg, team, log=print) -> str:
    """The correction the update applies (kit/maths/losses.py): the config's, or for `auto` token_truncate whenever the
    sampler may differ from the trainer (`sampler_differs`) and none when it cannot."""
    if cfg.rollout_correction != "auto":
        return cfg.rollout_correction
    why = sampler_differs(team, cfg)
    if why:
        log(f"[kit] rollout_correction=auto: token_truncate (cap {cfg.rollout_is_cap:g}), since {why}")
        return "token_truncate"
    return "none"


def engine_for(team, base: int, log=print) -> Engine:
    """The team's engine for one base, built on first use and kept (the compiled engine holds its graphs)."""
    if base not in team.engines:
        model = team.models[base]
        choice = team.rollout_engine
        if choice == "auto":
            choice = auto_engine(next(model.parameters()).device)
        engine: Engine = HFEngine(model, team.share_prompts)
        if choice == "compiled":
            from kit.engine.compiled import CompiledEngine

            adapters = [a for a in team.adapters if team.base_of[team.agents_of_adapter(a)[0]] == base]
            try:
                engine = CompiledEngine(model, adapters, weights=team.generation_weights, log=log)
            except ValueError as err:
                if team.rollout_engine == "compiled":
                    raise ValueError(f"rollout_engine=compiled: {err}; use rollout_engine=hf") from err
                log(f"[kit] compiled rollout engine unavailable ({err}): using rollout_engine=hf")
        team.engines[base] = engine
    return team.engines[base]


@torch.no_grad()
def generate(team, requests: list[tuple[int, str]], num_generations: int, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, use_chat_template: bool = True,
             max_prompt_tokens: int | None = None, keys: list[tuple] | None = None, seed: int = 0) -> Rollout:
    """One batched engine call per base for all requests x G samples. temperature 0 means greedy.

    `keys` (one tuple per request) seed every sample on its own, from (seed, key, g): a request samples the same
    completions whatever else is in the batch (and on whichever process). Without keys, each row's seed is drawn
    from the global torch RNG (so `torch.manual_seed` still fixes the call)."""
    if keys is not None and len(keys) != len(requests):
        raise ValueError(f"{len(keys)} keys for {len(requests)} requests: give one key per request")
    G = num_generations
    texts: list[list[str]] = [[""] * G for _ in requests]
    out = Rollout(requests, texts)
    order = {a: i for i, a in enumerate(team.adapters)}
    for base, model in enumerate(team.models):
        mine = [k for k, (agent, _) in enumerate(requests) if team.base_of[agent] == base]
        if not mine:
            continue
        # each adapter's rows in one contiguous block (stable: request order, then g, inside a block)
        mine.sort(key=lambda k: order[team.adapter_of[requests[k][0]]])
        tok = team.tokenizers[base]
        device = next(model.parameters()).device
        prompts = [encode_prompt(tok, requests[k][1], use_chat_template, max_prompt_tokens) for k in mine]
        enc = left_pad([p for p in prompts for _ in range(G)], tok.pad_token_id, device)
        agents = [requests[k][0] for k in mine for _ in range(G)]
        eos = eos_ids(model, tok)
        config = sampling_config(max_new_tokens, temperature, top_p, top_k, eos, tok.pad_token_id)
        seeds = None  # greedy
        if keys is not None:
            seeds = torch.tensor([row_seed(seed, keys[k], g) for k in mine for g in range(G)])
        elif config.do_sample:  # seeded all the same, so that every engine returns the sampler's log-probs
            seeds = torch.randint(-2**63, 2**63 - 1, (len(agents),), dtype=torch.int64)
        engine = engine_for(team, base)
        engine.sync()  # every call samples from the adapters as they are now (after any optimizer step or load)
        compiled_before = engine.compile_seconds
        t0 = time.perf_counter()
        cap = rows_that_fit(model, enc["input_ids"].shape[1], max_new_tokens)  # bounded by memory, not a batch size
        comp, logprobs = generate_bounded(engine, enc["input_ids"], enc["attention_mask"],
                                          [team.adapter_of[a] for a in agents], config, seeds, cap, G)  # (R, T) each
        compile_s = engine.compile_seconds - compiled_before
        out.seconds += time.perf_counter() - t0 - compile_s
        out.compile_seconds += compile_s
        sample = torch.tensor([k * G + g for k in mine for g in range(G)], device=device)
        seg = build_segment(base, enc["input_ids"], enc["attention_mask"], comp, eos, sample,
                            torch.tensor(agents, device=device), logprobs)
        out.segments.append(seg)
        cmask = seg.completion_mask
        decoded = tok.batch_decode(comp * cmask + tok.pad_token_id * (1 - cmask), skip_special_tokens=True)
        for r, text in enumerate(decoded):
            k, g = divmod(int(sample[r]), G)
            texts[k][g] = answer_start(requests[k][1]) + text
        out.num_tokens += int(cmask.sum())
    return out


def build_segment(base: int, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion: torch.Tensor,
                  eos: list[int], sample: torch.Tensor, agent: torch.Tensor,
                  sampler_logprobs: torch.Tensor | None = None) -> Segment:
    """The update's view of one engine call: left-padded prompts (R, P) and completion ids (R, T) joined, with
    the completion mask (up to and including the first EOS), the attention over both, the sampler's log-probs
    (0 off the mask; None: greedy, all 0) and whether each row ended with EOS."""
    cmask = completion_mask(completion, eos)
    finished = torch.isin(completion, torch.tensor(eos, device=completion.device)).any(-1)
    logprobs = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device) \
        if sampler_logprobs is None else torch.where(cmask.bool(), sampler_logprobs.to(completion.device).float(), 0.0)
    return Segment(base, torch.cat([prompt_ids, completion], dim=1), torch.cat([prompt_mask, cmask], dim=1), cmask,
                   prompt_ids.shape[1], sample, agent, logprobs, finished)


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled; temperature 0 is greedy."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    use_chat_template: bool = True
    max_prompt_tokens: int | None = None

    @classmethod
    def from_config(cls, cfg) -> "SamplingParams":
        return cls(cfg.max_new_tokens, cfg.temperature, cfg.top_p, cfg.top_k, cfg.use_chat_template,
                   cfg.max_prompt_tokens)

    def greedy(self) -> "SamplingParams":
        return dataclasses.replace(self, temperature=0.0)


class Sampler:
    """The one way the trainer, evaluation and baselines sample: the team and the run's sampling settings, built
    once from the config (`params` for training and evaluation, `greedy` for the trainer's held-out check).

        sampler = Sampler.from_config(team, cfg)
        ro = sampler.sample([(agent, prompt), ...], n)            # n completions per request, one batched call
        ro = sampler.sample(requests, 1, sampler.greedy)

    Every call refreshes the engines first (`generate` syncs before each engine call), so sampling after an
    optimizer step or a checkpoint load never uses stale adapters. Tests pass a fake with the same `sample`.
    """

    def __init__(self, team, params: SamplingParams, seed: int = 0):
        self.team, self.params, self.greedy, self.seed = team, params, params.greedy(), seed

    @classmethod
    def from_config(cls, team, cfg) -> "Sampler":
        return cls(team, SamplingParams.from_config(cfg), cfg.seed)

    def sample(self, requests: list[tuple[int, str]], n: int, params: SamplingParams | None = None,
               keys: list[tuple] | None = None) -> Rollout:
        """n completions per request. With `keys` (one tuple per request, e.g. (step, item, turn, agent)), each
        sample is seeded from (the run's seed, key, sample index), independent of the rest of the batch."""
        return generate(self.team, requests, n, **dataclasses.asdict(params or self.params), keys=keys,
                        seed=self.seed)
