"""Data-parallel scaling on one machine: the same run on 1 and on 2 processes (torchrun, one thread each).

    python bench/data_parallel.py                          # items 4, 8, 16; the 80M model of compare_comlrl.py
    python bench/data_parallel.py --tiny --items 2 --steps 1   # the built-in tiny model: a smoke run (tests)

`kit`: `torchrun --nproc_per_node P bench/data_parallel.py --worker ...`: each process builds the team, takes its
share of the step's items (`--items`, the global batch; 2 agents, G=4, 32 new tokens, EOS disabled as in
compare_comlrl.py), and the adapters' gradients are summed across processes (kit/run/distributed.py).
`independent` (the control): P separate single-process runs started together, each with items/P items and no
communication at all: what this machine gives two processes sharing its cores and memory bus, the ceiling for
data parallelism here. Joint actions per second are the global batch's (items x G) per step over the wall time
of the slowest process, after one warm-up step. Every process runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "out"
G, NEW_TOKENS = 4, 32


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    from compare_comlrl import MODEL_DIR, no_eos

    from kit.run.config import load_config
    from kit.tasks.toy import DigitSum
    from kit.trainers.trainer import Trainer

    model = "tiny" if args.tiny else str(MODEL_DIR)
    cfg = load_config(overrides=[f"model_name={model}", "num_agents=2", f"num_generations={G}",
                                 f"max_new_tokens={NEW_TOKENS}", "temperature=0.7", "top_p=0.9",
                                 "use_chat_template=false", "quantization=none", f"batch_size={args.items}",
                                 f"num_steps={args.steps + 1}", "eval_every=0", "save_every=0", "progress=false",
                                 "log_rollouts=false", f"run_dir={args.run_dir}", "lora_r=16", "lora_alpha=32"])
    trainer = Trainer(cfg, task=DigitSum(2), log=lambda *_: None)
    for m in trainer.team.models:
        no_eos(m)
    trainer.train(max_steps=1)  # warm-up
    trainer.dist.barrier()
    if args.ready:  # independent processes: start timing together
        Path(args.ready, str(os.getpid())).touch()
        while len(list(Path(args.ready).iterdir())) < args.processes:
            time.sleep(0.01)
    t0 = time.perf_counter()
    trainer.train(max_steps=args.steps)
    seconds = time.perf_counter() - t0
    if trainer.dist.is_main:
        print("RESULT " + json.dumps({"seconds": seconds}), flush=True)


def launch(mode: str, processes: int, items: int, steps: int, tiny: bool) -> dict:
    name = f"dp_{mode}_{processes}{'_tiny' if tiny else ''}"
    shutil.rmtree(OUT / name, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'bench'}:{ROOT}"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    args = [str(Path(__file__).resolve()), "--worker", "--processes", str(processes), "--steps", str(steps)] + \
        (["--tiny"] if tiny else [])
    if mode == "kit":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmds = [[sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
                 str(port), *args, "--items", str(items), "--run-dir", str(OUT / name)]]
    else:
        ready = OUT / name / "ready"
        ready.mkdir(parents=True)
        cmds = [[sys.executable, *args, "--items", str(items // processes), "--run-dir", str(OUT / name / str(k)),
                 "--ready", str(ready)] for k in range(processes)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
    seconds = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"{mode} with {processes} processes failed:\n{err[-3000:]}")
        seconds.append(json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])["seconds"])
    wall = max(seconds)
    return {"items": items, "processes": processes, "mode": mode, "steps": steps, "s_per_step": wall / steps,
            "joint_actions_per_s": steps * items * G / wall}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ready", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=2, help="processes to compare with one")
    parser.add_argument("--items", type=int, nargs="+", default=[4, 8, 16], help="items per step (global batch)")
    parser.add_argument("--steps", type=int, default=2, help="steps timed after the warm-up step")
    parser.add_argument("--no-control", action="store_true", help="skip the independent-processes control")
    parser.add_argument("--tiny", action="store_true", help="the built-in tiny model (a smoke run)")
    args = parser.parse_args(argv)
    if args.worker:
        args.items = args.items[0]
        worker(args)
        return []
    if not args.tiny:
        from compare_comlrl import build_model

        build_model()
    P = args.processes
    results = []
    print("| items/step | configuration | s/step | joint actions/s | vs 1 process |\n|---|---|---|---|---|", flush=True)
    for items in args.items:
        runs = [("kit", 1), ("kit", P)] + ([] if args.no_control else [("independent", P)])
        rows = [launch(mode, p, items, args.steps, args.tiny) for mode, p in runs]
        for r in rows:
            r["speedup"] = r["joint_actions_per_s"] / rows[0]["joint_actions_per_s"]
            label = "1 process" if r["processes"] == 1 else f"{r['mode']}, {r['processes']} processes"
            print(f"| {items} | {label} | {r['s_per_step']:.2f} | {r['joint_actions_per_s']:.2f} | "
                  f"{r['speedup']:.2f}x |", flush=True)
        results += rows
    return results


if __name__ == "__main__":
    main()
