"""bench/gpu.py's CPU mode runs, so the GPU benchmark cannot rot. Run: python -m pytest tests/test_bench.py"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_bench_cpu_mode_runs_every_kit_engine_and_the_floor():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.main(["--tiny", "--configs", "kit_compiled", "kit_hf", "floor_static"])
    by = {r["config"]: r for r in results}
    assert set(by) == {"kit_compiled", "kit_hf", "floor_static"}
    for name in ("kit_compiled", "kit_hf"):
        assert by[name]["step_s"] > 0 and by[name]["joint_actions_per_s"] > 0 and by[name]["decode_ms"] > 0
        assert by[name]["rows"] == 16 and by[name]["tokens"] > 0
    assert by["floor_static"]["decode_ms"] > 0
