"""Agents acting in rounds go on from their KV cache (kit/engine/tools.py): a round forwards only what is new since
the round before, each row's last generated token and its tool turn, not its whole context again.

    enc, past = inputs(live_rows, pad_id, model.config, device)   # past: None in the first round
    completion, logprobs, cache = engine.generate_carried(enc["input_ids"], enc["attention_mask"], adapters,
                                                          config, seeds, past)
    keep(cache, live_rows, enc["attention_mask"], generated)        # each live row keeps its own columns

A row (kit/engine/tools.py's _Row) holds `prompt + ids`, and `kv`/`cached`: per layer the keys and values of its first
`cached` tokens. `inputs` lays a round out as [padding, cached tokens | padding, new tokens]: the first P columns are
the batched cache, and the padding in the middle is masked and skipped by the positions (attention_mask.cumsum), so
every token sits where one forward of the whole row puts it and samples what that forward samples, up to float
rounding (tests/test_tool_cache.py compares the two on whole joint rollouts). `keep` takes a row's columns out of the
cache generate ended with: its unmasked input columns and this round's generated tokens the cache holds (generate never
forwards the last one, so that one is new in the next round). Only plain full-attention layers are carried; a cache
of sliding-window or other layers is not, and those rows forward their whole context, as every row does on an engine
without `generate_carried` (the compiled one).

May import: kit.engine.
"""

from __future__ import annotations

import torch


def inputs(rows: list, pad_id: int, config, device) -> tuple[dict, object]:
    """A round's inputs when each row goes on from its carried cache: the first P columns hold every row's cached
    tokens (left-padded to the longest), the rest its tokens not forwarded yet (the last round's last token, the
    tool turn; left-padded too). The padding in the middle is masked, and positions count only unmasked columns, so
    each token sits where one forward of the whole row puts it. (inputs, the rows' caches batched into one for the
    first P columns, or None when no row has one: plain left padding, as in the first round). The rows' caches move
    into the batched one (each row's `kv` is cleared); `keep` gives each live row its own again after generate."""
    full = [r.prompt + r.ids for r in rows]
    cached = [min(r.cached, len(f) - 1) if r.kv else 0 for r, f in zip(rows, full)]  # one token at least is new
    P, U = max(cached), max(len(f) - c for f, c in zip(full, cached))
    ids = [[pad_id] * (P - c) + f[:c] + [pad_id] * (U - len(f) + c) + f[c:] for f, c in zip(full, cached)]
    mask = [[0] * (P - c) + [1] * c + [0] * (U - len(f) + c) + [1] * (len(f) - c) for f, c in zip(full, cached)]
    enc = {"input_ids": torch.tensor(ids, device=device), "attention_mask": torch.tensor(mask, device=device)}
    if P == 0:
        return enc, None
    from transformers import DynamicCache

    past = DynamicCache(config=config)
    first = next(r.kv for r, c in zip(rows, cached) if c)
    for layer, (k0, v0) in enumerate(first):
        keys = k0.new_zeros(len(rows), k0.shape[0], P, k0.shape[2])  # (R, heads, P, head dim)
        values = v0.new_zeros(len(rows), v0.shape[0], P, v0.shape[2])
        for i, (r, c) in enumerate(zip(rows, cached)):
            if c:
                keys[i, :, P - c:] = r.kv[layer][0][:, :c]
                values[i, :, P - c:] = r.kv[layer][1][:, :c]
        past.update(keys, values, layer)
    for r in rows:  # the batched cache holds them now: a row's own copy would only double the memory until `keep`
        r.kv, r.cached = None, 0
    return enc, past


def keep(cache, rows: list, mask: torch.Tensor, generated: list[int]) -> None:
    """Keep on each row still live the KV of its tokens so far: its input columns (where `mask` is 1), then the
    first `generated` of this round's tokens that the cache holds (all but a last one generate never forwarded).
    A finished row drops its cache; a cache of sliding-window or other non-plain layers is not carried."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    plain = layers and all(type(layer) is DynamicLayer and layer.keys is not None for layer in layers)
    width = mask.shape[1]
    held = cache.get_seq_length() - width if plain else 0  # completion columns in the cache
    for i, (r, n) in enumerate(zip(rows, generated)):
        r.kv, r.cached = None, 0
        if r.live and plain:
            cols = torch.cat([mask[i].nonzero()[:, 0], width + torch.arange(min(n, held), device=mask.device)])
            r.kv, r.cached = [(layer.keys[i][:, cols], layer.values[i][:, cols]) for layer in layers], len(cols)
