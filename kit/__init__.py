"""MAGRPO kit: train teams of LLM agents to collaborate (arXiv 2508.04652). See README.md for the map.

The layers, bottom to top (a module imports only its own layer and those below; tests/test_structure.py checks):
    kit.env, kit.maths -> kit.sandbox, kit.judge -> kit.engine -> kit.tasks -> kit.run -> kit.analysis
    -> kit.trainers -> kit.colab, kit.__main__

What a notebook cell usually needs is here, imported on first use (so `import kit` stays light):
    from kit import load_config, preset, TrainConfig, Trainer, from_functions
"""

__version__ = "0.1.0"

_EXPORTS = {"load_config": "kit.run.config", "preset": "kit.run.config", "TrainConfig": "kit.run.config",
            "Trainer": "kit.trainers.trainer", "from_functions": "kit.tasks"}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kit' has no attribute {name!r}")
