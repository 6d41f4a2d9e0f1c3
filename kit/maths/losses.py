"""The update's per-token maths: log-probs (chunked through the output layer), the rollout correction, the
policy loss of every loss_type and option, and the reductions. Pure functions of tensors, no model and no
state; the advantages they take come from kit/maths/magrpo.py. Names follow TRL's GRPOConfig (README: "The
update's options").

    per token       on-policy (num_iterations = 1):  l_t = -A * log pi(a_t)                   (Eq. 2)
                    num_iterations > 1 (PPO/TRL):    l_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps_high) A),
                                                     r_t = pi(a_t) / pi_old(a_t), pi_old = the policy that sampled
                    times the rollout correction w_t (below), the padding masked out
    loss_type       sum (the paper's):   mean over rows of sum_t l_t
                    grpo:                mean over rows of (sum_t l_t / |o|)
                    dr_grpo:             sum_{rows,t} l_t / (rows * max_new_tokens)
                    token_mean = dapo = bnpo: sum_{rows,t} l_t / (completion tokens of the step)
    KL (optional)   beta * k3, k3 = exp(ref - logp) - (ref - logp) - 1 per completion token, reduced like the loss
                    and not weighted by the rollout correction (as TRL adds it)

More of TRL's GRPOTrainer (issue 33; `_compute_loss` and `_generate_and_score_completions` of TRL's main branch,
2025-26, followed term by term; where the kit differs it says so):
    importance_sampling_level  token: r_t as above; sequence (GSPO): one ratio per completion,
                    s = exp(sum_t m_t (logp_t - old_t) / |o|), clipped like r_t; the gradient flows through the
                    mean (TRL's GRPOTrainer; its experimental GSPO-token's stop-gradient form has the same value).
                    GSPO is this with loss_type grpo (one term per completion); a token-summing loss_type (sum,
                    token_mean, dr_grpo, cispo) weighs each completion's term by its length, and the config warns
    delta           (INTELLECT-2) the unclipped branch uses min(r, delta): l_t = -min(min(r, delta) A, clip(r) A)
    loss_type cispo (MiniMax-M1) l_t = -sg(min(r_t, 1 + eps_high)) A log pi(a_t), reduced like token_mean
                    (TRL caps at `epsilon_high` itself; here at 1 + epsilon_high, the paper's and the kit's clip)
    loss_type sapo  (SAPO) l_t = -(4 / tau) sigmoid(tau (r_t - 1)) A, tau = sapo_temperature_pos if A > 0 else
                    sapo_temperature_neg, reduced like grpo; its gradient at r = 1 is Eq. 2's
    off-policy mask (DeepSeek-V3.2) M = 0 for a completion with A < 0 and mean_t (logp_sampler - logp) > threshold:
                    the k1 estimate of KL(sampler || policy) over its tokens, against the sampler's log-probs as
                    TRL does (its `sampling_per_token_logps`; the kit always has them)
    use_bias_correction_kl  the KL term's k3 times the ratio r (with its gradient), as TRL
    top_entropy_quantile  ("Beyond the 80/20 rule") the policy term only where H_t >= the (1 - q) quantile of the
                    completion tokens' entropies (torch.quantile, linear), H_t = -sum_v p log p of the policy at the
                    sampling temperature, detached; per micro-batch (TRL: per device batch)
    entropy_coef    (TRL's) loss -= entropy_coef * sum_t k_t H_t / sum_t k_t, the mean entropy over the completion
                    tokens the entropy mask keeps (k_t: 1 on a completion token, times the top_entropy_quantile
                    mask when it is on), with its gradient; whatever the loss_type (TRL adds it after reducing
                    the loss). Over the whole step, however it is micro-batched: a micro-batch's sum_t k_t H_t is
                    divided by `entropy_norm` (the trainer's: the step's completion tokens times the micro-batch's
                    share, so that share x loss adds up to the step's mean under a per-row loss_type too); with
                    top_entropy_quantile < 1 the mask's quantile is per micro-batch, as TRL's is per device batch
At ratio 1 every form's gradient is Eq. 2's (tests/test_trl_options.py), so with num_iterations = 1 the kit takes
-A log pi per token for every loss_type (reduced as that loss_type reduces; the logged loss is that one, where TRL
logs the form's value, e.g. SAPO's -2A / tau); the masks, the entropy terms and the bias-corrected KL still act.

Sampler vs trainer. The engine returns the log-prob of every sampled token under the distribution it sampled from
(temperature, then top-k/top-p, renormalised; kit/engine/sampling.py), and the update scores the same tokens with the
trainer's forward at the sampling temperature (kit/engine/forward.py: completion_logprobs). Exact: the temperature. Corrected:
everything else that separates the two, i.e. top-k/top-p truncation (the trainer's full softmax gives a sampled
token less mass than the truncated one did) and numerics (a bf16 copy or another kernel for the 4-bit base, the
KV cache against a full forward). With rho_t = pi_old(a_t) / pi_sampler(a_t):

    rollout_correction  token_truncate (TIS): w_t = min(rho_t, cap)
                        sequence_mask (MIS):  w_t = rho_seq if rho_seq <= cap else 0,
                                              rho_seq = exp(mean_t log rho_t), the per-token geometric mean
                                              (a product would shrink with length under top-p: 0.93^256)
                        none:                 w_t = 1
    mismatch metrics    k3 = rho - log rho - 1 per token (an estimate of KL(sampler || trainer)), mean and max
                        rho, the share of tokens with rho > cap (what TIS truncates) and of completions with
                        rho_seq > cap (what MIS drops)

On-policy with num_iterations = 1: pi_old is the current policy (its log-probs detached), r_t = 1, and the loss is
Eq. 2 itself, unchanged.
"""

