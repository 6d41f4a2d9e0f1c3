"""The loops: MAGRPO's Trainer and the families that override what differs.

    assemble.py            a config made into the run's parts (weights pinned once, task, rewards, team, optimizers,
                           algorithm, run directory): what every trainer receives
    trainer.py             the loop read top to bottom: sample -> score -> advantages -> update -> log -> checkpoint
    critic.py              the algorithm seam: MAGRPO's advantages, and IAC/MAAC critics (CoMLRL's actor-critic)
    preference_trainer.py  MADPO and the judge's pairs (CoMLRL's preference family)
    marlhf.py              MARLHF: a reward model on the shared base, fit from pairs
    game_trainer.py        turn-based games (Hanabi, the coordination suite)

May import: every layer below (analysis, run, tasks, engine, judge, sandbox, maths); only kit.colab and
kit.__main__ import a trainer from above.
"""
