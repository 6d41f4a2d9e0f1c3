"""Per-row seeded sampling: each sample's randomness is a function of its own seed, never of the batch.

    seed = row_seed(run_seed, (step, item, turn, agent), g)     # one int64 per sample
    config, processors = seeded_config(generation_config, seeds) # greedy decoding + SeededSampling

`SeededSampling` applies the config's temperature, top-k and top-p, then adds Gumbel noise computed by a
counter-based hash of (row seed, decoding step, token id); the argmax of warped logits plus Gumbel noise is an
exact sample from the warped distribution (the Gumbel-max trick, up to u's resolution of 2^-32):

    token = argmax_v (warped_v - log(-log u_v)),    u_v = hash(row seed, step, v) in (0, 1)

So a request samples the same completion whether it is generated alone, in a bigger batch, in another order or on
another process, and the engines (PEFT's generate, the compiled one) need no random state of their own.

The sampler's own log-probs: `SeededSampling` also keeps, for every sampled token, its log-prob under the warped
distribution it was drawn from (log_softmax of the warped logits, so renormalised over what top-k/top-p kept):

    sampler_logp_t = log_softmax(warped logits at step t)[token generate appended at t]

It reads the token from the next step's input_ids (and the last one from the finished completion), so the value is
the one of the token actually emitted, whatever other processors ran after it. These are what the update's
rollout correction compares with the trainer (kit/maths/losses.py).

Cost per decoding step (`warp`): top-p does not sort the vocabulary of every row. A row's nucleus is looked for among
its 64 largest scores (one `topk`: the nucleus of a model at temperature 0.7 is mostly a few tokens); only a row
whose nucleus reaches past them (a flat distribution) is sorted, on its own. The noise is hashed only at the tokens
top-k/top-p keep, since every other score is -inf whatever its noise. A sort of (R, 151,936) scores and a hash of
every token per step were most of a held-out evaluation's sampling time on a CPU (bench/README.md); the samples are
the same, token for token, as with the whole vocabulary sorted and hashed (tests/test_sampling.py).
"""

from __future__ import annotations

import copy
import hashlib

import torch