from __future__ import annotations

import torch

LOSS_TYPES = ("sum", "grpo", "dr_grpo", "token_mean", "dapo", "bnpo", "cispo", "sapo")
PER_ROW_LOSSES = ("sum", "grpo", "dr_grpo", "sapo")  # a mean over rows; the others are a mean over completion tokens
REDUCTIONS = {"cispo": "token_mean", "sapo": "grpo"}  # how TRL reduces these two forms; the others name theirs
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
ROLLOUT_CORRECTIONS = ("none", "token_truncate", "sequence_mask")


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] per position without materialising the full log-softmax twice.

    logits: (R, T, V), targets: (R, T) -> (R, T)
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature  # in fp32, as the sampler's TemperatureLogitsWarper divides
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (R, T)
    return picked - torch.logsumexp(logits, dim=-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H = -sum_v p_v log p_v of softmax(logits / temperature) per position; (R, T, V) -> (R, T)."""
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return -(logp.exp() * logp).sum(-1)


class _HeadLogProbs(torch.autograd.Function):
    """log softmax(h W^T / tau)[target] for N positions and, when asked, the entropy H_n = -sum_v p_nv log p_nv,
    CHUNK positions at a time, recomputed in backward (W frozen, z = h W^T / tau, p = softmax(z)):

        d logp_n / d h_n = (W[target_n] - sum_v p_nv W[v]) / tau
        d H_n / d h_n    = -sum_v p_nv (log p_nv + H_n) W[v] / tau
    At most two (CHUNK, V) blocks are alive at a time, in the forward and in the backward; with a
    151,936-token vocabulary the full fp32 logits of a step's rows are gigabytes. Without `entropy` the entropy
    output is empty and costs nothing.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk, temperature, entropy):  # (N, H), (V, H), (N,) -> (N,), (N,)
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        ent = torch.empty(hidden.shape[0] if entropy else 0, dtype=torch.float32, device=hidden.device)
        for i in range(0, hidden.shape[0], chunk):
            logits = _logits(hidden[i:i + chunk], weight, temperature)  # (c, V)
            lse = logits.logsumexp(-1)
            out[i:i + chunk] = logits.gather(-1, targets[i:i + chunk, None])[:, 0] - lse
            if entropy:  # H = logsumexp(z) - sum_v p_v z_v
                ent[i:i + chunk] = lse - torch.softmax(logits, -1).mul_(logits).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, ent)  # ent: (N,), what the entropy's backward needs
        ctx.chunk, ctx.temperature = chunk, temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use sends None: its term is skipped
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad, grad_ent):  # (N,) each, or None
        hidden, weight, targets, ent = ctx.saved_tensors
        if grad is None and grad_ent is None:
            return None, None, None, None, None, None
        grad_hidden = torch.empty_like(hidden)
        for i in range(0, hidden.shape[0], ctx.chunk):
            logits = _logits(hidden[i:i + ctx.chunk], weight, ctx.temperature)  # (c, V)
            g = torch.softmax(logits, -1)  # p; becomes the gradient in place (two (c, V) blocks: logits and g)
            h = None
            if grad_ent is not None:  # -grad_ent * p (log p + H), with log p + H = z - logsumexp(z) + H
                shift = (logits.logsumexp(-1) - ent[i:i + ctx.chunk])[:, None]
                h = logits.sub_(shift).mul_(g).mul_(-grad_ent[i:i + ctx.chunk, None])
            if grad is None:
                g = h
            else:
                g.mul_(-grad[i:i + ctx.chunk, None])  # -grad * p
                g.scatter_add_(-1, targets[i:i + ctx.chunk, None], grad[i:i + ctx.chunk, None].float())  # + onehot
                if h is not None:
                    g.add_(h)
            if ctx.temperature != 1.0:
                g.div_(ctx.temperature)
            grad_hidden[i:i + ctx.chunk] = (g.to(weight.dtype) @ weight).to(hidden.dtype)
        return grad_hidden, None, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """(c, H) -> (c, V) float32 logits / temperature, the division in fp32 as the sampler's."""
    logits = (hidden.to(weight.dtype) @ weight.t()).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


