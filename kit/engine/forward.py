"""The update's forward over sampled rows: the log-probs of exactly the tokens the sampler drew.

    completion_logprobs(model, segment, temperature)   (R, T) log-probs (and entropies) of a Segment's completion
    prompt_groups(ids, mask)                           rows that share their prompt (a group's G samples)
    shared_prompt_forward(...)                         each shared prompt forwarded once, its KV cache reused by
                                                       its rows with gradients (exact: the same sums, once)

The log-probs go through the chunked head (kit/maths/losses.py), so a 150k vocabulary never materializes (R, T, V)
logits. Used by the trainer's update, the rollout correction's old log-probs, the reference (adapter off), critics
and reward models (kit/engine/heads.py). Not covered: sequence packing.
"""

from __future__ import annotations

import torch

from kit.env import release_freed_memory
from kit.maths.losses import head_logprobs, token_entropy, token_logprobs

# `seg` below is a kit/engine/rollout.py Segment (rows of one base: ids, masks, sampler log-probs); not imported,
# since rollout imports this module.


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as `generate` uses them; (R, L) -> (R, L)."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def _decoder_and_head(model):
    """(decoder, output weight) when log-probs can come from hidden states, else None (see completion_logprobs)."""
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = getattr(hf, getattr(hf, "base_model_prefix", ""), None)
    head = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    plain_head = (type(head) is torch.nn.Linear and head.bias is None and not head.weight.requires_grad
                  and not getattr(hf.config, "final_logit_softcapping", None) and not hasattr(hf, "logit_scale"))
    return (decoder, head.weight) if decoder is not None and decoder is not hf and plain_head else None


def prompt_groups(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct row (D,), each row's group (R,)) of left-padded (R, P) prompts, numbered by
    first appearance, when some rows are the same prompt (the G samples of a request); None when all differ."""
    if ids.shape[1] < 2 or len(ids) < 2:
        return None
    key = torch.cat([ids, mask], dim=1)  # the pad id may be a real token (SmolLM2's pad is <|im_end|>)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    # renumber the groups by first appearance, so that group order (and float sums) follow the rows
    first_of, order = {}, []
    for r, g in enumerate(inverse.tolist()):
        if g not in first_of:
            first_of[g] = len(order)
            order.append(r)
    if len(order) == len(inverse):
        return None
    group = torch.tensor([first_of[g] for g in inverse.tolist()], device=ids.device)
    return torch.tensor(order, device=ids.device), group


def checkpointed(module) -> bool:
    """Whether gradient checkpointing is on in a decoder (it drops the KV cache that prompt sharing reads)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in module.modules()) and module.training


def shared_prompt_forward(forward, seg, groups, config) -> torch.Tensor:
    """`forward(all_positions=False, **inputs)` (the outputs at the last position, or at every one) run once per
    distinct prompt, then once over the completions of all rows, each attending to its prompt's keys and values
    through the KV cache: the (R, T, ...) outputs at the positions that predict each completion token, as one
    forward of the whole rows gives them (the gradient too: the cache's rows are indexed, so each prompt's gradient
    is the sum over its completions)."""
    from transformers import DynamicCache

    first, group = groups
    P = seg.prompt_len
    pos = position_ids(seg.attention_mask)
    cache = DynamicCache(config=config)  # the model's layer types (a sliding-window layer keeps its window)
    head = forward(input_ids=seg.input_ids[first, :P], attention_mask=seg.attention_mask[first, :P],
                   position_ids=pos[first, :P], past_key_values=cache, use_cache=True)  # (D, 1, ...): the last
    if seg.input_ids.shape[1] - P == 1:  # one completion token: the prompt's last position predicts it
        return head[group]
    cache.batch_select_indices(group)  # every row's copy of its prompt's keys and values
    tail = forward(input_ids=seg.input_ids[:, P:-1], attention_mask=seg.attention_mask[:, :-1],
                   position_ids=pos[:, P:-1], past_key_values=cache, use_cache=True, all_positions=True)
    return torch.cat([head[group], tail], dim=1)  # (R, T, ...)


def completion_logprobs(model, seg, temperature: float = 1.0, entropy: bool = False,
                        share_prompts: bool = True):
    """Log-probs of the segment's completion tokens under the model's active adapter at the sampling
    `temperature` (softmax(logits / temperature), as the sampler drew them); (R, T). With `entropy`, also the
    policy's entropy at each of those positions (differentiable), as a second (R, T).

    With a frozen plain output layer (the usual LoRA setup) the decoder's hidden states go through
    `losses.head_logprobs`, which never holds all positions' logits at once (the update's memory peak with a
    150k vocabulary), the entropy included; otherwise the model's own logits are used.

    `share_prompts`: rows with the same prompt (the G samples of a request) forward it once and read its keys and
    values from a cache (`shared_prompt_forward`); the same log-probs and gradient up to float rounding. Not with
    gradient checkpointing, which drops the cache.

    First the C heap hands back what the last forward freed (kit.env.release_freed_memory): on a CPU, micro-batches
    of long rows (tool rounds) otherwise leave the process gigabytes above its live tensors.
    """
    release_freed_memory()
    T = seg.completion_mask.shape[1]
    parts = _decoder_and_head(model)
    P = seg.prompt_len
    groups = prompt_groups(seg.input_ids[:, :P], seg.attention_mask[:, :P]) \
        if share_prompts and P > 1 and not checkpointed(model) else None
    if parts is not None:
        decoder, weight = parts

        def forward(all_positions: bool = False, **inputs):  # hidden states at every position, or the last
            hidden = decoder(**inputs).last_hidden_state
            return hidden if all_positions else hidden[:, -1:]

        if groups is not None:
            hidden = shared_prompt_forward(forward, seg, groups, decoder.config)
        else:
            hidden = decoder(input_ids=seg.input_ids, attention_mask=seg.attention_mask,
                             position_ids=position_ids(seg.attention_mask), use_cache=False
                             ).last_hidden_state[:, -T - 1:-1]  # (R, T, H): position t predicts token t
        return head_logprobs(hidden, weight, seg.input_ids[:, -T:], temperature=temperature, entropy=entropy)

    def forward(all_positions: bool = False, **inputs):  # logits at every position, or the last
        return model(**inputs, logits_to_keep=0 if all_positions else 1).logits

    if groups is not None:
        logits = shared_prompt_forward(forward, seg, groups, model.config)
    else:
        logits = model(input_ids=seg.input_ids, attention_mask=seg.attention_mask,
                       position_ids=position_ids(seg.attention_mask), use_cache=False,
                       logits_to_keep=T + 1).logits[:, :-1]  # (R, T, V): position t predicts completion token t
    logp = token_logprobs(logits, seg.input_ids[:, -T:], temperature)
    return (logp, token_entropy(logits, temperature)) if entropy else logp
