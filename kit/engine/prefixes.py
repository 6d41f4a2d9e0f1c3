"""Texts that begin alike forward their common beginning once: prompt sharing for the scalar models.

The policy's update shares a prompt among its G completions by construction (kit/engine/rollout.py: a Segment's prompt
block is the same for the rows of one request). A critic or reward model reads whole texts instead: a q critic
each agent's prompt followed by each of its completions, a reward model the joint text of each joint action (the
G joint actions of an item share the system turn and the first agent's prompt). Here the shared beginnings are
found from the tokens themselves:

    groups = prefix_groups(rows)            # [(prefix length, [row, ...]), ...] or None: nothing worth sharing
    last = shared_prefix_hidden(decoder, input_ids, attention_mask)   # (R, H) or None

`prefix_groups` sorts the rows, so that rows with a common beginning sit next to each other, and cuts the sorted
order into runs with the most token forwards saved among such cuts: a run of k rows whose common prefix is p tokens
forwards that prefix once instead of k times, saving (k - 1) p (dynamic programming over the cut points). A group
that a prefix tree would form across a run of the sorted order (a short prefix shared around a long one) is not
formed: that costs speed, never exactness. Every row keeps at
least one token of its own after its group's prefix, so each row's last position is computed in the second pass.

`shared_prefix_hidden` forwards each group's prefix once (left-padded, into a KV cache of the model's layer
kinds), indexes the cache out to the group's rows, and forwards every row's remaining tokens (right-padded)
against it, at the positions one forward of the whole row would give them: the decoder's last hidden state at each
row's last token, as `decoder(whole rows)` gives it up to float rounding, and the same gradient (the cache's rows
are indexed, so a prefix's gradient is the sum over its rows). When the two passes would forward as many padded
positions as the whole rows, or not a tenth fewer (nothing shared, or short prefixes among long rows), it returns
None and the caller forwards the whole rows. Not under gradient checkpointing, which drops the cache (the caller
checks). With lora_dropout > 0 in training, the rows of a group share the prefix's dropout mask (whole rows draw
one each): the same expected gradient, other noise.

Run its tests: python -m pytest tests/test_prefix_sharing.py
"""

from __future__ import annotations

import torch

from kit.engine.rollout import left_pad
from kit.engine.forward import position_ids


def _common(a: list[int], b: list[int]) -> int:
    """The number of leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_groups(rows: list[list[int]]) -> list[tuple[int, list[int]]] | None:
    """Rows (token lists) cut into groups that share a prefix, the cut of the sorted rows that saves the most: each
    group as (shared prefix length, its rows in ascending order), groups ordered by their first row; a row alone
    is a group with prefix length 0. None when no two rows share a token (every row alone)."""
    order = sorted(range(len(rows)), key=lambda r: rows[r])
    # adjacent[i]: tokens shared by sorted rows i and i+1, capped so that each keeps one token of its own
    adjacent = [min(_common(rows[a], rows[b]), len(rows[a]) - 1, len(rows[b]) - 1) for a, b in zip(order, order[1:])]
    # best[j]: the most tokens saved by cutting sorted rows [0, j) into runs; cut[j]: where its last run starts
    best, cut = [0] * (len(rows) + 1), [0] * (len(rows) + 1)
    for j in range(1, len(rows) + 1):
        best[j], cut[j] = best[j - 1], j - 1  # row j-1 alone
        shared = None
        for i in range(j - 2, -1, -1):  # the run of sorted rows [i, j)
            shared = adjacent[i] if shared is None else min(shared, adjacent[i])
            if shared <= 0:
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], cut[j] = best[i] + (j - 1 - i) * shared, i
    if best[-1] == 0:
        return None
    groups, j = [], len(rows)
    while j > 0:
        i = cut[j]
        members = sorted(order[i:j])
        groups.append((min(adjacent[i:j - 1]) if j - i > 1 else 0, members))
        j = i
    return sorted(groups, key=lambda g: g[1][0])


def shared_prefix_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """(R, L) padded rows (left or right) -> (R, H): the decoder's last hidden state at each row's last token, each
    shared prefix forwarded once; None when sharing would not forward a tenth fewer positions (module docstring)."""
    from transformers import DynamicCache

    rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
    groups = prefix_groups(rows)
    if groups is None:
        return None
    width = max(p for p, _ in groups)
    # a row alone forwards its first tokens in the first pass too (up to the widest shared prefix): that pass's rows
    # are never empty, and the second pass is no wider than the shared rows need
    groups = [(p if len(members) > 1 else min(len(rows[members[0]]) - 1, width), members) for p, members in groups]
    prefix_len = {r: p for p, members in groups for r in members}
    tail = max(len(rows[r]) - prefix_len[r] for r in range(len(rows)))
    whole = len(rows) * input_ids.shape[1]
    if min(p for p, _ in groups) <= 0 or len(groups) * width + len(rows) * tail > 0.9 * whole:
        return None  # a one-token (or empty) row alone, or not a tenth fewer positions (worth a second call)
    device = input_ids.device
    prefix = left_pad([rows[members[0]][:p] for p, members in groups], 0, device)  # (D, W)
    group_of = torch.zeros(len(rows), dtype=torch.long, device=device)
    for g, (_, members) in enumerate(groups):
        group_of[members] = g
    rests = [rows[r][prefix_len[r]:] for r in range(len(rows))]
    rest_ids = torch.tensor([t + [0] * (tail - len(t)) for t in rests], device=device)  # (R, S) right-padded
    rest_mask = torch.tensor([[1] * len(t) + [0] * (tail - len(t)) for t in rests], device=device)
    starts = torch.tensor([prefix_len[r] for r in range(len(rows))], device=device)
    cache = DynamicCache(config=decoder.config)  # the model's layer kinds (a sliding-window layer keeps its window)
    decoder(**prefix, position_ids=position_ids(prefix["attention_mask"]), past_key_values=cache, use_cache=True)
    cache.batch_select_indices(group_of)  # every row's copy of its prefix's keys and values
    hidden = decoder(input_ids=rest_ids, attention_mask=torch.cat([prefix["attention_mask"][group_of], rest_mask], 1),
                     position_ids=starts[:, None] + torch.arange(tail, device=device), past_key_values=cache,
                     use_cache=True).last_hidden_state  # (R, S, H)
    return hidden[torch.arange(len(rows), device=device), rest_mask.sum(1) - 1]