# elements of one (chunk, V) fp32 block of head_logprobs: 256 MiB, 441 positions of a 152k vocabulary
HEAD_BLOCK = 2 ** 26


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int | None = None,
                  temperature: float = 1.0, entropy: bool = False):
    """token_logprobs(hidden @ weight^T, targets, temperature) without materialising the logits of all positions;
    with `entropy`, also token_entropy of the same logits (differentiable: detach it where no gradient is wanted).

    hidden: (R, T, H) final hidden states, weight: (V, H) the frozen output layer, targets: (R, T) -> (R, T), or
    ((R, T), (R, T)) with `entropy`
    """
    R, T, H = hidden.shape
    if chunk is None:  # positions per block: at most HEAD_BLOCK logits (two blocks are alive at a time), at most 1024
        chunk = max(1, min(1024, HEAD_BLOCK // weight.shape[0]))
    out, ent = _HeadLogProbs.apply(hidden.reshape(R * T, H), weight, targets.reshape(R * T), chunk,
                                   float(temperature), entropy)
    return (out.view(R, T), ent.view(R, T)) if entropy else out.view(R, T)


def rollout_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor,
                    correction: str = "token_truncate", cap: float = 2.0) -> tuple[torch.Tensor, dict]:
    """Importance weights w (R, T) for tokens sampled by the sampler and scored by the trainer, and the
    mismatch's sums, for metrics over many micro-batches: divide k3, rho and past_cap by "tokens", and
    rows_past_cap (completions whose geometric-mean ratio exceeds the cap) by "rows".

    old_logp: the trainer's log-probs of the sampled tokens (before any step on this batch), sampler_logp: the
    sampler's, mask: 1 on completion tokens. rho = exp(old - sampler); see the module docstring for each mode.
    """
    m = mask.bool()
    if not torch.isfinite(sampler_logp[m]).all():
        raise ValueError("the sampler's log-probs of some sampled tokens are not finite (an engine that sampled "
                         "without per-row seeds, or one that returns no log-probs): they cannot weigh the update")
    log_rho = torch.where(m, old_logp.detach().double() - sampler_logp.double(), 0.0)  # (R, T); 0 off the mask
    rho = log_rho.exp()
    rows = m.any(-1)  # rows with a completion token (an empty completion has no ratio)
    seq = (log_rho.sum(-1) / m.sum(-1).clamp(min=1)).exp()  # (R,), the geometric mean of the row's ratios
    if correction == "none":
        w = torch.ones_like(rho)
    elif correction == "token_truncate":
        w = rho.clamp(max=cap)
    elif correction == "sequence_mask":
        w = torch.where(seq <= cap, seq, 0.0)[:, None].expand_as(rho)
    else:
        raise ValueError(f"rollout_correction={correction!r}; allowed: {ROLLOUT_CORRECTIONS}")
    k3 = rho - log_rho - 1  # 0 off the mask (rho = 1 there)
    sums = {"tokens": float(m.sum()), "k3": float(k3.sum()), "rho": float(rho[m].sum()),
            "rho_max": float(rho[m].max()) if m.any() else 1.0, "past_cap": float((rho[m] > cap).sum()),
            "rows": float(rows.sum()), "rows_past_cap": float((rows & (seq > cap)).sum())}
    return torch.where(m, w, 0.0).to(old_logp.dtype), sums


def log_importance_weights(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                           level: str = "token") -> torch.Tensor:
    """log r: (R, T) per token (`token`), or (R, 1) the masked mean of the row's log-ratios (`sequence`, GSPO)."""
    log_ratio = logp - old_logp.detach()
    if level == "token":
        return log_ratio
    if level == "sequence":
        m = mask.to(logp.dtype)
        return (torch.where(m.bool(), log_ratio, 0.0).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1))
    raise ValueError(f"importance_sampling_level={level!r}; allowed: {IMPORTANCE_SAMPLING_LEVELS}")


