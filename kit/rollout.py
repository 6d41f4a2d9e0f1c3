"""Batched generation for all agents at once.

`generate(team, requests, ...)` takes a list of (agent, prompt) requests, expands each into G samples and runs
ONE `generate` call per base model (one in the usual homogeneous team), every row routed to its agent's LoRA
adapter through PEFT's `adapter_names`. Prompts get the tokenizer's chat template when it has one and are
left-padded; generation stops at EOS. The token ids and masks are kept so the update can score the exact
tokens that were sampled.

Not covered: vLLM or other inference servers; speculative decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import time

import torch

from kit.magrpo import token_logprobs


@dataclass
class Segment:
    """The rows of one base model's generate call.

    input_ids / attention_mask: (R, P + T), the left-padded prompt followed by the completion.
    completion_mask: (R, T), 1 on completion tokens up to and including the first EOS.
    sample: (R,) index of each row in the flattened sample list (request * G + g).
    agent: (R,) the agent of each row.
    """

    base: int
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_len: int
    sample: torch.Tensor
    agent: torch.Tensor

    def rows(self, agents: list[int]) -> "Segment":
        """The sub-batch of the given agents' rows, with all-padding columns trimmed away."""
        keep = torch.isin(self.agent, torch.tensor(agents, device=self.agent.device))
        ids, att, comp = self.input_ids[keep], self.attention_mask[keep], self.completion_mask[keep]
        first = int(att[:, : self.prompt_len].any(0).int().argmax()) if self.prompt_len else 0
        length = int(comp.sum(-1).max()) if comp.numel() else 0
        end = self.prompt_len + max(length, 1)
        return Segment(self.base, ids[:, first:end], att[:, first:end], comp[:, : end - self.prompt_len],
                       self.prompt_len - first, self.sample[keep], self.agent[keep])


@dataclass
class Rollout:
    """G completions for each request. `texts[k][g]` is the g-th completion of request k."""

    requests: list[tuple[int, str]]
    texts: list[list[str]]
    segments: list[Segment] = field(default_factory=list)
    num_tokens: int = 0
    seconds: float = 0.0  # wall time inside generate calls

    def segment(self, base: int) -> Segment:
        return next(s for s in self.segments if s.base == base)


def eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    return eos


def format_prompt(tokenizer, prompt: str, use_chat_template: bool = True) -> str:
    """The text the model sees: the chat template's user turn when the tokenizer has one."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt


def completion_mask(completion: torch.Tensor, eos: list[int]) -> torch.Tensor:
    """(R, T) -> (R, T) long: 1 up to and including the first EOS, 0 after (padding)."""
    is_eos = torch.isin(completion, torch.tensor(eos, device=completion.device)).long()
    seen_before = torch.cumsum(is_eos, dim=-1) - is_eos  # EOS strictly before position t
    return (seen_before == 0).long()


@torch.no_grad()
def generate(team, requests: list[tuple[int, str]], num_generations: int, *, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, use_chat_template: bool = True,
             max_prompt_tokens: int | None = None) -> Rollout:
    """One batched generate per base for all requests x G samples. temperature 0 means greedy."""
    G = num_generations
    texts: list[list[str]] = [[""] * G for _ in requests]
    out = Rollout(requests, texts)
    for base, model in enumerate(team.models):
        mine = [k for k, (agent, _) in enumerate(requests) if team.base_of[agent] == base]
        if not mine:
            continue
        tok = team.tokenizers[base]
        tok.padding_side = "left"  # generation continues from the right edge of every row
        prompts = [format_prompt(tok, requests[k][1], use_chat_template) for k in mine for _ in range(G)]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False,
                  truncation=max_prompt_tokens is not None, max_length=max_prompt_tokens)
        device = next(model.parameters()).device
        enc = {k: v.to(device) for k, v in enc.items()}
        agents = [requests[k][0] for k in mine for _ in range(G)]
        adapter_names = [team.adapter_of[a] for a in agents]
        eos = eos_ids(model, tok)
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k) if temperature > 0 \
            else dict(do_sample=False, temperature=None, top_p=None, top_k=None)
        was_training = model.training
        model.eval()
        t0 = time.perf_counter()
        seq = model.generate(**enc, adapter_names=adapter_names, max_new_tokens=max_new_tokens,
                             eos_token_id=eos, pad_token_id=tok.pad_token_id, **sampling)  # (R, P + T)
        out.seconds += time.perf_counter() - t0
        model.train(was_training)
        P = enc["input_ids"].shape[1]
        comp = seq[:, P:]
        cmask = completion_mask(comp, eos)
        attention = torch.cat([enc["attention_mask"], cmask], dim=1)
        sample = torch.tensor([k * G + g for k in mine for g in range(G)], device=device)
        out.segments.append(Segment(base, seq, attention, cmask, P, sample, torch.tensor(agents, device=device)))
        decoded = tok.batch_decode(comp * cmask + tok.pad_token_id * (1 - cmask), skip_special_tokens=True)
        for r, text in enumerate(decoded):
            k, g = divmod(int(sample[r]), G)
            texts[k][g] = text
        out.num_tokens += int(cmask.sum())
    return out


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses them; (R, L) -> (R, L)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def completion_logprobs(model, seg: Segment) -> torch.Tensor:
    """Log-probs of the segment's completion tokens under the model's active adapter; (R, T)."""
    T = seg.completion_mask.shape[1]
    out = model(input_ids=seg.input_ids, attention_mask=seg.attention_mask,
                position_ids=position_ids(seg.attention_mask), use_cache=False, logits_to_keep=T + 1)
    logits = out.logits[:, :-1]  # (R, T, V): position t predicts completion token t
    return token_logprobs(logits, seg.input_ids[:, -T:])
