"""How many rows one engine call may generate: bounded by memory, not by a fixed batch size.

    cap = rows_that_fit(model, prompt_len=350, new_tokens=160)          # None: no bound known
    comp, logprobs = generate_bounded(engine, ids, mask, adapters, config, seeds, cap, group=G)
    with watching_decode(lambda step, total: ...):                      # a live bar inside long generate calls

A held-out evaluation samples every problem's n samples for every agent in one batched call (47 problems x 4
samples x 2 agents = 376 rows), which on a CPU decodes several times faster per token than a training step's 8
rows (the weights are read once per decoding step for all rows). What grows with the rows is memory: each row's KV
cache (layers x 2 x kv heads x head dim x positions) and the decoding step's (rows, vocabulary) float32 scores
(the logits, the warped scores, their log-softmax and the noisy scores: four of them). When the rows would need
more than half of the memory free now (the host's MemAvailable on a CPU, the GPU's free memory on CUDA), the call
is split into consecutive slices of whole requests (a request's G samples stay together, so a prompt's prefill is
still shared) and the slices' completions are joined, right-padded: each row is seeded on its own
(kit/engine/sampling.py), so it samples the same tokens whichever slice it is in.

An evaluation's one call decodes for minutes on a CPU; `watching_decode(fn)` has every engine call fn(step, total)
after each decoding step (a stopping criterion that never stops), so an analysis bar moves with the tokens, not once
per method (kit/analysis/progress.py: decoding_bar).

Not covered: the activations of a long prompt's prefill (forwarded once per distinct prompt), which a bound on the
rows does not see.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import StoppingCriteria

SCORE_COPIES = 4  # (R, V) float32 tensors alive during a decoding step (logits, warped, log-softmax, noisy)


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory free for this process now: the GPU's free memory, or the host's MemAvailable; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def bytes_per_row(config, positions: int, dtype: torch.dtype = torch.float32) -> int:
    """A row's KV cache over `positions` (in the model's `dtype`) and its share of a decoding step's scores, in
    bytes."""
    layers = config.num_hidden_layers
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * layers * heads * head_dim * (torch.finfo(dtype).bits // 8) * positions
    return kv + SCORE_COPIES * 4 * config.vocab_size


def rows_that_fit(model, prompt_len: int, new_tokens: int, free: int | None = None) -> int | None:
    """The most rows one call may generate within half the free memory (`free`: bytes, for tests); None when
    the free memory is unknown (no bound)."""
    device = next(model.parameters()).device
    free = free_memory_bytes(device) if free is None else free
    if free is None:
        return None
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    dtype = hf.dtype if hf.dtype.is_floating_point else torch.float32
    return max(1, (free // 2) // bytes_per_row(hf.config, prompt_len + new_tokens, dtype))


def generate_bounded(engine, input_ids: torch.Tensor, attention_mask: torch.Tensor, adapters: list[str],
                     config, row_seeds: torch.Tensor | None, cap: int | None, group: int = 1):
    """`engine.generate` over the rows, in slices of at most `cap` rows (whole groups of `group` rows, at least one
    group) when there are more: (completion (R, T), sampler log-probs (R, T)), right-padded with the pad token
    (log-prob 0) to the longest slice."""
    R = input_ids.shape[0]
    if cap is None or R <= cap:
        return engine.generate(input_ids, attention_mask, adapters, config, row_seeds)
    step = max(group, cap // group * group)
    parts = []
    for lo in range(0, R, step):
        hi = min(R, lo + step)
        parts.append(engine.generate(input_ids[lo:hi], attention_mask[lo:hi], adapters[lo:hi], config,
                                     None if row_seeds is None else row_seeds[lo:hi]))
    T = max(c.shape[1] for c, _ in parts)
    pad = config.pad_token_id
    comp = torch.cat([torch.nn.functional.pad(c, (0, T - c.shape[1]), value=pad) for c, _ in parts])
    logp = torch.cat([torch.nn.functional.pad(lp, (0, T - lp.shape[1]), value=0.0) for _, lp in parts])
    return comp, logp


_WATCHERS: list = []  # fn(step, total) per decoding step of every engine call made inside watching_decode


@contextmanager
def watching_decode(fn):
    """Inside: fn(step, max_new_tokens) after every decoding step of every engine call (step counts from 1 per
    call). A progress bar's hook; it never changes what is sampled."""
    _WATCHERS.append(fn)
    try:
        yield
    finally:
        _WATCHERS.remove(fn)


def decode_watchers(max_new_tokens: int) -> list:
    """The stopping criteria an engine adds to its generate call: one that tells the watchers (never stops), or
    none when nobody watches."""
    return [_Ticker(list(_WATCHERS), max_new_tokens)] if _WATCHERS else []


class _Ticker(StoppingCriteria):
    def __init__(self, watchers: list, total: int):
        self.watchers, self.total, self.step = watchers, total, 0

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        self.step += 1
        for fn in self.watchers:
            fn(self.step, self.total)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
