"""What an environment class offers and how the kit reads it (kit/sandbox/envhost.py runs it; this is the contract):

    spec_of(MyEnv)                     the class as the config holds it: "my_module:MyEnv", or "__main__:MyEnv" for a
                                       class defined in a notebook cell or the running script
    notebook_class("__main__:MyEnv")   such a class, defined in this process (else an error saying to run its cell)
    class_bytes("__main__:MyEnv")      such a class by value (dill), sent to the child; None for an importable one
    load_class("my_module:MyEnv")      the class, imported or rebuilt from its bytes (in the environment's child only)
    describe(instance)                 its tools' JSON schemas, tools_by_role, whether it has get_reward and
                                       get_agent_rewards
    arguments_error(name, tool, args)  what a call's wrong arguments were and what the tool takes (the model reads it)
    agent_shares(value, roles)         get_agent_rewards()'s value as a float per role, in the team's order
    as_text(value)                     a tool's result as the text of its tool turn, cut to MAX_RESULT_CHARS

May import: the standard library (describe imports transformers for the schemas, class_bytes and load_class dill).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math

MAX_RESULT_CHARS = 2000  # a tool result longer than this is cut (the context is the completion's budget)
MAX_RESET_CHARS = 4000  # what reset adds to every agent's prompt, cut alike
NOT_TOOLS = ("reset", "get_reward", "get_agent_rewards", "tools_by_role")


class EnvironmentClassError(RuntimeError):
    """The environment class cannot be used: the message names the class and what to fix."""


NOTEBOOK = "__main__"  # the module of a class defined in a notebook cell (or the script that runs the kit)


def spec_of(environment) -> str | None:
    """The config's form of an environment: a "module.path:ClassName" string as it is; a class (TRL's
    environment_factory=MyEnv) as "its_module:ClassName", "__main__:ClassName" for one defined in a notebook cell."""
    if environment is None or isinstance(environment, str):
        return environment
    if not inspect.isclass(environment):
        raise EnvironmentClassError(f"environment={environment!r}: give a class (TRL's environment_factory) or "
                                    "'module.path:ClassName'")
    name, module = environment.__qualname__, environment.__module__
    if "." in name:  # defined inside a function or another class: no name reaches it from a fresh process
        raise EnvironmentClassError(f"environment class {name!r} is not defined at the top level of {module!r}: "
                                    "define it at the top level of a notebook cell or a module")
    return f"{module}:{name}"


def notebook_class(spec: str):
    """The class a "__main__:ClassName" spec names, defined in this process (a notebook cell, or the script that runs
    the kit); None for an importable class. A notebook's run is rebuilt (resumed, evaluated) from a notebook that runs
    the class's cell first: without it, the error says so (the kit asks before the model loads)."""
    module, _, name = spec.partition(":")
    if module != NOTEBOOK:
        return None
    import sys

    cls = getattr(sys.modules.get(NOTEBOOK), name, None)
    if not inspect.isclass(cls) or cls.__module__ != NOTEBOOK:
        raise EnvironmentClassError(
            f"environment={spec!r} is a class defined in a notebook cell (or the script that runs the kit), and "
            f"no class {name!r} is defined here: run the cell that defines it first (a run of a notebook's class is "
            f"resumed and evaluated from a notebook), or, for a new run, write it to a module file and give "
            f"'module.path:{name}'")
    return cls


CLASS_FILE = "environment_class.b64"  # in a run folder: the notebook's class it trained with, by value


def keep_with_run(spec: str | None, run_dir) -> None:
    """A notebook's class (defined here) written into the run folder by value, so that the run can be resumed and
    evaluated (02-07) from a runtime where its cell has not run; nothing for an importable class."""
    if spec and notebook_class(spec) is not None:
        from pathlib import Path

        (Path(run_dir) / CLASS_FILE).write_text(class_bytes(spec))


def restore_from_run(spec: str | None, run_dir, log=print) -> None:
    """Before a run's notebook class is needed: when no such class is defined in this process but the run kept it
    (keep_with_run), it is defined again from the run's copy, and said; a class defined here (its cell ran) wins."""
    import sys
    from pathlib import Path

    if not spec or spec.partition(":")[0] != NOTEBOOK:
        return
    name, kept = spec.partition(":")[2], Path(run_dir) / CLASS_FILE
    defined = getattr(sys.modules.get(NOTEBOOK), name, None)
    if inspect.isclass(defined) or not kept.exists():
        return
    import base64

    import dill

    cls = dill.loads(base64.b64decode(kept.read_text()))
    setattr(sys.modules[NOTEBOOK], name, cls)
    log(f"[kit] environment class {name} is not defined in this notebook: using the copy the run kept ({kept}); run "
        "the cell that defines it to use that one instead")


def class_bytes(spec: str) -> str | None:
    """A notebook's class (notebook_class) pickled by value with dill (its methods and the notebook's functions and
    constants they use; modules by name), base64 text for the child; None for an importable class, which the child
    imports itself."""
    cls = notebook_class(spec)
    if cls is None:
        return None
    import base64

    import dill

    _resolve_annotations(cls)
    try:
        return base64.b64encode(dill.dumps(cls, recurse=True)).decode("ascii")
    except Exception as err:
        raise EnvironmentClassError(f"environment={spec!r}: the class cannot be sent to the environment's process "
                                    f"({type(err).__name__}: {err}); write it to a module file and give "
                                    f"'module.path:{cls.__name__}'") from None


