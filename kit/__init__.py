"""MAGRPO kit: train teams of LLM agents to collaborate (arXiv 2508.04652). See README.md for the map."""

__version__ = "0.1.0"
