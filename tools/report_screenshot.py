"""The README's picture of a report: train a tiny toy run, evaluate it, write its report, and draw the report's
first screen (title, the run table, the learning figure) into docs/report_first_screen.png.

    python tools/report_screenshot.py [--run-dir checkpoints/report_demo] [--out docs/report_first_screen.png]

The picture is the report's own text and its own figure, laid out by matplotlib (no browser): headings bold,
tables as they are in the Markdown, so what the README shows is what `python -m kit report` wrote.
"""

import argparse
import re
import textwrap
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def make_run(run_dir: Path) -> None:
    from kit.analysis.baselines import compare
    from kit.run.config import load_config
    from kit.analysis.evaluate import RunContext, evaluate_run
    from kit.trainers.trainer import Trainer

    cfg = load_config("tiny_cpu", overrides=[f"run_dir={run_dir}", "num_steps=60", "save_every=20",
                                             "eval_every=10", "progress=false"])
    trainer = Trainer(cfg)
    trainer.train()
    trainer.close()
    ctx = RunContext(run_dir)
    evaluate_run(run_dir, "all", n=5, ctx=ctx)
    compare(run_dir, n=5, ctx=ctx)
    ctx.close()


def first_screen(results: Path, out: Path, max_lines: int = 24) -> None:
    """The Markdown up to and including the first figure, drawn as text above the figure itself."""
    import matplotlib.image as mpimg
    from matplotlib.figure import Figure

    text, image = results.read_text().split("\n"), None
    lines = []
    for line in text:
        found = re.match(r"!\[[^\]]*\]\(([^)]+)\)", line)
        if found:
            image = results.parent / found.group(1)
            break
        if line.strip() and not line.startswith("|---"):
            lines += textwrap.wrap(line, 125, subsequent_indent="  ") if not line.startswith("|") else [line]
    lines = lines[:max_lines]
    picture = mpimg.imread(image)
    width = 11.0
    text_h = 0.22 * len(lines) + 0.3
    pic_h = width * picture.shape[0] / picture.shape[1]
    fig = Figure(figsize=(width, text_h + pic_h))
    top = fig.add_axes([0, pic_h / (text_h + pic_h), 1, text_h / (text_h + pic_h)])
    top.axis("off")
    for i, line in enumerate(lines):
        heading = line.startswith("#")
        top.text(0.02, 1 - (i + 0.8) / len(lines), line.lstrip("# ") if heading else line[:150],
                 family="sans-serif" if heading else "monospace", fontsize=13 if line.startswith("# ") else 9.5,
                 weight="bold" if heading else "normal", va="center", transform=top.transAxes)
    bottom = fig.add_axes([0, 0, 1, pic_h / (text_h + pic_h)])
    bottom.imshow(picture)
    bottom.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default="checkpoints/report_demo")
    parser.add_argument("--out", default="docs/report_first_screen.png")
    args = parser.parse_args()
    from kit.analysis.report import write_report

    run_dir = Path(args.run_dir)
    if not (run_dir / "eval" / "baselines.json").exists():
        make_run(run_dir)
    first_screen(write_report(run_dir), Path(args.out))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