def _resolve_annotations(cls) -> None:
    """Type hints written as strings (`from __future__ import annotations`, which a notebook keeps for every cell)
    name types the methods never use, so they would not travel with the class: resolve them here, where the names
    are defined (the tools' schemas are made from them in the child)."""
    import typing

    for value in [v for klass in cls.__mro__ if klass.__module__ == NOTEBOOK for v in vars(klass).values()]:
        function = getattr(value, "__func__", value)
        hints = getattr(function, "__annotations__", None)
        if inspect.isfunction(function) and hints and any(isinstance(h, str) for h in hints.values()):
            try:
                function.__annotations__ = typing.get_type_hints(function)
            except Exception:  # a hint this process cannot resolve either: the child's schema error names it
                pass


def load_class(spec: str, pickled: str | None = None):
    """'module.path:ClassName' -> the class (imported in the child only); a notebook's class from its bytes."""
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise EnvironmentClassError(f"environment={spec!r}: give 'module.path:ClassName' (e.g. "
                                "'kit.tasks.environments:KeyHalves'), a class importable from the working folder")
    if pickled:
        import base64

        import dill

        cls = dill.loads(base64.b64decode(pickled))
    else:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise EnvironmentClassError(f"environment={spec!r} cannot be imported: {type(err).__name__}: "
                                        f"{err}") from None
    if not hasattr(cls, "reset"):
        raise EnvironmentClassError(f"environment={spec!r} has no reset(**row) method: a TRL environment class "
                                    "needs one")
    return cls


def describe(instance) -> dict:
    """{"tools": name -> JSON schema, "by_role": {role: [names]}, "reward": bool, "agent_rewards": bool} of an
    environment instance."""
    from transformers.utils import get_json_schema

    tools = {}
    for name in sorted(dir(type(instance))):
        if name.startswith("_") or name in NOT_TOOLS or not callable(getattr(instance, name, None)):
            continue
        try:
            tools[name] = get_json_schema(getattr(instance, name))
        except Exception as err:  # transformers names what is missing (a type hint, an Args: line)
            raise EnvironmentClassError(f"tool {type(instance).__name__}.{name}: its schema cannot be made from its "
                                    f"type hints and docstring ({err}); give every argument a type hint and a "
                                    "Google-style 'Args:' line, as TRL requires") from None
    by_role = dict(getattr(instance, "tools_by_role", None) or {})
    unknown = sorted({t for names in by_role.values() for t in names} - set(tools))
    if unknown:
        raise EnvironmentClassError(f"{type(instance).__name__}.tools_by_role names {unknown}, which are not tools; "
                                f"its tools: {sorted(tools)}")
    return {"tools": tools, "by_role": {r: list(v) for r, v in by_role.items()},
            "reward": callable(getattr(instance, "get_reward", None)),
            "agent_rewards": callable(getattr(instance, "get_agent_rewards", None))}


def agent_shares(value, roles: list[str]) -> list[float]:
    """get_agent_rewards()'s value as a float per role, in the team's order: a {role: number} dict names every role,
    a list has one number per agent in the team's order; each a finite number."""
    if isinstance(value, dict):
        missing = [r for r in roles if r not in value]
        if missing:
            raise ValueError(f"get_agent_rewards() returned {str(value)[:200]}: it names no share for role(s) "
                             f"{missing}; give a {{role: number}} for each of {roles}")
        value = [value[r] for r in roles]
    if not isinstance(value, (list, tuple)) or len(value) != len(roles):
        raise ValueError(f"get_agent_rewards() returned {str(value)[:200]}: give a {{role: number}} dict or a list "
                         f"of {len(roles)} numbers, one per agent in the team's order {roles}")
    shares = [float(v) for v in value]
    if not all(math.isfinite(v) for v in shares):
        raise ValueError(f"get_agent_rewards() returned {shares}: each share must be a finite number")
    return shares


def arguments_error(name: str, tool, arguments: dict) -> str | None:
    """None when `arguments` fit the tool's signature, else an error that names what was wrong and what the tool
    takes (the model reads it in the tool turn: "read_left takes no arguments: call it with {}")."""
    try:
        signature = inspect.signature(tool)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**arguments)
        return None
    except TypeError as err:
        params = [p for p in signature.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not params:
            takes = f"{name} takes no arguments: call it with \"arguments\": {{}}"
        else:
            takes = f"{name} takes " + ", ".join(
                p.name + ("" if p.default is p.empty else " (optional)") for p in params)
        return f"wrong arguments ({err}); {takes}"


def as_text(value, limit: int = None) -> str:
    """A result as text: a str as it is, else JSON; cut to `limit` characters; never a string UTF-8 cannot encode
    (a file name with a stray byte), which the tokenizer would refuse."""
    limit = limit or MAX_RESULT_CHARS
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + " ...[cut]"


def _awaited(value):
    """An async tool's (or reset's) result: TRL awaits coroutines, so does the kit."""
    if inspect.isawaitable(value):
        import asyncio

        return asyncio.run(_wait(value))
    return value


async def _wait(awaitable):
    return await awaitable
