"""The text of tool calls (kit/engine/tools.py runs the rounds): how an agent's prompt offers its tools, how calls
are read from what it writes, and how results come back into its context.

    ids = prompt_ids(tok, prompt, schemas)        # the template's own tools= rendering, else FALLBACK in a system turn
    calls = parse_calls(text, known_tools)        # [{"name", "arguments"}] or {"error"} per call
    n = call_end(tok, new_ids)                    # where a round stops: after its first complete call(s)
    suffix = tool_turn_text(tok, results, end_text, native=template_has_tools(tok, schemas))

Calls are read in Qwen's (Hermes) format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; a text with no
such block may still call a known tool with a bare or ```json-fenced JSON object. A call of one string argument that
is not valid JSON (a code draft with its docstring's quotes unescaped), or a started one left open, is read as meant
(one_string_call). The tool turn is rendered by the chat template on its own (the text after an assistant turn), so
the caller extends ids without re-tokenizing.

May import: kit.engine.
"""

from __future__ import annotations

import json
import re

from kit.engine.prompts import answer_start

# the blanks around a call's body are stripped in Python: `\s*(.*?)\s*($)` rescans a trailing run of n blank lines
# at every one of its positions (n^2 steps: 40,000 blank lines took 17 s; review 7)
_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)
_MARK = "KITMARK0"

FALLBACK = """You can call tools. To call one, write on its own line
<tool_call>{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}</tool_call>
then stop; the result comes back in <tool_response></tool_response>. When you have what you need, answer without a
tool call. Tools (JSON schemas):
{schemas}"""


def parse_calls(text: str, known=()) -> list[dict]:
    """The tool calls in a model's text: [{"name", "arguments"}], or {"error"} for a call that is not valid JSON.
    Without any <tool_call> block, a JSON object naming one of the `known` tools and giving its arguments (bare, or in
    a ```json fence: how Qwen2.5-Coder-0.5B answers a tool prompt) is a call too."""
    if "<tool_call>" not in text and known:
        return bare_calls(text, set(known))
    calls = []
    for body, closed in _CALL.findall(text):
        body = body.strip()
        if not body:
            continue
        try:
            call = json.loads(body, strict=False)  # a literal newline in a string (code written as it reads) is read
        except (ValueError, RecursionError) as err:  # a degenerate text (thousands of "[") is an error, not a crash
            call = _object_then_text(body) or one_string_call(body, closed=bool(closed))
            if call is None:
                calls.append({"error": f"the tool call is not valid JSON ({getattr(err, 'msg', 'nested too deeply')}"
                                       f"): {body[:200]}"})
                continue
        if not isinstance(call, dict) or "name" not in call:
            calls.append({"error": f"a tool call needs a name and arguments: {body[:200]}"})
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        calls.append({"name": str(call["name"]), "arguments": arguments})
    return calls


# a call of one string argument up to its string's opening quote, then the rest: (name, key, value)
_ONE_HEAD = r'\{\s*"name"\s*:\s*"([\w.-]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{\s*"(\w+)"\s*:\s*"(.*)'
_ONE_STRING = re.compile(_ONE_HEAD + r'"\s*\}\s*\}?', re.S)
_OPEN_STRING = re.compile(_ONE_HEAD, re.S)  # to the end: its closing fence is cut in Python (a regex tail of two
# optional blanks around an optional fence backtracks cubically on a run of blank lines)
_NEXT_KEY = re.compile(r'"\s*,\s*"\w+"\s*:')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "/": "/"}


_STARTED = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([\w.-]+)"')


def started_calls(start: str) -> list[str]:
    """The names of the tools an answer start calls (`<tool_call>{"name": "run_tests", ...`, complete or not)."""
    return _STARTED.findall(start)


def one_string_call(body: str, closed: bool = True) -> dict | None:
    """A call of one string argument that is not valid JSON, read as meant: `{"name": N, "arguments": {"k": "..."}}`
    whose string runs to the object's end (code with an unescaped `\"\"\"` docstring or a `\\'`, how a 0.5B coder
    writes a draft into a call; its last closing brace may be missing). Not `closed` (no `</tool_call>` came): a
    string that never ends is read to the text's end, less a closing code fence (the 0.5B coder, its call started
    for it with a newline in the string, writes its draft as a code block and ends its turn there: bench/README.md,
    "call_form"); such a string with literal newlines is code as it reads and is taken as written. Any other has
    JSON's escapes undone. None when the body is not of that shape."""
    match = _ONE_STRING.fullmatch(body.strip()) or (None if closed else _OPEN_STRING.fullmatch(body.strip()))
    if match is None:
        return None
    name, key, value = match.groups()
    if match.re is _ONE_STRING and _next_argument(value):  # `"a", "k2": "b"`: two arguments, broken: not one
        return None
    if match.re is _OPEN_STRING:
        if _NEXT_KEY.search(value.split("\n", 1)[0]):  # a call of several arguments, cut (a dict literal in the
            return None                                # code, lines below, is not a next argument)
        value = value.rstrip()
        value = value[:-3].rstrip() if value.endswith("```") else value
        if "\n" in value:  # code written as it reads: its escapes are the code's own (`'\\n'.join`)
            return {"name": name, "arguments": {key: value}}
    value = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), value, flags=re.S)
    return {"name": name, "arguments": {key: value}}


