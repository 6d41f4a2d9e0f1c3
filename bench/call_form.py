"""How whole a draft the untrained coder writes into a tool call, per way of starting the call (issue 52).

A 0.5B coder whose answer was started as `{"name": "post", "arguments": {"text": "def aux(` mostly closed the JSON
string after the signature or the docstring: the Board's discussion runs (coopdisc, seeds 23-24) posted 86 one-line
drafts and 23 longer ones in 160 calls (51 calls did not parse). This script samples only the first call (up to
`</tool_call>`) of each agent of the code task, on TRAINING problems (no held-out figure is read), under several
starts of the same call, and counts what the call carries:

    python bench/call_form.py --tool post --items 8 --n 2        # the Board's post (prefill: board / discussion)
    python bench/call_form.py --tool run_tests --items 8 --n 2   # CodeTests' run_tests (prefill: tool)

The starts differ only in what follows the opening quote of the draft's string:
    inline    "def aux(                       (the kit's start before this script)
    newline   "\\ndef aux(   with a literal newline (toolcalls.parse_calls reads it: json strict=False)
    escaped   "\\\\ndef aux(  an escaped newline, the JSON way, shown to the model once
    fenced    "```python\\ndef aux(   a literal newline after a ```python fence inside the string (the kit's start now)

Per start: calls read (toolcalls.parse_calls, as the engine reads a round that ended: with EOS or at `</tool_call>`;
a text cut by the token budget is not a call), drafts of more than one line, drafts that parse as Python and define
the function with a body (not a bare signature or `pass`), mean lines of the drafts read. `--rescore FILE` scores
the texts a run wrote (`--texts`) again with the kit's current reader, without the model. The Qwen2.5-Coder-0.5B
GGUF of kit/engine/weights.py, the preset coder_code's sampling (temperature 0.7, top_p from the preset), a fixed seed.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kit.engine.models import load_base  # noqa: E402
from kit.engine.prompts import Prompt  # noqa: E402
from kit.engine.toolcalls import parse_calls, prompt_ids  # noqa: E402
from kit.run.presets import PRESETS  # noqa: E402
from kit.sandbox.envclass import describe  # noqa: E402
from kit.tasks.code import CODE_START, POST_DRAFT, TOOL_START, CodeTask  # noqa: E402
from kit.tasks.codeparse import extract_code  # noqa: E402
from kit.tasks.environments import Board, CodeTests  # noqa: E402

# the kit's call starts less their draft's start (CODE_START): the head each start below follows
HEADS = {"post": (POST_DRAFT.format(name="")[:-len(CODE_START.format(name=""))], "text", Board),
         "run_tests": (TOOL_START.format(name="")[:-len(CODE_START.format(name=""))], "code", CodeTests)}
BODIES = {"inline": "def {name}(", "newline": "\ndef {name}(", "escaped": "\\ndef {name}(", "fenced": CODE_START}


def has_body(code: str, name: str) -> bool:
    """The code parses and defines `name` with a statement besides a docstring and `pass`/`...`."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            return any(not isinstance(s, ast.Pass) for s in body)
    return False


def score(rows: list[dict], tool: str) -> dict:
    """The table's counts for one start's sampled calls ({"text", "name", "ended"} each)."""
    key = HEADS[tool][1]
    read = lines = whole = body = 0
    for row in rows:
        calls = [c for c in parse_calls(row["text"], [tool]) if "error" not in c] if row["ended"] else []
        if not calls or not isinstance(calls[0].get("arguments"), dict):
            continue
        read += 1
        draft = str(calls[0]["arguments"].get(key, ""))
        n_lines = draft.strip().count("\n") + 1
        lines += n_lines
        whole += n_lines > 1
        body += has_body(extract_code(draft) if "```" in draft else draft, row["name"])
    return {"calls": len(rows), "read": read, "whole": whole, "body": body, "lines": lines / max(read, 1)}


def line(start: str, counts: dict, seconds: float | str) -> str:
    return (f"| {start} | {counts['calls']} | {counts['read']} | {counts['whole']} | {counts['body']} | "
            f"{counts['lines']:.1f} | {seconds if isinstance(seconds, str) else f'{seconds:.0f}'} |")


HEADER = ("| start | calls | read as a call | drafts of more than one line | drafts that define the function with a "
          "body | mean lines | s |\n|---|---|---|---|---|---|---|")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", choices=sorted(HEADS), default="post")
    ap.add_argument("--items", type=int, default=8, help="training problems of the cooperative set")
    ap.add_argument("--n", type=int, default=2, help="samples per agent per problem")
    ap.add_argument("--starts", nargs="*", default=list(BODIES))
    ap.add_argument("--tokens", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--texts", default="", help="a file to write every sampled call to (JSONL)")
    ap.add_argument("--rescore", default="", help="score a --texts file again (no model)")
    args = ap.parse_args()
    if args.rescore:
        rows = [json.loads(x) for x in open(args.rescore, encoding="utf-8")]
        for tool in dict.fromkeys(r["tool"] for r in rows):
            print(f"{tool} (rescored from {args.rescore})\n{HEADER}")
            for start in dict.fromkeys(r["start"] for r in rows if r["tool"] == tool):
                print(line(start, score([r for r in rows if r["tool"] == tool and r["start"] == start], tool), "-"))
        return
    preset = PRESETS["coder_code"]
    model, tok = load_base(preset["model_name"], quantization="none", dtype="float32", device="cpu")
    task = CodeTask(dataset="coop")
    items = task.load("train")[:args.items]
    head, _, env_cls = HEADS[args.tool]
    env = env_cls()
    schemas = list(describe(env)["tools"].values())
    print(f"{args.tool}: {len(items)} training problems x 2 agents x {args.n} samples, seed {args.seed}\n{HEADER}")
    for start in args.starts:
        ids_rows, named = [], []
        for item in items:
            for prompt, name in zip(task.prompts(item), ("aux", item["entry_point"])):
                added = env.reset(**item)
                begun = head + BODIES[start].format(name=name)
                text = Prompt(f"{prompt}\n\n{added}" if added else prompt, begun)
                ids_rows += [prompt_ids(tok, text, schemas)] * args.n
                named += [(name, begun)] * args.n
        torch.manual_seed(args.seed)
        width = max(map(len, ids_rows))
        ids = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in ids_rows])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in ids_rows])[:, None]).long()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.tokens, do_sample=True,
                                 temperature=preset["temperature"], top_p=preset.get("top_p", 1.0),
                                 stop_strings=["</tool_call>"], tokenizer=tok, pad_token_id=tok.pad_token_id)
        seconds = time.perf_counter() - t0
        rows = []
        for new, (name, begun) in zip(out[:, width:].tolist(), named):
            sampled = [t for t in new if t != tok.pad_token_id]
            ended = len(sampled) < args.tokens or "</tool_call>" in tok.decode(sampled)
            rows.append({"tool": args.tool, "start": start, "name": name, "ended": ended,
                         "text": begun + tok.decode(sampled, skip_special_tokens=True)})
        if args.texts:
            with open(args.texts, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
        print(line(start, score(rows, args.tool), seconds), flush=True)


if __name__ == "__main__":
    main()
