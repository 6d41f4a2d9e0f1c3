"""The sandbox's wire format: plain values as one line of JSON, decoded strictly into builtin data.

    line = dumps(["ok", encode(value)])      # untrusted runner -> trusted checker (and the checker's calls back)
    value = decode(loads(line)[1])           # only None, bool, int, float, complex, str, bytes, list, tuple,
                                             # dict, set, frozenset, range, Fraction, Decimal, an iterator
                                             # over a list, or Opaque

Whatever the generated program returns crosses as data and is rebuilt from builtin types on the trusted side, so no
object of the program (an "always equal" class, a patched `__eq__`, a lying `__bool__`) is ever compared there: the
defence against those tricks is structural, not a check. JSON scalars stand for themselves; every container is a
tagged list so lists, tuples, sets and dicts survive the trip. Anything else (a function, an instance of the
program's class) becomes `Opaque`, which equals nothing but itself.

This file is stdlib only: kit/sandbox/sandbox.py sends its source, followed by the runner's or the checker's, to a fresh
`python -I -S` (neither side imports the kit).
"""

import json
import math

MAX_DEPTH = 100  # nesting of containers, on both sides
MAX_ITEMS = 100_000  # elements of one value, counted over the whole value
MAX_ITERATOR = 10_000  # items taken from a returned iterator or generator


class Opaque:
    """A returned object that is not plain data: shown by its type, equal only to itself."""

    def __init__(self, type_name, text):
        self.type_name, self.text = str(type_name)[:100], str(text)[:200]

    def __repr__(self):
        return f"<{self.type_name} from the sandbox: {self.text}>"


def encode(value):
    """A JSON-ready form of `value` (see the module docstring); ValueError if it is too big or too deep."""
    budget = [MAX_ITEMS]

    def enc(x, depth):
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            raise ValueError("the value is too large or too deeply nested to check")
        if x is None or x is True or x is False:
            return x
        if isinstance(x, bool):  # a bool subclass cannot exist; kept for clarity of the order
            return bool(x)
        if isinstance(x, int):
            v = int.__index__(x)  # beyond 2**62 as hex: decimal text of huge ints has a length limit
            return v if -(1 << 62) < v < 1 << 62 else ["n", hex(v)]
        if isinstance(x, float):
            v = float.__float__(x)
            return v if math.isfinite(v) else ["f", float.hex(v)]
        if isinstance(x, str):
            return str.__str__(x)
        if isinstance(x, complex):
            return ["c", float.hex(x.real), float.hex(x.imag)]
        if isinstance(x, (bytes, bytearray)):
            return ["b", bytes(x).hex()]
        if isinstance(x, list):
            return ["l", [enc(v, depth + 1) for v in list.__iter__(x)]]
        if isinstance(x, tuple):
            return ["t", [enc(v, depth + 1) for v in tuple.__iter__(x)]]
        if isinstance(x, frozenset):
            return ["fs", [enc(v, depth + 1) for v in frozenset.__iter__(x)]]
        if isinstance(x, set):
            return ["s", [enc(v, depth + 1) for v in set.__iter__(x)]]
        if isinstance(x, dict):
            return ["d", [[enc(k, depth + 1), enc(dict.__getitem__(x, k), depth + 1)] for k in dict.__iter__(x)]]
        if type(x).__module__ == "fractions" and type(x).__name__ == "Fraction":
            return ["q", enc(x.numerator, depth + 1), enc(x.denominator, depth + 1)]
        if type(x).__module__ == "decimal" and type(x).__name__ == "Decimal":
            return ["dec", str(x)]
        if isinstance(x, range):
            return ["r", x.start, x.stop, x.step]
        if _is_iterator(x):
            items = []
            for v in x:
                if len(items) == MAX_ITERATOR:
                    raise ValueError(f"the returned iterator has more than {MAX_ITERATOR} items")
                items.append(enc(v, depth + 1))
            return ["i", items]
        return ["o", type(x).__name__, _safe_repr(x)]

    return enc(value, 0)


def decode(obj):
    """Builtin data from `encode`'s form; ValueError for anything else (the sender may be hostile)."""
    budget = [MAX_ITEMS]

    def dec(x, depth):
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            raise ValueError("the value is too large or too deeply nested")
        t = type(x)
        if x is None or t is bool or t is int or t is float or t is str:
            return x
        if t is not list or not x or type(x[0]) is not str:
            raise ValueError("not an encoded value")
        tag, rest = x[0], x[1:]
        if tag in ("l", "t", "s", "fs", "i") and len(rest) == 1 and type(rest[0]) is list:
            items = [dec(v, depth + 1) for v in rest[0]]
            return {"l": list, "t": tuple, "s": set, "fs": frozenset, "i": iter}[tag](items)
        if tag == "d" and len(rest) == 1 and type(rest[0]) is list:
            out = {}
            for pair in rest[0]:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not an encoded dict item")
                out[dec(pair[0], depth + 1)] = dec(pair[1], depth + 1)
            return out
        if tag == "f" and len(rest) == 1 and type(rest[0]) is str:
            return float.fromhex(rest[0])
        if tag == "c" and len(rest) == 2 and all(type(v) is str for v in rest):
            return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
        if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
            return bytes.fromhex(rest[0])
        if tag == "r" and len(rest) == 3 and all(type(v) is int for v in rest):
            r = range(*rest)
            if len(r) > MAX_ITEMS:  # a checker that lists it must not run out of memory
                raise ValueError("the returned range is too long to check")
            return r
        if tag == "n" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 1 << 20:
            return int(rest[0], 16)
        if tag == "q" and len(rest) == 2 and all(type(v) in (int, list) for v in rest):
            from fractions import Fraction

            return Fraction(dec(rest[0], depth + 1), dec(rest[1], depth + 1))
        if tag == "dec" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10000:
            from decimal import Decimal

            return Decimal(rest[0])
        if tag == "o" and len(rest) == 2 and all(type(v) is str for v in rest):
            return Opaque(rest[0], rest[1])
        raise ValueError(f"unknown value tag {tag[:20]!r}")

    return dec(obj, 0)


def dumps(message) -> bytes:
    """One message as one line (JSON escapes every newline inside strings)."""
    return json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


def loads(line: bytes):
    return json.loads(line.decode("ascii"))


def _is_iterator(x):
    t = type(x)
    return hasattr(t, "__next__") and hasattr(t, "__iter__")


def _safe_repr(x):
    try:
        return repr(x)[:200]
    except BaseException:
        return "?"