def _next_argument(value: str) -> bool:
    """Whether a closed string runs on into a next argument, `..."` + `, "key": <a JSON value to the end>`: the
    broken JSON of a call of several arguments. A dict literal inside code (`{"a": "x", "b": 2}` and more code after
    it) is not: what follows its key is not a JSON value to the end."""
    for m in _NEXT_KEY.finditer(value):
        tail = value[m.end():].strip()
        rest = "{" + value[m.start() + 1:].lstrip(" ,")  # the arguments after ours, as the rest of an object
        # the closing quote of a last string argument was matched as ours: give it back
        for candidate in (tail + '"', tail, rest + '"}', rest + "}"):
            try:
                json.loads(candidate)
                return True
            except (ValueError, RecursionError):
                pass
    return False


def _object_then_text(body: str) -> dict | None:
    """A complete call object followed by other text (`{"name": ..., "arguments": {...}}` then prose, with no
    `</tool_call>` between): the object."""
    try:
        call, _ = json.JSONDecoder(strict=False).raw_decode(body.strip())
    except (ValueError, RecursionError):
        return None
    return call if isinstance(call, dict) and "name" in call else None


def bare_calls(text: str, known: set) -> list[dict]:
    """JSON objects in the text with a known tool's `name` and its `arguments` (or `parameters`), in order; without
    any, a text that is one call of one string argument (bare or ```json-fenced) whose JSON is broken, by
    one_string_call."""
    decoder, calls, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict) and value.get("name") in known and isinstance(
                value.get("arguments", value.get("parameters")), dict):
            calls.append({"name": value["name"], "arguments": value.get("arguments", value.get("parameters"))})
        at = text.find("{", end)
    if not calls:
        repaired = one_string_call(re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip()))
        if repaired is not None and repaired["name"] in known:
            calls.append(repaired)
    return calls


def call_end(tok, ids: list[int]) -> int | None:
    """The number of tokens up to and including the end of the first run of complete calls in `ids`' text (None: no
    complete call): the first `</tool_call>`, extended over every `<tool_call>...</tool_call>` that follows it with
    only whitespace between (parallel calls, one block after another, as Qwen's template writes them). The tokens
    after it were sampled but are dropped: the model's earlier tokens do not depend on them."""
    text = tok.decode(ids, skip_special_tokens=True)
    if "</tool_call>" not in text:
        return None
    end, calls = text.index("</tool_call>") + len("</tool_call>"), 1
    while True:
        rest = text[end:].lstrip()
        if not (rest.startswith("<tool_call>") and "</tool_call>" in rest):
            break
        end = len(text) - len(rest) + rest.index("</tool_call>") + len("</tool_call>")
        calls += 1
    for n in range(1, len(ids) + 1):
        if tok.decode(ids[:n], skip_special_tokens=True).count("</tool_call>") >= calls:
            return n
    return None


def _messages(prompt: str) -> list[dict]:
    return list(getattr(prompt, "messages", None) or [{"role": "user", "content": str(prompt)}])


def template_has_tools(tok, schemas: list[dict]) -> bool:
    """Whether the chat template renders `tools=` (Qwen2.5's does; SmolLM2's ignores them)."""
    if not getattr(tok, "chat_template", None) or not schemas:
        return False
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=schemas, tokenize=False,
                                       add_generation_prompt=True)
    except Exception:
        return False
    return schemas[0]["function"]["name"] in text if "function" in schemas[0] else schemas[0]["name"] in text


def prompt_ids(tok, prompt: str, schemas: list[dict], use_chat_template: bool = True) -> list[int]:
    """The ids of an agent's prompt with its tools offered (the template's own way, else FALLBACK)."""
    messages = _messages(prompt)
    start = answer_start(prompt)
    if use_chat_template and getattr(tok, "chat_template", None):
        if schemas and template_has_tools(tok, schemas):
            text = tok.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=True)
        else:
            if schemas:
                extra = FALLBACK.format(schemas=json.dumps(schemas, indent=1))
                if messages[0]["role"] == "system":
                    messages = [{"role": "system", "content": messages[0]["content"] + "\n\n" + extra}, *messages[1:]]
                else:
                    messages = [{"role": "system", "content": extra}, *messages]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        body = "\n\n".join(m["content"] for m in messages)
        text = (FALLBACK.format(schemas=json.dumps(schemas)) + "\n\n" if schemas else "") + body + "\n"
    return tok(text + start, add_special_tokens=False).input_ids


def tool_turn_text(tok, results: list[str], end_text: str, use_chat_template: bool = True,
                   native: bool = True) -> str:
    """The text that follows an assistant turn ending in `end_text` (its end-of-turn token, as generated): the tool
    results as the template's tool turn, then the next assistant header. A template without tool support (`native`
    False: template_has_tools) or without a tool role: a user turn of <tool_response> blocks (FALLBACK's promise);
    no template: the blocks on their own."""
    blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    if not (use_chat_template and getattr(tok, "chat_template", None)):
        return f"\n{blocks}\n"
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARK}]
    tool_turn = [{"role": "tool", "content": r} for r in results]
    for turn in ([tool_turn] if native else []) + [[{"role": "user", "content": blocks}]]:
        try:
            full = tok.apply_chat_template(base + turn, tokenize=False, add_generation_prompt=True)
        except Exception:
            continue
        at = full.find(_MARK)
        rest = full[at + len(_MARK):] if at >= 0 else ""
        if end_text and rest.startswith(end_text):
            rest = rest[len(end_text):]
        if all(r in rest for r in results):
            return rest
    raise ValueError("the chat template renders neither a tool turn nor a user turn after an assistant turn")
