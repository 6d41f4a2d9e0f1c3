"""One place assembles a run (kit/trainers/assemble.py): the weights of a short model name are resolved once, on the
main process, and every process loads what it found (review 6, finding 1).

    python -m pytest tests/test_assemble.py
"""

import threading

import pytest

from kit.engine import weights
from kit.run.config import load_config
from kit.trainers.assemble import pin_weights
from tests.test_distributed import ThreadsOfOneRun

SMOL = "smollm2-135m"
HUB_PIN = "hub:HuggingFaceTB/SmolLM2-135M-Instruct@c0ffee"


def test_every_process_pins_what_the_main_process_resolved_and_only_it_asks(monkeypatch):
    """Process 1 is offline: asked itself, it would fall back to the packaged copy while process 0 trains on the
    hub's weights. It never asks; it takes process 0's hub commit."""
    here = threading.local()
    asked = []

    def resolve(name, pin=None, log=print):
        asked.append((here.rank, name, pin))
        if here.rank == 1:
            return "/cache/packaged", weights.package_source(weights.SHORT_NAMES[name])
        return "HuggingFaceTB/SmolLM2-135M-Instruct", HUB_PIN

    monkeypatch.setattr(weights, "resolve", resolve)
    run = ThreadsOfOneRun(2)

    def process(rank):
        here.rank = rank
        cfg = load_config("smol_writing")
        pin_weights(cfg, run.rank(rank), log=lambda *a: None)
        return cfg.model_sources

    assert run.run(process) == [{SMOL: HUB_PIN}, {SMOL: HUB_PIN}]
    assert asked == [(0, SMOL, None)]


def test_a_config_that_asks_for_a_kind_of_source_gets_the_full_source_pinned(monkeypatch):
    monkeypatch.setattr(weights, "resolve", lambda name, pin=None, log=print: ("/f", f"resolved {pin}"))
    cfg = load_config("smol_writing", overrides=["model_sources={smollm2-135m: package}"])
    pin_weights(cfg, ThreadsOfOneRun(1).rank(0), log=lambda *a: None)
    assert cfg.model_sources == {SMOL: "resolved package"}


def test_a_model_that_is_not_a_short_name_is_left_alone(monkeypatch):
    monkeypatch.setattr(weights, "resolve", lambda *a, **k: pytest.fail("resolved a model that has no short name"))
    cfg = load_config("tiny_cpu")
    pin_weights(cfg, ThreadsOfOneRun(1).rank(0))
    assert cfg.model_sources == {}


def test_a_hub_pin_where_the_hub_does_not_answer_stops_instead_of_loading_other_weights(monkeypatch):
    def no_hub(hub_id, revision=None):
        raise ConnectionError("this process is offline")

    monkeypatch.setattr(weights, "hub_commit", no_hub)
    with pytest.raises(RuntimeError, match="uses the hub's weights .* did not answer .* cannot switch"):
        weights.resolve(SMOL, HUB_PIN, log=lambda *a: None)
