"""Turn-based games: the environment contract, and OpenSpiel games through it (cooperative Hanabi, tiny_hanabi).

    task = make_task(2, game="tiny_hanabi")        # or python -m kit train --set task=game --set 'task_args={game: hanabi}'
    task = make_task(2, game="tiny_hanabi", suite="A")   # a Tiny Hanabi Suite game A-F (kit/tasks/coordination.py; E = default)
    ep = task.reset(seed)                          # chance outcomes (the deal, later draws) from the seed
    while not task.terminal(ep):
        p = task.player(ep)                        # whose turn
        text = llm(task.prompt(ep, p))             # rules, the player's observation, the legal moves numbered
        task.step(ep, text)                        # parse -> a legal move, or the illegal-move fallback
    task.score(ep)                                 # the team's score, minus the illegal-move penalty

A game task differs from a one-shot Task (kit/tasks/__init__.py): players act in turn, an episode has tens of
decisions, and every decision must be a legal move. Anything with the members of `Game` below plugs into the
trainer's episode rollouts (kit/tasks/games.py); `OpenSpielGame` wraps any OpenSpiel game whose states give a text
observation per player.

Illegal output is data, not a crash: a completion that names no legal move (by its number, or by the move's
own text) costs `illegal_penalty` on the episode's return, is counted, and is replaced by a random legal move
(`illegal="random"`) or ends the episode (`illegal="end"`). The replacement is drawn from its own stream, seeded
by (deal seed, decision), never from the deal's chance RNG: the G episodes of a deal then share every chance
outcome (the cards drawn) as long as they make the same moves, and episodes that fail the same way in the same
state get the same replacement, so the group baseline compares what the players chose, not the fallback's luck.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

RULES = {
    "hanabi": (
        "Cooperative Hanabi. The team builds one firework per colour, ranks 1 to 5 in order. You see your partners' "
        "cards but not your own (XX); hints tell what you know about yours. On your turn: play a card (it must be "
        "the next rank of its colour, or the team loses a life token), discard a card (regains an info token), or "
        "spend an info token to reveal to a partner all their cards of one colour or rank. The score is the "
        "number of cards played; it is 0 if all life tokens are lost."),
    "tiny_hanabi": (
        "A two-move cooperative card game. Each player holds a card ({cards}) seen only by them; player 0 moves "
        "first ({moves}), then player 1, who sees player 0's move. Both players get the same payoff, which "
        "depends on both cards and both moves."),
}


def _either(names: list[str]) -> str:
    """'d0 or d1', 'a0, a1 or a2'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


class Game(Protocol):
    """The environment contract. `load` gives deals ({"id", "seed"}); an episode object holds one game."""

    name: str
    num_agents: int

    def load(self, split: str = "train") -> list[dict]: ...
    def reset(self, seed: int) -> Any: ...  # a new episode whose chance outcomes follow the seed
    def player(self, episode) -> int: ...  # whose turn it is
    def prompt(self, episode, player: int) -> str: ...
    def legal(self, episode) -> list[int]: ...
    def parse(self, episode, text: str) -> int | None: ...  # a legal move, or None
    def step(self, episode, text: str) -> dict: ...  # parse, fall back if illegal, apply; the decision's record
    def terminal(self, episode) -> bool: ...
    def score(self, episode) -> float: ...  # the return: team score minus the illegal-move penalty


@dataclass
class Episode:
    """One game in progress: the OpenSpiel state, the chance RNG of its deal, and its decisions so far."""

    seed: int
    state: Any
    rng: np.random.Generator  # chance outcomes only: the same for every episode of the deal
    decisions: list[dict] = field(default_factory=list)
    illegal: int = 0
    ended: bool = False  # ended early: illegal="end", or max_decisions reached

    @property
    def length(self) -> int:
        return len(self.decisions)