def cispo_terms(ratio: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor, epsilon_high: float) -> torch.Tensor:
    """CISPO (MiniMax-M1): -sg(min(r, 1 + epsilon_high)) * A * log pi; every token keeps a gradient."""
    return -ratio.clamp(max=1 + epsilon_high).detach() * adv * logp


def sapo_terms(ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float = 1.0,
               temperature_neg: float = 1.05) -> torch.Tensor:
    """SAPO: -(4 / tau) sigmoid(tau (r - 1)) * A, a soft gate in place of the clip; tau by the advantage's sign."""
    tau = torch.where(adv > 0, temperature_pos, temperature_neg).to(ratio.dtype)
    return -(torch.sigmoid(tau * (ratio - 1)) * 4 / tau) * adv


def off_policy_mask(logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor,
                    threshold: float) -> torch.Tensor:
    """(R, 1): 0 for a completion with A < 0 whose mean k1 = logp_sampler - logp over its tokens (an estimate of
    KL(sampler || policy)) exceeds `threshold`, else 1 (DeepSeek-V3.2's off-policy sequence masking)."""
    m = mask.bool()
    k1 = torch.where(m, sampler_logp - logp.detach(), 0.0)  # not a product: the sampler's padding may be -inf
    kl = k1.sum(-1) / m.sum(-1).clamp(min=1)
    return ((adv >= 0) | (kl <= threshold)).to(logp.dtype)[:, None]


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """(R, T) 0/1: the completion tokens whose entropy is at or above the (1 - quantile) quantile of the completion
    tokens' entropies (torch.quantile's linear interpolation, as TRL): the top `quantile` share of them."""
    m = mask.bool()
    values = entropy.detach()[m].float()
    if not len(values):
        return torch.zeros_like(entropy)
    threshold = torch.quantile(values, 1 - quantile)
    return ((entropy.detach() >= threshold) & m).to(entropy.dtype)