_GOLDEN, _MIX1, _MIX2 = (c - 2**64 for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _mix(x: torch.Tensor, finish: bool = True) -> torch.Tensor:
    """SplitMix64's finalizer on int64 tensors (multiplication wraps; shifts made logical by masking).

    finish=False skips the last xor-shift, which changes only bits 0..32: three (R, V) kernels fewer for
    `gumbel_from_bits`, which reads bits 33..63.
    """
    def lsr(v, k):
        return (v >> k).bitwise_and_((1 << (64 - k)) - 1)

    x = (x ^ lsr(x, 30)).mul_(_MIX1)  # a new tensor, then in place: (R, V) temporaries are large
    x = (x ^ lsr(x, 27)).mul_(_MIX2)
    return x ^ lsr(x, 31) if finish else x


def seeded_gumbel(row_seeds: torch.Tensor, step: int, vocab: int | torch.Tensor) -> torch.Tensor:
    """(R,) int64 seeds -> (R, V) Gumbel noise, a pure function of (row seed, step, token id); with `vocab` an
    (R, K) tensor of token ids, the noise of those tokens only, (R, K): the same values as their columns of the
    whole vocabulary's."""
    base = _mix(row_seeds + torch.full_like(row_seeds, step + 1) * _GOLDEN)  # (R,); int64 products wrap
    if isinstance(vocab, torch.Tensor):
        tokens = vocab.to(torch.int64) * _MIX1  # (R, K)
    else:
        tokens = torch.arange(vocab, device=row_seeds.device, dtype=torch.int64) * _MIX1  # (V,)
    return gumbel_from_bits(_mix(base[:, None] + tokens, finish=False))  # (R, V) or (R, K)


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """int64 hash outputs -> Gumbel noise -log(-log u), u uniform on (0, 1); finite for every input.

    u is the 32-bit fraction 0.b63...b32 with its last bit set: 2^31 odd multiples of 2^-32, symmetric about
    1/2. Read as a signed number (b63 the sign) that fraction is s = u for u < 1/2 and s = u - 1 for u > 1/2, so
    log u = log(s) or log1p(s), and u itself is never formed: in fp32 it rounds to exactly 1 near the top, the
    noise is +inf, and at a token that top-k/top-p set to -inf, -inf + inf = NaN, which argmax picks. Here
    |s| lies in [2^-32, 1/2] (the float conversion keeps 24 significant bits at either end), so log u lies in
    [-22.2, -2.3e-10] and the noise in [-3.1, 22.2]: a masked token stays at -inf and is never sampled, and
    the top end, where sampled low-probability tokens draw their noise, resolves 2^-32 rather than 2^-24.
    """
    s = (bits >> 32).bitwise_or_(1).float().mul_(2.0**-32)  # odd, so never 0; the | 1 overwrites bit 32
    log_u = torch.where(s > 0, s.log(), s.log1p())
    return log_u.neg_().log_().neg_()


NUCLEUS_WIDTH = 64  # the candidates top-p looks at first; a row whose nucleus reaches past them is sorted whole


def top_k_filter(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Scores below the k-th largest of their row set to -inf (ties with it kept), as transformers' TopKLogitsWarper."""
    if top_k <= 0 or top_k >= scores.shape[-1]:
        return scores
    kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (R, 1)
    return scores.masked_fill(scores < kth, float("-inf"))


def _in_nucleus(vals: torch.Tensor, lse: torch.Tensor, top_p: float) -> torch.Tensor:
    """(R, K) scores in descending order and their rows' logsumexp (R, 1) -> (R, K) kept: the mass of the tokens
    scored strictly above a token is below top_p (a run of equal scores shares its first token's mass above)."""
    p = (vals.double() - lse).exp()  # float64: with top_p near 1 the cut is in a tail of ~1e-4, past fp32's rounding
    before = p.cumsum(-1) - p  # mass of the tokens ranked above, ties included
    start = torch.ones_like(vals, dtype=torch.bool)
    start[:, 1:] = vals[:, 1:] != vals[:, :-1]  # the first token of each run of equal scores
    above = torch.where(start, before, float("-inf")).cummax(-1).values  # mass strictly above each token
    return (above < top_p) & vals.isfinite()


def nucleus(scores: torch.Tensor, top_p: float):
    """Top-p without sorting the vocabulary: (R, V) float scores -> (ids (R, K), their scores (R, K), kept (R, K),
    wide): each row's K largest scores and which of them top-p keeps, and `wide`, None or the kept tokens of the rows
    whose nucleus reaches past their K candidates, as flat (rows (N,), tokens (N,), scores (N,)) (those rows' kept is
    all False).

    A token is kept when the probability of the tokens scored strictly above it is below top_p: the smallest set of
    the largest scores whose mass reaches top_p, ties with its last token kept (order-free, where a sort keeps an
    arbitrary one of them). p = softmax over the whole row (-inf: 0). Each row's nucleus is looked for among its
    NUCLEUS_WIDTH largest scores (one topk); only a row whose nucleus reaches past them (a flat distribution) is sorted
    whole, on its own: one uncertain row of a held-out evaluation's hundreds never widens the search of the others."""
    R, V = scores.shape
    lse = scores.double().logsumexp(-1, keepdim=True)  # (R, 1), float64 (see _in_nucleus)
    vals, ids = scores.topk(min(NUCLEUS_WIDTH, V), dim=-1)  # (R, K) descending
    kept = _in_nucleus(vals, lse, top_p)
    if ids.shape[1] == V or not kept[:, -1].any():  # every nucleus ends inside its candidates (the usual case)
        return ids, vals, kept, None
    wide = kept[:, -1]
    r = wide.nonzero()[:, 0]
    wvals, wids = scores[r].sort(dim=-1, descending=True)  # those rows only, whole
    wkept = _in_nucleus(wvals, lse[r], top_p)
    extra = (r[:, None].expand_as(wids)[wkept], wids[wkept], wvals[wkept])
    return ids, vals, kept & ~wide[:, None], extra


def warp(scores: torch.Tensor, temperature: float, top_p: float, top_k: int):
    """(R, V) logits -> (warped (R, V) float32: scores / temperature, -inf off what top-k then top-p keep;
    candidates: None when every finite score is kept, else (ids (R, K), kept (R, K), wide) holding every kept token,
    `wide` as nucleus gives it). The one warping of the kit: SeededSampling's, and the exact enumeration's
    (kit/tasks/coordination.py)."""
    scores = scores.float()
    if temperature != 1.0:
        scores = scores / temperature
    scores = top_k_filter(scores, top_k)
    if top_p < 1.0:
        ids, vals, kept, wide = nucleus(scores, top_p)
        warped = torch.full_like(scores, float("-inf")).scatter_(1, ids, vals.masked_fill(~kept, float("-inf")))
        if wide is not None:
            rows, tokens, wvals = wide
            warped[rows, tokens] = wvals
        return warped, (ids, kept, wide)
    if 0 < top_k < scores.shape[-1]:
        k = int(scores.isfinite().sum(-1).max())  # top-k's ties may keep more than k
        vals, ids = scores.topk(k, dim=-1)
        return scores, (ids, vals.isfinite(), None)
    return scores, None


class SeededSampling:
    """A logits processor that samples (temperature, top-k, top-p) with per-row noise: argmax(warped logits +
    Gumbel noise) is a sample from the warped distribution (the Gumbel-max trick), and the noise depends only on
    the row's seed, the decoding step and the token, never on the other rows of the batch or on a global RNG.
    Used with greedy decoding (`do_sample=False`), so the argmax is the sample."""

    def __init__(self, row_seeds: torch.Tensor, temperature: float, top_p: float, top_k: int):
        self.row_seeds, self.settings = row_seeds, (temperature, top_p, top_k)
        self.start: int | None = None  # the prompt width, seen at the first step
        self.picked: list[torch.Tensor] = []  # (R,) per finished step: the sampled token's log-prob
        self.last: torch.Tensor | None = None  # (R, V) the latest step's log-probs, until its token is known

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.start is None:  # the first step: a sampler serves one generate call, on one device
            self.start = input_ids.shape[1]
            self.row_seeds = self.row_seeds.to(scores.device)  # once, not a blocking copy at every step
        elif self.last is not None:  # the previous step's token is the last column now
            self.picked.append(self.last.gather(-1, input_ids[:, -1:])[:, 0])
        warped, candidates = warp(scores, *self.settings)
        self.last = warped.log_softmax(-1)
        step = input_ids.shape[1] - self.start
        if candidates is None:  # every token kept: every token's noise
            return warped + seeded_gumbel(self.row_seeds, step, warped.shape[-1])
        ids, kept, wide = candidates  # the rest is -inf whatever its noise: hash only these
        noisy = warped.gather(1, ids) + seeded_gumbel(self.row_seeds, step, ids)
        out = torch.full_like(warped, float("-inf")).scatter_(1, ids, noisy.masked_fill(~kept, float("-inf")))
        if wide is not None:  # the rows sorted whole: their kept tokens, flat
            rows, tokens, _ = wide
            out[rows, tokens] = warped[rows, tokens] + seeded_gumbel(self.row_seeds[rows], step, tokens[:, None])[:, 0]
        return out

    def logprobs(self, completion: torch.Tensor) -> torch.Tensor:
        """(R, T) completion ids of this call -> (R, T) float32 sampler log-probs of those tokens (after a
        row's EOS: the log-prob of the padding, meaningless and masked by the caller)."""
        steps = self.picked + ([] if self.last is None else [self.last.gather(-1, completion[:, -1:])[:, 0]])
        if len(steps) != completion.shape[1]:
            raise RuntimeError(f"SeededSampling saw {len(steps)} decoding steps for {completion.shape[1]} tokens: "
                               "one sampler serves exactly one generate call")
        return torch.stack(steps, -1) if steps else completion.new_zeros(completion.shape, dtype=torch.float32)


def seeded_config(generation_config, row_seeds: torch.Tensor | None):
    """(config, logits processors) for one engine call: per-row seeded sampling when seeds are given and the
    config samples; otherwise the config as it is (greedy, or sampling from the global RNG).
    `kit.engine.rollout.generate` always gives seeds when it samples, so every engine gets the sampler log-probs."""
    from transformers import LogitsProcessorList

    if row_seeds is None or not generation_config.do_sample:
        return generation_config, LogitsProcessorList()
    sampler = SeededSampling(row_seeds, generation_config.temperature, generation_config.top_p,
                             generation_config.top_k or 0)
    greedy = copy.deepcopy(generation_config)
    greedy.do_sample, greedy.temperature, greedy.top_p, greedy.top_k = False, 1.0, 1.0, 50
    return greedy, LogitsProcessorList([sampler])


def row_seed(seed: int, key: tuple, sample: int) -> int:
    """The int64 sampling seed of sample `sample` of a request with key `key` (any tuple of ints and strings)."""
    digest = hashlib.blake2b(repr((seed, *key, sample)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def sampled_logprobs(generation_config, processors, completion: torch.Tensor) -> torch.Tensor:
    """The sampler log-probs of a call's completion (R, T): SeededSampling's record; 0 (log 1) for greedy
    decoding; NaN when the config sampled from the global RNG without seeds (unknown: kit never does that)."""
    for proc in processors:
        if isinstance(proc, SeededSampling):
            return proc.logprobs(completion)
    fill = float("nan") if generation_config.do_sample else 0.0
    return torch.full(completion.shape, fill, dtype=torch.float32, device=completion.device)