class OpenSpielGame:
    """An OpenSpiel game as a game task. `prompt_style="full"` (rules, observation, numbered legal moves) is for
    real models; "compact" (`a<player> go <observation>`, the moves numbered 1.. implied) fits the built-in tiny
    model."""

    roles: list[str]

    def __init__(self, num_agents: int = 2, game: str = "tiny_hanabi", params: dict | None = None,
                 max_decisions: int = 0, illegal: str = "random", illegal_penalty: float = 1.0,
                 prompt_style: str = "full", num_train: int = 10_000, num_eval: int = 100,
                 suite: str | None = None):
        try:
            import pyspiel
        except ImportError as err:
            raise ImportError("game tasks need OpenSpiel: pip install open_spiel") from err
        if illegal not in ("random", "end"):
            raise ValueError(f"illegal={illegal!r}: use 'random' (a random legal move) or 'end' (end the episode)")
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"prompt_style={prompt_style!r}: use 'full' or 'compact'")
        params = dict(params or {})
        if suite is not None:  # a Tiny Hanabi Suite game (kit/tasks/coordination.py): tiny_hanabi with its payoff table
            from kit.tasks.coordination import openspiel_params

            if game != "tiny_hanabi" or params:
                raise ValueError(f"suite={suite!r} picks a tiny_hanabi payoff table: use it with game=tiny_hanabi and "
                                 f"no params (got game={game!r}, params={params})")
            params = openspiel_params(suite)
        if game == "hanabi":
            params.setdefault("players", num_agents)
        try:
            self.game = pyspiel.load_game(game, params)
        except pyspiel.SpielError as err:
            raise ValueError(f"OpenSpiel cannot load game {game!r} with {params}: {err}") from err
        kind = self.game.get_type()
        if not kind.provides_observation_string:
            raise ValueError(f"game {game!r} gives no text observation per player; it cannot be prompted")
        if self.game.num_players() != num_agents:
            raise ValueError(f"game {game!r} has {self.game.num_players()} players but num_agents={num_agents}")
        self.name, self.num_agents = game, num_agents
        self.roles = [f"player_{i}" for i in range(num_agents)]
        self.max_decisions = max_decisions or self.game.max_game_length()
        self.illegal, self.illegal_penalty, self.prompt_style = illegal, float(illegal_penalty), prompt_style
        self.num_train, self.num_eval = num_train, num_eval

    # ---- deals
    def load(self, split: str = "train") -> list[dict]:
        """Deals by seed; the held-out ones never overlap the training ones."""
        if split == "train":
            return [{"id": f"deal_{s}", "seed": s} for s in range(self.num_train)]
        return [{"id": f"eval_{s}", "seed": 1_000_000 + s} for s in range(self.num_eval)]

    def prompts(self, item: dict) -> list[str]:
        """The opening prompt of each player (the Task contract's view; episodes use `prompt`)."""
        ep = self.reset(item["seed"])
        return [self.prompt(ep, p) for p in range(self.num_agents)]

    # ---- an episode
    def reset(self, seed: int) -> Episode:
        ep = Episode(seed, self.game.new_initial_state(), np.random.default_rng([seed, 0x5EED]))
        self._chance(ep)
        return ep

    def _chance(self, ep: Episode) -> None:
        while ep.state.is_chance_node():
            actions, probs = zip(*ep.state.chance_outcomes())
            ep.state.apply_action(int(ep.rng.choice(actions, p=np.array(probs) / sum(probs))))

    def player(self, ep: Episode) -> int:
        return int(ep.state.current_player())

    def legal(self, ep: Episode) -> list[int]:
        return list(ep.state.legal_actions())

    def moves(self, ep: Episode) -> list[str]:
        return [ep.state.action_to_string(a) for a in self.legal(ep)]

    def prompt(self, ep: Episode, player: int) -> str:
        obs = ep.state.observation_string(player)
        moves = self.moves(ep)
        if self.prompt_style == "compact":  # the tiny model's prompt shape ("a0 go d1"): who acts, what they see
            return f"a{player} go " + " ".join(re.sub(r"\bp\d+:", "", obs).split())
        rules = RULES.get(self.name, self.game.get_type().long_name)
        if self.name == "tiny_hanabi":  # its cards and moves as this game's parameters set them (suite A-F differ)
            params = self.game.get_parameters()
            rules = rules.format(cards=_either([f"d{c}" for c in range(int(params["num_chance"]))]),
                                 moves=_either([f"a{a}" for a in range(int(params["num_actions"]))]))
        listed = "\n".join(f"{i}. {m}" for i, m in enumerate(moves, 1))
        return (f"{rules}\n\nYou are player {player}. What you see:\n{obs}\n\nLegal moves:\n{listed}\n\n"
                "Answer with the number of one legal move, and nothing else.")

    def parse(self, ep: Episode, text: str) -> int | None:
        """The move a completion names: a legal move's own text (the longest one found), else the first number as
        a position in the numbered list (1 = the first move)."""
        legal, moves = self.legal(ep), self.moves(ep)
        named = [(len(move), action) for action, move in zip(legal, moves) if move and move in text]
        if named:
            return max(named)[1]
        number = re.search(r"\d+", text)
        if number and 1 <= int(number.group()) <= len(legal):
            return legal[int(number.group()) - 1]
        return None

    def settled(self, ep: Episode, text: str, chars_left: int) -> bool:
        """Whether every continuation of `text` by at most `chars_left` characters parses as `text` does: no move
        name can still appear, and a name is already there or the first number has ended (kit/tasks/coordination.py
        enumerates completions and stops at a settled prefix)."""
        moves = self.moves(ep)
        could_appear = any(text.endswith(m[:k]) and len(m) - k <= chars_left
                           for m in moves if m and m not in text for k in range(len(m)))
        number = re.search(r"\d+", text)
        return not could_appear and (any(m and m in text for m in moves) or
                                     (number is not None and number.end() < len(text)))

    def step(self, ep: Episode, text: str) -> dict:
        """Play one decision from a completion; returns its record (player, move, legal)."""
        player = self.player(ep)
        action = self.parse(ep, text)
        record = {"player": player, "completion": text, "legal": action is not None}
        if action is None:
            ep.illegal += 1
            if self.illegal == "end":
                ep.ended = True
                record["move"] = None
                ep.decisions.append(record)
                return record
            fallback = np.random.default_rng([ep.seed, ep.length, 0xFA11])  # (deal, decision), not the chance RNG
            action = int(fallback.choice(self.legal(ep)))
        record["move"] = ep.state.action_to_string(action)
        ep.state.apply_action(action)
        self._chance(ep)
        ep.decisions.append(record)
        if ep.length >= self.max_decisions and not ep.state.is_terminal():
            ep.ended = True
        return record

    def rule_move(self, ep: Episode) -> str | None:
        """The move of a simple hand-written player for the player to act (the `rule` baseline); None when this
        game has none. tiny_hanabi: the best convention that ignores the cards (player 0's move fixed, player 1's
        a function of it; game E: the middle move twice, 8 of 10). hanabi: `hanabi_rule`."""
        if self.name == "tiny_hanabi":
            from kit.tasks.coordination import card_blind_moves, table_of

            first, reply = card_blind_moves(table_of(self.game))
            seen = [a for a in ep.state.history()[2:]]  # after the two deals: the moves made so far
            return self.moves(ep)[self.legal(ep).index(first if not seen else reply[seen[0]])]
        if self.name == "hanabi":
            return hanabi_rule(ep.state.observation_string(self.player(ep)), self.moves(ep))
        return None

    def terminal(self, ep: Episode) -> bool:
        return ep.ended or ep.state.is_terminal()

    def game_score(self, ep: Episode) -> float:
        """The team's score so far (cooperative games: every player's return is the same)."""
        return float(np.mean(ep.state.returns()))

    def score(self, ep: Episode) -> float:
        return self.game_score(ep) - self.illegal_penalty * ep.illegal