def loss_options(cfg) -> dict:
    """The config's fields of `policy_loss` that are the same for every batch: the ratio's clip and TRL's GRPO
    options (issue 33), by their `policy_loss` names."""
    return dict(epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high, max_tokens=cfg.max_new_tokens,
                importance_sampling_level=cfg.importance_sampling_level, delta=cfg.delta,
                sapo_temperature_pos=cfg.sapo_temperature_pos, sapo_temperature_neg=cfg.sapo_temperature_neg,
                off_policy_mask_threshold=cfg.off_policy_mask_threshold,
                use_bias_correction_kl=cfg.use_bias_correction_kl,
                top_entropy_quantile=cfg.top_entropy_quantile, entropy_coef=cfg.entropy_coef)


def needs_entropy(options: dict) -> bool:
    """Whether the loss needs each token's entropy (an entropy mask or bonus); else it is never computed."""
    return options["top_entropy_quantile"] < 1 or options["entropy_coef"] > 0


def policy_loss(logp: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor, loss_type: str = "sum",
                ref_logp: torch.Tensor | None = None, beta: float = 0.0, *, weights: torch.Tensor | None = None,
                old_logp: torch.Tensor | None = None, epsilon: float = 0.2, epsilon_high: float | None = None,
                max_tokens: int | None = None, importance_sampling_level: str = "token", delta: float | None = None,
                sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05,
                sampler_logp: torch.Tensor | None = None, off_policy_mask_threshold: float | None = None,
                use_bias_correction_kl: bool = False, entropy: torch.Tensor | None = None,
                top_entropy_quantile: float = 1.0, entropy_coef: float = 0.0,
                entropy_norm: float | None = None) -> tuple[torch.Tensor, dict]:
    """MAGRPO loss for one agent's rows.

    logp, mask: (R, T) completion-token log-probs and a 0/1 mask (prompt and padding are 0); adv: (R,).
    weights: (R, T) rollout-correction weights (`rollout_weights`, no gradient), or None for 1.
    old_logp: None for the on-policy loss (Eq. 2); given, the ratio's loss (loss_type's form) against these.
    max_tokens: the completion cap, which dr_grpo divides by. sampler_logp: the sampler's log-probs (the off-policy
    mask's KL); entropy: (R, T) the policy's entropy per token (the entropy mask, detached, and the bonus);
    entropy_norm: the bonus's denominator (None: these rows' kept tokens, their mean entropy).
    The module docstring has every option's equation. Returns (loss, stats) with stats holding floats for logging.
    """
    mask = mask.to(logp.dtype)
    adv = adv.to(logp.dtype)[:, None]  # (R, 1)
    reduction = REDUCTIONS.get(loss_type, loss_type)
    clipped = None
    if old_logp is None:
        per_token = -adv * logp
    else:
        ratio = torch.exp(log_importance_weights(logp, old_logp, mask, importance_sampling_level)).expand_as(logp)
        high = epsilon if epsilon_high is None else epsilon_high
        if loss_type == "cispo":
            per_token = cispo_terms(ratio, logp, adv, high)
        elif loss_type == "sapo":
            per_token = sapo_terms(ratio, adv, sapo_temperature_pos, sapo_temperature_neg)
        else:
            bounded = ratio.clamp(1 - epsilon, 1 + high)
            unclipped = ratio if delta is None else ratio.clamp(max=delta)  # INTELLECT-2's two-sided clip
            per_token = -torch.min(unclipped * adv, bounded * adv)
            clipped = ((bounded * adv < unclipped * adv) & (mask > 0)).to(logp.dtype)  # the clipped branch is taken
    stats = {}
    if off_policy_mask_threshold is not None:
        if sampler_logp is None:
            raise ValueError("off_policy_mask_threshold needs the sampler's log-probs (sampler_logp)")
        keep = off_policy_mask(logp, sampler_logp, mask, adv[:, 0], off_policy_mask_threshold)  # (R, 1)
        per_token = per_token * keep
        stats["masked_rows"] = float((1 - keep).sum())
    kept = mask  # the completion tokens the entropy mask keeps (all of them without it)
    if top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the policy's entropy per token (entropy)")
        kept = high_entropy_mask(entropy, mask, top_entropy_quantile)
        per_token = per_token * kept
    if weights is not None:
        per_token = per_token * weights.detach()
    loss = reduce(per_token, mask, reduction, max_tokens)
    stats["pg_loss"] = float(loss.detach())
    if clipped is not None:  # counts, so that micro-batches add up (the fraction is clipped / tokens)
        stats["clipped"], stats["tokens"] = float(clipped.sum()), float(mask.sum())
        stats["clip_fraction"] = stats["clipped"] / max(stats["tokens"], 1.0)
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs under the base model)")
        diff = ref_logp - logp
        k3 = (torch.exp(diff) - diff - 1) * mask  # (R, T), >= 0
        if use_bias_correction_kl:  # times the ratio to the policy that sampled, its gradient kept (TRL)
            old = logp.detach() if old_logp is None else old_logp
            k3 = k3 * torch.exp(log_importance_weights(logp, old, mask, importance_sampling_level))
        kl = reduce(k3, mask, reduction, max_tokens)
        loss = loss + beta * kl
        stats["kl"] = float(kl.detach())
    if entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the policy's entropy per token (entropy)")
    if entropy is not None:  # logged whenever computed: the mean over completion tokens (TRL's `entropy`)
        stats["entropy"] = float(reduce(entropy.detach(), mask, "token_mean"))
        if entropy_coef > 0:  # TRL's bonus: the mean entropy of the kept tokens, whatever the loss_type
            bonus = reduce(entropy, kept, "token_mean") if entropy_norm is None else \
                torch.where(kept.bool(), entropy, 0.0).sum() / max(entropy_norm, 1e-12)
            loss = loss - entropy_coef * bonus
    return loss, stats


