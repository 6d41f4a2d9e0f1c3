"""The coordination suite: the six Tiny Hanabi Suite games A-F, their exact optima, and an exact evaluator.

    task_args = {"game": "tiny_hanabi", "suite": "A"}       # python -m kit train --preset tiny_hanabi --set ...
    value(payoff, p0, p1)                                    # the exact expected return of a joint policy
    best = optimum(payoff)                                   # brute force over every deterministic joint policy
    exact_eval(sampler, task)                                # the team's greedy and sampling policies, every deal

Each game (Sokota et al., "Solving Common-Payoff Games with Approximate Policy Iteration", AAAI 2021; tables from
the suite's public code, `tiny_hanabi.py` of the paper's repository): each of two players is dealt one of C cards
uniformly at random and sees only its own; player 0 picks one of A moves, which player 1 sees; player 1 picks one
of A moves; both get payoff[c0, c1, a0, a1]. OpenSpiel's tiny_hanabi takes the same table as its `payoff`
parameter, flattened in that index order, and its default is game E (the Bayesian Action Decoder paper's game).

    value   V(p0, p1) = 1/C^2 sum_{c0, c1} sum_{a0} p0(a0 | c0) sum_{a1} p1(a1 | c1, a0) payoff[c0, c1, a0, a1]

The optimum is attained by a deterministic joint policy, so enumerating the A^C x A^(C A) of them is exact (at most
9 x 729, game E). The evaluator computes V for the team itself: the greedy policy from one greedy generate per
observation (C observations for player 0, C x A for player 1), and the sampling policy from the model's exact
move probabilities at the run's temperature / top-k / top-p (`move_probabilities`: every completion the sampler
could write, enumerated as a tree of prefixes, one batched forward per depth), never from samples. A completion
that names no legal move is scored as the game scores it: a uniformly random legal move (the expectation of its
fallback) and `illegal_penalty` off the return.

Not covered: games with more than two players or more than one move each (the suite has none); prefixes whose
probability is below `min_prob` are not expanded (their mass is reported as `eval/exact_unresolved`, a bound on
the sampled value's error: at most that mass times the payoff range).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

# payoff[c0, c1, a0, a1] (player 0's card, player 1's card, player 0's move, player 1's move)
SUITE = {
    "A": [[[[0, 1], [0, 0]], [[0, 1], [3, 2]]],
          [[[3, 3], [3, 2]], [[2, 0], [3, 3]]]],
    "B": [[[[1, 0], [1, 0]], [[0, 1], [0, 1]]],
          [[[0, 1], [0, 0]], [[1, 0], [1, 0]]]],
    "C": [[[[3, 0], [0, 3]], [[2, 0], [3, 3]]],
          [[[2, 2], [3, 0]], [[0, 1], [0, 2]]]],
    "D": [[[[3, 0], [1, 3]], [[3, 0], [3, 0]]],
          [[[3, 2], [0, 2]], [[0, 1], [0, 0]]]],
    "E": [[[[10, 0, 0], [4, 8, 4], [10, 0, 0]], [[0, 0, 10], [4, 8, 4], [0, 0, 10]]],
          [[[0, 0, 10], [4, 8, 4], [0, 0, 0]], [[10, 0, 0], [4, 8, 4], [10, 0, 0]]]],
    "F": [[[[0, 3], [3, 2]], [[0, 0], [0, 1]], [[3, 1], [2, 1]]],
          [[[0, 2], [0, 1]], [[1, 2], [1, 2]], [[0, 1], [0, 3]]],
          [[[1, 3], [1, 2]], [[0, 3], [2, 2]], [[3, 1], [3, 0]]]],
}
# The optima the paper reports (its OPTIMAL_RETURNS); tests/test_coordination.py checks them by brute force.
PAPER_OPTIMA = {"A": 2.25, "B": 1.0, "C": 2.5, "D": 2.5, "E": 10.0, "F": 2 + 1 / 3}


def payoff_table(name: str) -> np.ndarray:
    """(C, C, A, A) float array of suite game `name`."""
    if name not in SUITE:
        raise ValueError(f"suite={name!r} is not a Tiny Hanabi Suite game; allowed: {', '.join(SUITE)}")
    return np.array(SUITE[name], dtype=np.float64)


def openspiel_params(name: str) -> dict:
    """OpenSpiel tiny_hanabi parameters that play suite game `name`."""
    table = payoff_table(name)
    return {"num_players": 2, "num_chance": table.shape[0], "num_actions": table.shape[-1],
            "payoff": ";".join(f"{x:g}" for x in table.ravel())}


def table_of(game) -> np.ndarray:
    """The (C, C, A, A) payoff of a loaded OpenSpiel tiny_hanabi game (whatever its parameters)."""
    p = game.get_parameters()
    C, A = int(p["num_chance"]), int(p["num_actions"])
    if int(p.get("num_players", 2)) != 2:
        raise ValueError("the exact evaluator covers two-player tiny_hanabi games")
    return np.array([float(x) for x in p["payoff"].split(";")]).reshape(C, C, A, A)


def value(payoff, p0, p1) -> float:
    """Exact expected return of a (possibly stochastic) joint policy; p0: (C, A) = p0(a0 | c0),
    p1: (C, A, A) = p1(a1 | c1, a0)."""
    payoff = np.asarray(payoff, dtype=np.float64)  # (C, C, A, A)
    C = payoff.shape[0]
    # sum over c0, c1, a0, a1 of p0[c0, a0] p1[c1, a0, a1] payoff[c0, c1, a0, a1], then the mean over deals
    return float(np.einsum("ik,jkl,ijkl->", np.asarray(p0, float), np.asarray(p1, float), payoff) / C**2)


def card_blind_moves(payoff) -> tuple[int, list[int]]:
    """The best joint policy that ignores the cards: player 0's move a0, and player 1's reply to each a0 (the best
    for the cards' average, so the one it would play whatever a0 is). Game E: (1, [.., 1, ..]), worth 8."""
    mean = np.asarray(payoff, dtype=np.float64).mean(axis=(0, 1))  # (A, A): the payoff averaged over both deals
    return int(mean.max(axis=1).argmax()), [int(a1) for a1 in mean.argmax(axis=1)]


def deterministic(choices, num_actions: int) -> np.ndarray:
    """One-hot policy table from a move per information state (any shape of ints)."""
    return np.eye(num_actions)[np.asarray(choices)]


def joint_policies(payoff):
    """Every deterministic joint policy as (p0 moves (C,), p1 moves (C, A), value)."""
    payoff = np.asarray(payoff, dtype=np.float64)
    C, A = payoff.shape[0], payoff.shape[-1]
    for m0 in itertools.product(range(A), repeat=C):
        p0 = deterministic(m0, A)
        for m1 in itertools.product(range(A), repeat=C * A):
            m1 = np.array(m1).reshape(C, A)
            yield np.array(m0), m1, value(payoff, p0, deterministic(m1, A))


def optimum(payoff) -> float:
    """The best expected return of any joint policy (a deterministic one attains it)."""
    return max(v for _, _, v in joint_policies(payoff))


def pure_equilibria(payoff) -> list[float]:
    """Distinct values of the deterministic joint policies where no information state gains by another move
    (each player's move per card, and per card and seen move, is a best response to the partner's policy)."""
    payoff = np.asarray(payoff, dtype=np.float64)
    A = payoff.shape[-1]
    found = set()
    for m0, m1, v in joint_policies(payoff):
        # player 1 at (c1, a0): sum over c0 with p0(c0) = a0 of payoff[c0, c1, a0, :]
        ok = all(payoff[m0 == a0, c1, a0, :].sum(0).max() <= payoff[m0 == a0, c1, a0, m1[c1, a0]].sum() + 1e-9
                 for c1 in range(m1.shape[0]) for a0 in range(A) if (m0 == a0).any())
        # player 0 at c0: the mean over c1 of payoff[c0, c1, a, p1(c1, a)] for each move a
        gains = [[payoff[c0, np.arange(m1.shape[0]), a, m1[:, a]].sum() for a in range(A)] for c0 in range(len(m0))]
        ok = ok and all(max(g) <= g[m0[c0]] + 1e-9 for c0, g in enumerate(gains))
        if ok:
            found.add(round(v, 9))
    return sorted(found, reverse=True)


# ---- the team's policies, exactly

def observations(task, table: np.ndarray) -> tuple[list, list]:
    """The episode states of each information state: player 0 with card c0 (C of them), player 1 with card c1
    after player 0's move a0 (C x A of them, row-major). The other player's card is any; it is not observed."""
    C, A = table.shape[0], table.shape[-1]

    def dealt(c0, c1, *moves):
        ep = task.reset(0)
        ep.state = task.game.new_initial_state()
        for a in (c0, c1, *moves):
            ep.state.apply_action(a)
        return ep

    return [dealt(c, 0) for c in range(C)], [dealt(0, c, a) for c in range(C) for a in range(A)]


def _played(probs: np.ndarray, illegal: np.ndarray, unresolved: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(S, A) probabilities of the moves played and (S,) of an illegal completion, given the resolved mass: the
    illegal mass spread over the legal moves (the game's random fallback)."""
    resolved = 1.0 - unresolved
    probs, illegal = probs / resolved[:, None], illegal / resolved
    return probs + illegal[:, None] / probs.shape[1], illegal


MAX_EXACT_TAIL = 512  # continuations below min_prob finished one by one (the tiny model's ~100 always are)
MAX_ENUMERATED_VOCAB = 1024  # the sampling policy's exact value is computed for vocabularies up to this size


def enumerable(team) -> bool:
    """Can the sampling policy's move probabilities be enumerated in seconds? With the tiny model's ~100 tokens,
    yes; with a real 49k vocabulary at temperature 1, hundreds of prefixes per state and depth carry more than
    min_prob each, thousands of forwards an evaluation: only the greedy policy's value is exact there."""
    return all(len(tok) <= MAX_ENUMERATED_VOCAB for tok in team.tokenizers)


@torch.no_grad()
def move_probabilities(team, params, task, episodes: list, player: int, min_prob: float = 1e-3):
    """(probs (S, A), illegal (S,), unresolved (S,)) of `player` at each episode state: the exact probability
    that the sampler's completion names each legal move (task.parse), or none. Every completion is enumerated as
    a tree of prefixes (one batched forward per depth) up to `params.max_new_tokens` or an end-of-sequence token,
    at the sampling temperature, top-k and top-p; prefixes below `min_prob` are left unexpanded (`unresolved`). With
    more than MAX_EXACT_TAIL continuations below `min_prob` (a real model's 49k vocabulary at temperature 1), their
    mass goes to `unresolved` in one sum instead of being decoded one by one (eval/exact_unresolved reports it)."""
    from kit.engine.sampling import warp
    from kit.engine.rollout import encode_prompt, eos_ids, left_pad
    from kit.engine.forward import position_ids

    model, tok = team.model_of(player), team.tokenizer_of(player)
    model.set_adapter(team.adapter_of[player])
    device, eos = next(model.parameters()).device, eos_ids(team.model_of(player), tok)
    A = len(task.legal(episodes[0]))
    probs, illegal, unresolved = np.zeros((len(episodes), A)), np.zeros(len(episodes)), np.zeros(len(episodes))
    prompts = [encode_prompt(tok, task.prompt(ep, player), params.use_chat_template, params.max_prompt_tokens)
               for ep in episodes]
    live = [(s, [], 1.0) for s in range(len(episodes))]  # (state, completion ids so far, probability)

    longest = max(len(t) for t in tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=True))

    def settled(s, ids, chars_left):
        return callable(getattr(task, "settled", None)) and \
            task.settled(episodes[s], tok.decode(ids, skip_special_tokens=True), chars_left)

    def finish(s, ids, p):
        move = task.parse(episodes[s], tok.decode(ids, skip_special_tokens=True))
        if move is None:
            illegal[s] += p
        else:
            probs[s, task.legal(episodes[s]).index(move)] += p

    for depth in range(params.max_new_tokens):
        if not live:
            break
        enc = left_pad([prompts[s] + ids for s, ids, _ in live], tok.pad_token_id, device)
        logits = model(**enc, position_ids=position_ids(enc["attention_mask"]), use_cache=False, logits_to_keep=1).logits[:, -1]
        scores = warp(logits, params.temperature, params.top_p, params.top_k)[0]  # (R, V), as SeededSampling warps
        step = scores.double().softmax(-1).cpu().numpy()  # (R, V), in float64: the tree sums to 1 to ~1e-15
        is_eos = np.zeros(step.shape[1], dtype=bool)
        is_eos[[e for e in eos if e < step.shape[1]]] = True
        last = depth + 1 == params.max_new_tokens
        chars_left = (params.max_new_tokens - depth - 1) * longest
        nxt = []
        for (s, ids, p), row in zip(live, step):
            q = p * row  # (V,) the probability of each one-token continuation
            if q[is_eos].sum() > 0:
                finish(s, ids, q[is_eos].sum())  # the completion ends here
            tail = ~is_eos & (q > 0) & (q < min_prob)
            if tail.sum() > MAX_EXACT_TAIL:  # a real vocabulary: decoding 49k tails per prefix would take minutes
                unresolved[s] += q[tail].sum()
                q = np.where(tail, 0.0, q)
            for t in np.flatnonzero(~is_eos & (q > 0)):
                child = ids + [int(t)]
                if last or settled(s, child, chars_left):
                    finish(s, child, q[t])  # cut at max_new_tokens, or nothing after it can change the move
                elif q[t] >= min_prob:
                    nxt.append((s, child, q[t]))
                else:
                    unresolved[s] += q[t]
        live = nxt
    return probs, illegal, unresolved


def exact_eval(sampler, task, sampled: bool = True, min_prob: float = 1e-3) -> dict:
    """The team's exact expected return on a tiny_hanabi game over every deal, greedy (and with `sampled`, the
    sampling policy's), with the game's optimum beside them (under `eval/exact_`)."""
    table = table_of(task.game)
    C, A = table.shape[0], table.shape[-1]
    first, second = observations(task, table)
    policies = {"greedy": []}
    for moves in greedy_moves(sampler, task, (first, second)):
        policies["greedy"].append((np.array([np.eye(A)[m] if m is not None else np.full(A, 1 / A) for m in moves]),
                                   np.array([m is None for m in moves], dtype=float)))
    out = {"eval/exact_optimum": float(optimum(table))}
    if sampled:
        probs = [move_probabilities(sampler.team, sampler.params, task, eps, player, min_prob)
                 for player, eps in ((0, first), (1, second))]
        policies["sampled"] = [_played(*p) for p in probs]
        out["eval/exact_unresolved"] = float(max(p[2].max() for p in probs))
    for name, ((p0, bad0), (p1, bad1)) in policies.items():
        # each player-0 state is met with probability 1/C, each player-1 state (c1, a0) with P(a0) / C
        p1 = p1.reshape(C, A, A)
        reach = p0.sum(0) / C  # (A,) the probability of each first move, over player 0's cards
        penalty = bad0.mean() + (bad1.reshape(C, A) * reach[None, :]).sum() / C
        out[f"eval/exact_{name}"] = float(value(table, p0, p1) - task.illegal_penalty * penalty)
    return out


def greedy_moves(sampler, task, states=None) -> tuple[list, list]:
    """The greedy team's move (an index into the legal moves, None: names none) at each information state: player
    0's per card (C), player 1's per card and seen move (C x A, row-major)."""
    first, second = states or observations(task, table_of(task.game))
    out = []
    for player, eps in ((0, first), (1, second)):
        ro = sampler.sample([(player, task.prompt(ep, player)) for ep in eps], 1, sampler.greedy)
        moves = [task.parse(ep, ro.texts[k][0]) for k, ep in enumerate(eps)]
        out.append([None if m is None else task.legal(ep).index(m) for m, ep in zip(moves, eps)])
    return out[0], out[1]


def is_suite_game(task) -> bool:
    """Whether `task` is a two-player tiny_hanabi game (any payoff), which exact_eval covers."""
    return getattr(task, "name", None) == "tiny_hanabi" and getattr(task, "num_agents", 0) == 2