def is_game(task) -> bool:
    """Whether `task` is played in episodes (the `Game` contract) rather than scored as one joint action."""
    return all(callable(getattr(task, name, None)) for name in ("reset", "step", "terminal"))


def hanabi_rule(observation: str, moves: list[str]) -> str:
    """A simple Hanabi player reading OpenSpiel's observation text, in order of preference: play a card the hints
    prove playable; hint a partner's playable card (its rank, else its colour) while info tokens last; discard a
    card the hints prove useless, else the oldest; else the first legal move."""
    lines = observation.splitlines()
    fireworks = {f[0]: int(f[1]) for f in next(x for x in lines if x.startswith("Fireworks:")).split()[1:]}
    hands, hand = [], []
    for line in lines[lines.index("Hands:") + 1:]:
        if line.startswith("Deck size"):
            break
        if line == "-----":
            hands.append(hand)
            hand = []
        elif "||" in line:  # "W1 || X1|RYGWB1": the card (XX: unseen), then what its holder knows
            card, knowledge = (part.strip() for part in line.split("||"))
            hinted, possible = knowledge.split("|")
            colours = [c for c in possible if c.isalpha()]
            ranks = [int(r) for r in possible if r.isdigit()]
            hand.append((card, hinted, colours, ranks))
    hands.append(hand)

    def pick(move: str) -> str | None:
        return move if move in moves else None

    own = hands[0]
    for i, (_, _, colours, ranks) in enumerate(own):
        if all(fireworks[c] + 1 == r for c in colours for r in ranks) and (move := pick(f"(Play {i})")):
            return move
    for k, hand in enumerate(hands[1:], 1):
        for card, hinted, _, _ in hand:
            if fireworks[card[0]] + 1 == int(card[1]):
                if hinted[1] == "X" and (move := pick(f"(Reveal player +{k} rank {card[1]})")):
                    return move
                if hinted[0] == "X" and (move := pick(f"(Reveal player +{k} color {card[0]})")):
                    return move
    useless = [i for i, (_, _, colours, ranks) in enumerate(own)
               if all(r <= fireworks[c] for c in colours for r in ranks)]
    for i in useless + [0]:
        if move := pick(f"(Discard {i})"):
            return move
    return moves[0]


def make_task(num_agents: int = 2, **kwargs) -> OpenSpielGame:
    return OpenSpielGame(num_agents, **kwargs)