def reduce(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_tokens: int | None = None) -> torch.Tensor:
    """(R, T) per-token terms -> the loss_type's scalar over these rows (see the module docstring)."""
    masked = torch.where(mask.bool(), per_token, 0.0)  # not a product: inf * 0 off the mask would be NaN
    if loss_type == "sum":
        return masked.sum(-1).mean()
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token.shape[0] * (max_tokens or per_token.shape[1]))
    if loss_type in ("token_mean", "dapo", "bnpo"):
        return masked.sum() / mask.sum().clamp(min=1)
    raise ValueError(f"loss_type={loss_type!r}; allowed: {LOSS_TYPES}")


def adapter_stats(adapter: str, first: dict, clipped: list, extra: dict, mismatch: dict, rho_max: float,
                  total_rows: int, *, beta: float, num_iterations: int, entropy: bool, off_policy_mask: bool) -> dict:
    """One adapter's logged update stats from the update's sums over micro-batches (and processes): the first
    iteration's loss, gradient norm and KL, the clip fraction of later iterations, the mean entropy per completion
    token, the share of completions the off-policy mask dropped, and the sampler/trainer mismatch per token."""
    stats = {f"loss/{adapter}": first["loss"],  # the first iteration's: the loss of the samples as drawn
             f"grad_norm/{adapter}": first["norm"]}
    if beta > 0:
        stats[f"kl/{adapter}"] = first["kl"]
    if num_iterations > 1:
        stats[f"clip_fraction/{adapter}"] = clipped[0] / max(clipped[1], 1.0)
    if entropy:  # the policy's mean entropy per completion token over the step (TRL's `entropy`)
        stats[f"entropy/{adapter}"] = extra["entropy"]
    if off_policy_mask:  # the share of completions the mask dropped
        stats[f"off_policy_masked/{adapter}"] = extra["masked_rows"] / max(total_rows, 1)
    if mismatch["tokens"]:
        n = mismatch["tokens"]
        stats.update({f"mismatch/kl/{adapter}": mismatch["k3"] / n,
                      f"mismatch/ratio_mean/{adapter}": mismatch["rho"] / n,
                      f"mismatch/ratio_max/{adapter}": rho_max,
                      f"mismatch/past_cap/{adapter}": mismatch["past_cap"] / n,
                      f"mismatch/rows_past_cap/{adapter}": mismatch["rows_past_cap"] / max(mismatch["rows"], 1.0)})
    return stats
