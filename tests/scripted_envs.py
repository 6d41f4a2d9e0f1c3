"""Environment classes for tests/test_env_*.py, imported by the environment's child process."""

import json
import time


class Recorder:
    """Records the row reset got; `echo` returns it; `boom` raises; `slow` sleeps past the time limit."""

    def __init__(self):
        self.row, self.calls = {}, 0

    def reset(self, **row):
        self.row, self.calls = row, 0
        return f"row {row.get('id', '?')} is ready"

    def echo(self) -> str:
        """Return the row this world was reset with.

        Returns:
            The row as JSON.
        """
        self.calls += 1
        return json.dumps(self.row, sort_keys=True)

    def boom(self, why: str) -> str:
        """Raise an error.

        Args:
            why: The error's message.
        """
        raise ValueError(why)

    def slow(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "woke"

    def get_reward(self) -> float:
        return float(self.calls)


class Noisy:
    """Prints to stdout and reads stdin inside a tool: neither may touch the protocol."""

    def reset(self, **row):
        print("hello from reset")
        return None

    def chatty(self) -> str:
        """Print, read stdin, then answer.

        Returns:
            What stdin gave and a word.
        """
        import sys

        print("noise on stdout")
        return f"stdin={sys.stdin.read()!r} ok"


class Hostile:
    """A tool that forks (its copy returns into the server's loop), a reset that kills its process."""

    def reset(self, **row):
        if row.get("id") == "die":
            import os

            os._exit(3)
        return None

    def fork_and_answer(self) -> str:
        """Fork; the copy returns too.

        Returns:
            Which process answered.
        """
        import os

        return "child" if os.fork() == 0 else "parent"

    def ping(self) -> str:
        """Answer pong.

        Returns:
            pong.
        """
        return "pong"


class Ledger:
    """No get_reward: a reward function reads the world (its row, its notes) through the `environment` it gets."""

    built = 0

    def __init__(self):
        self.row, self.notes = {}, []
        self.number = Ledger.built  # which instance: one per world
        Ledger.built += 1

    def reset(self, **row):
        self.row, self.notes = row, []

    def note(self, text: str) -> str:
        """Write a note in this world.

        Args:
            text: The note.
        """
        self.notes.append(text)
        return "noted"

    def shout(self, word: str = "hey") -> str:
        """Say a word loudly.

        Args:
            word: The word.
        """
        return word.upper()


class Sized:
    """Built with arguments (TRL's environment_factory as a partial): `size` returns what it was built with."""

    def __init__(self, size: int = 1, label: str = "plain", deck: list | None = None, blob: str = ""):
        self.built = {"size": size, "label": label, "blob": len(blob)}
        self.deck = deck if deck is not None else []

    def draw(self) -> str:
        """Take the top card of this world's deck.

        Returns:
            The card.
        """
        return str(self.deck.pop())

    def reset(self, **row):
        return None

    def size(self) -> str:
        """What this world was built with.

        Returns:
            Its constructor's arguments as JSON.
        """
        return json.dumps(self.built, sort_keys=True)


class Shares(Recorder):
    """Recorder with each agent's own share: `get_agent_rewards` answers `shares` (set by the test through a tool)."""

    shares = [0.25, 0.75]

    def set_shares(self, shares: str) -> str:
        """Set what get_agent_rewards answers.

        Args:
            shares: A JSON list of numbers.
        """
        self.shares = json.loads(shares)
        return "set"

    def get_agent_rewards(self) -> list:
        return self.shares


class Rendezvous(Recorder):
    """`arrive` leaves a file; `wait` waits for one (up to `seconds`): two worlds meet only if their calls run at once."""

    def arrive(self, path: str) -> str:
        """Leave a file.

        Args:
            path: Where.
        """
        import os

        open(path, "w").close()
        return f"arrived in process {os.getpid()}"

    def wait(self, path: str, seconds: float = 60.0) -> str:
        """Wait for a file.

        Args:
            path: Which.
            seconds: How long at most.
        """
        import os

        end = time.monotonic() + seconds
        while not os.path.exists(path):
            if time.monotonic() > end:
                return "alone"
            time.sleep(0.01)
        return "met"


class Dice(Recorder):
    """Draws in reset and in a tool, from Python's `random` and numpy's global generator (review 7: a TRL class that
    draws a secret word or shuffles a deck)."""

    def reset(self, **row):
        import random

        import numpy as np

        self.secret = [random.randint(0, 10**6), int(np.random.randint(0, 10**6))]
        return f"dealt {self.secret}"

    def show(self) -> str:
        """What reset dealt."""
        return json.dumps(self.secret)

    def roll(self) -> str:
        """Roll again."""
        import random

        import numpy as np

        return json.dumps([random.randint(0, 10**6), int(np.random.randint(0, 10**6))])


class Crasher(Recorder):
    """`crash` ends the child process (a segfault's stand-in), with exit code 3: its pipes close first and it exits
    half a second later, so the parent sees the end of its output while the process is not yet gone."""

    def crash(self) -> str:
        """End the process."""
        import os

        os.closerange(3, 1024)  # the protocol's copy of stdout is among them: the parent reads the end of its output
        os.close(1)
        time.sleep(0.5)
        os._exit(3)


class Strict:
    """reset names its own fields and takes nothing else (no **kwargs): a row with a key of the kit's would fail."""

    def reset(self, prompt, key: str, note: str = ""):
        self.row = {"prompt": prompt, "key": key, "note": note}

    def show(self) -> str:
        """The row reset got."""
        return json.dumps(self.row)
