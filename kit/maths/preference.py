"""Preference maths for MADPO and MARLHF: pair selection, the multi-agent DPO loss, the Bradley-Terry loss.

Pure functions, no model and no state; the trainers that use them are in kit/trainers/preference_trainer.py. Names follow
CoMLRL's preference trainers (`preference_num_candidates`, `pair_selection`, `preference_pairs_per_sample`,
`dpo_beta`); README "Learning from preferences" maps them.

    pairs           per prompt, K joint answers with joint rewards r_1..r_K; a pair (w, l) has r_w > r_l (ties are
                    never pairs). pair_selection:
                      reward_gap  the largest gaps r_w - r_l first (the first is best vs worst); equal gaps in
                                  (w, l) order
                      all         every pair, in (w, l) order
                      random      every pair in a seeded random order
                    then the first `preference_pairs_per_sample` of them (None: all)
    sequence        log p_i(y) = sum over EVERY completion token t of log pi_i(y_t | x_i, y_<t), EOS included.
                    CoMLRL's `_sequence_log_prob` leaves out each completion's last token (it feeds the
                    completion minus its last token and reads one logit fewer); here every sampled token counts
    MADPO           Delta_i = (log p_i(w_i) - log p_i(l_i)) - (log p_ref(w_i) - log p_ref(l_i))
                    (dpo_reference=base: the reference is the base with the adapter off, as DPO defines it;
                    none: no reference term, CoMLRL's MADPO)
                    L = mean over pairs of -log sigmoid(dpo_beta * sum_i Delta_i)
                    agent i's loss: L with every Delta_j, j != i, detached, so agent i moves only through its
                    own Delta_i:  dL_i/dDelta_i = -dpo_beta * sigmoid(-dpo_beta * sum_j Delta_j) / P
    metrics         dpo/accuracy: the share of pairs with sum_i Delta_i > 0; dpo/margin: mean dpo_beta * sum_i
                    Delta_i (TRL's rewards/margins); dpo/reward_gap: mean r_w - r_l of the pairs
    Bradley-Terry   L = mean over pairs of -log sigmoid(s(w) - s(l)), s the reward model's scalar score;
                    accuracy: the share with s(w) > s(l)

Not covered: IPO/KTO losses, label smoothing (conservative DPO), pairs across prompts.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

PAIR_SELECTIONS = ("reward_gap", "all", "random")
DPO_REFERENCES = ("base", "none")


def select_pairs(rewards, mode: str = "reward_gap", num_pairs: int | None = None,
                 rng: np.random.Generator | None = None) -> list[tuple[int, int]]:
    """(winner, loser) indices into `rewards` (one prompt's K joint answers); ties are never pairs.
    `rng` orders mode "random" (seed it from the run's seed, step and item: a resumed run picks the same)."""
    r = [float(x) for x in rewards]
    pairs = [(w, l) for w in range(len(r)) for l in range(len(r)) if r[w] > r[l]]  # (w, l) order
    if mode == "reward_gap":
        pairs.sort(key=lambda p: r[p[1]] - r[p[0]])  # stable: equal gaps keep (w, l) order
    elif mode == "random":
        if rng is None:
            raise ValueError("pair_selection=random needs a seeded rng")
        pairs = [pairs[k] for k in rng.permutation(len(pairs))]
    elif mode != "all":
        raise ValueError(f"pair_selection={mode!r}; allowed: {PAIR_SELECTIONS}")
    return pairs if num_pairs is None else pairs[:num_pairs]


def sequence_logprobs(token_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(R, T) per-token log-probs and 0/1 completion mask -> (R,) log-prob of each whole completion (every
    token on the mask, the EOS included)."""
    return torch.where(mask.bool(), token_logp, 0.0).sum(-1)


def dpo_delta(logp_w: torch.Tensor, logp_l: torch.Tensor, ref_w: torch.Tensor | None = None,
              ref_l: torch.Tensor | None = None) -> torch.Tensor:
    """Delta = (log p(w) - log p(l)) - (ref(w) - ref(l)); without ref terms (dpo_reference=none) the first part."""
    delta = logp_w - logp_l
    if ref_w is not None:
        delta = delta - (ref_w.detach() - ref_l.detach())
    return delta


def agent_dpo_loss(own_delta: torch.Tensor, others_delta: torch.Tensor, beta: float) -> torch.Tensor:
    """One agent's (or one adapter's) MADPO loss over P pairs: mean -log sigmoid(beta * (own + others)), the
    others' Deltas detached. own_delta, others_delta: (P,)."""
    return -F.logsigmoid(beta * (own_delta + others_delta.detach())).mean()


def dpo_losses(deltas: torch.Tensor, beta: float) -> list[torch.Tensor]:
    """(N, P) Deltas of N agents on P pairs -> N losses, the i-th with only Delta_i live (agent_dpo_loss)."""
    total = deltas.detach().sum(0)
    return [agent_dpo_loss(deltas[i], total - deltas[i].detach(), beta) for i in range(deltas.shape[0])]


def dpo_stats(joint_delta, beta: float, reward_w, reward_l) -> dict:
    """Metrics of P pairs from their joint Deltas (sum over agents) and joint rewards (the key names are the
    trainer's: dpo/loss, dpo/accuracy, dpo/margin, dpo/reward_gap)."""
    z = torch.as_tensor(joint_delta, dtype=torch.float64)
    gap = np.asarray(reward_w, dtype=np.float64) - np.asarray(reward_l, dtype=np.float64)
    return {"dpo/loss": float(-F.logsigmoid(beta * z).mean()), "dpo/accuracy": float((z > 0).double().mean()),
            "dpo/margin": float((beta * z).mean()), "dpo/reward_gap": float(gap.mean())}


def bradley_terry_loss(score_w: torch.Tensor, score_l: torch.Tensor) -> torch.Tensor:
    """Mean -log sigmoid(s(w) - s(l)) over pairs; (P,), (P,) -> scalar."""
    return -F.logsigmoid(score_w - score_l).mean()


def pair_accuracy(score_w, score_l) -> float:
    """The share of pairs whose winner scores strictly higher (a tie counts as wrong)."""
    w, l = np.asarray(score_w, dtype=np.float64), np.asarray(score_l, dtype=np.float64)
    return float((w > l).mean()) if len(w) else float("nan")
