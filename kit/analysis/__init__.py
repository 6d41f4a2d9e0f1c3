"""Reading runs: evaluation, baselines, schemes, statistics, reports, plots and the explorer.

    evaluate.py   pass@k (unbiased), held-out evaluation over checkpoints (start here)
    progress.py   what a long evaluation says: its estimate before, its bars (checkpoints, decoding) during
    baselines.py  single model, naive concatenation, sequential pipeline, one-round discussion
    schemes.py    AST detection of the cooperation schemes in generated code
    stats.py      bootstrap intervals, paired when the items are shared
    report.py     RESULTS.md of a run;  compare.py: runs and seeds side by side;  runinfo.py: what a run is
    plots.py      matplotlib figures;  explore.py: ipywidgets browsers over the rollout log

May import: kit.run and every layer below it; not trainers (the trainer calls evaluation, not the reverse).
"""
