"""The benchmarks' smoke modes run, so they cannot rot. Run: python -m pytest tests/test_bench.py"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_gpu_bench_cpu_mode_runs_every_kit_engine_and_the_floor():
    results = load("gpu").main(["--tiny", "--configs", "kit_compiled", "kit_hf", "floor_static"])
    by = {r["config"]: r for r in results}
    assert set(by) == {"kit_compiled", "kit_hf", "floor_static"}
    for name in ("kit_compiled", "kit_hf"):
        assert by[name]["step_s"] > 0 and by[name]["joint_actions_per_s"] > 0 and by[name]["decode_ms"] > 0
        assert by[name]["rows"] == 16 and by[name]["tokens"] > 0
    assert by["floor_static"]["decode_ms"] > 0


@pytest.mark.slow
def test_data_parallel_bench_tiny_mode_runs_one_and_two_processes_and_the_control():
    results = load("data_parallel").main(["--tiny", "--items", "2", "--steps", "1"])
    assert [(r["mode"], r["processes"]) for r in results] == [("kit", 1), ("kit", 2), ("independent", 2)]
    assert all(r["joint_actions_per_s"] > 0 and r["items"] == 2 for r in results)
    assert results[0]["speedup"] == 1.0


def test_games_bench_smoke_plays_the_same_games_batched_and_one_episode_at_a_time():
    rows = load("games").main(["--tiny"])
    assert [r["loop"] for r in rows] == ["batched", "naive"] and all(r["same_games"] for r in rows)
    assert rows[0]["decisions"] == rows[1]["decisions"] > 0 and rows[1]["speedup"] == 1.0


def test_tiny_seeds_runs_a_variant_and_reports_its_curve_and_advantages():
    row = load("tiny_seeds").run("num_steps=2,eval_every=1,batch_size=2,num_generations=2", seed=1)
    assert row["variant"].startswith("num_steps=2") and row["seed"] == 1
    assert [step for step, _ in row["evals"]] == [0, 1, 2]
    assert row["eval_end"] == pytest.approx(row["evals"][-1][1], abs=1e-3)  # the curve's values are rounded
    assert row["adv_end"] >= 0 and row["s_per_step"] > 0


def test_smol_table_pools_seeds_per_item_and_pairs_the_team_with_the_untrained_team(tmp_path, monkeypatch):
    """bench/smol.py's table from hand-made run folders (no model): per-item means over seeds, the paired
    difference against naive, the time split from the perf/ columns."""
    import json

    bench = load("smol")
    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(bench, "OUT", tmp_path)
    for seed, team in ((0, [2.0, 1.0]), (1, [1.0, 2.0])):
        run = tmp_path / "runs" / f"writing_s{seed}"
        (run / "eval").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"seed": seed}))
        rows = [{"step": 0, "eval/reward_mean": 1.0},
                {"step": 1, "perf/step_s": 10.0, "perf/generate_s": 6.0, "perf/sample_s": 7.0, "perf/update_s": 3.0,
                 "eval/reward_mean": 1.5 + seed}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        base = [{"method": "naive", "reward/mean": 0.5, "num_samples": 4, "per_item": {"reward": [0.5, 0.5]}},
                {"method": "magrpo", "reward/mean": 1.5, "num_samples": 4, "per_item": {"reward": team}}]
        (run / "eval" / "baselines.json").write_text(json.dumps(base))
    bench.table()
    text = (tmp_path / "smol.md").read_text()
    assert "| naive | 2 | 0.500 [0.500, 0.500] | 0.50, 0.50 |  |" in text
    assert "| magrpo (writing) | 2 | 1.500 [1.500, 1.500] | 1.50, 1.50 | +1.000 [+1.000, +1.000] vs naive |" in text
    assert "| writing s1 | 1 | 10.0 | 6.0 | 1.0 | 3.0 | 1.000 -> 2.500 |" in text
    assert (tmp_path / "smol_writing.png").exists()


def test_code_table_pairs_magrpo_with_the_trained_single_model_by_seed_and_problem(tmp_path, monkeypatch):
    """bench/code_table.py's table from hand-made run folders (no model): a row per method pooled over seeds, the
    single runs' rows as the single model's, paired differences of the same seed and problem, and a tuning run
    (`<row>-<tag>`) kept out of the table."""
    import json

    bench = load("code_table")
    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(bench, "KEPT", tmp_path / "kept")
    monkeypatch.setattr(bench, "OUT", tmp_path / "code_table.md")

    def row(correct, aux=(0.0, 0.0), wall=10.0):
        return {"num_samples": 4, "per_item": {"reward": [2.0, 1.0], "correct": list(correct), "aux_call": list(aux)},
                "cooperation_rate": 0.0, "wall_s": wall}

    for name, rows in (("mbpp_team_s41", {"naive": row([2, 0]), "magrpo": row([4, 2], wall=30.0)}),
                       ("mbpp_team_s42", {"naive": row([2, 0]), "magrpo": row([4, 2], wall=30.0)}),
                       ("mbpp_single_s41", {"naive": row([0, 0], (1.0, 1.0)), "magrpo": row([2, 2], (1.0, 0.5))}),
                       ("mbpp_single_s42", {"magrpo": row([2, 2], (1.0, 0.5))}),
                       ("mbpp_team-free_s900", {"magrpo": row([0, 0])})):
        run = tmp_path / "runs" / name
        (run / "eval").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"seed": 1}))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "perf/step_s": 120.0}) + "\n")
        (run / "eval" / "table.json").write_text(json.dumps({m: {"method": m, **r} for m, r in rows.items()}))
    text = bench.table()
    lines = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert ("| MAGRPO team | 41, 42 | 0.750 [0.500, 1.000] | 0.75, 0.75 | 1.000 [1.000, 1.000] |"
            in lines["| MAGRPO team"])
    assert "2.0 min/step, 2 min/seed" in lines["| MAGRPO team"]
    assert "| untrained single model | 41 | 0.000 [0.000, 0.000] |" in lines["| untrained single model"]
    assert "| 0.750 [0.500, 1.000] |" in lines["| trained single model (centralized)"]  # main calls its own aux
    assert "not run" in lines["| sequential (untrained)"]
    # MAGRPO minus the trained single model: problem 1 +0.5, problem 2 0.0 on both seeds; minus the untrained team
    # +0.5 on both problems and seeds
    assert ("| MAGRPO team minus the trained single model | 41, 42 | +0.250 [+0.000, +0.500] | +0.25, +0.25 |"
            in lines["| MAGRPO team minus the trained single model"])
    assert ("| MAGRPO team minus the untrained team | 41, 42 | +0.500 [+0.500, +0.500] |"
            in lines["| MAGRPO team minus the untrained team"])
    assert ("| trained single model minus the untrained one | 41 | +0.500 [+0.500, +0.500] |"  # 42: no naive row
            in lines["| trained single model minus the untrained one"])
    assert "900" not in text  # the tuning run


def _code_table_runs(tmp_path, monkeypatch, runs: dict, where: str = "runs"):
    import json

    bench = load("code_table")
    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(bench, "KEPT", tmp_path / "kept")
    monkeypatch.setattr(bench, "OUT", tmp_path / "code_table.md")
    for name, rows in runs.items():
        run = tmp_path / where / name
        (run / "eval").mkdir(parents=True)
        (run / "config.json").write_text(json.dumps({"seed": 1}))
        (run / "eval" / "table.json").write_text(json.dumps(
            {m: {"method": m, "num_samples": 4, "per_item": {"reward": [0.0] * len(c), "correct": list(c)},
                 "cooperation_rate": 0.0, "wall_s": 1.0} for m, c in rows.items()}))
    return bench


def test_code_table_pairs_by_seed_number_not_position(tmp_path, monkeypatch):
    """The team has seeds 41, 42, 43 and the single model 42, 43: only 42 and 43 are paired, each with its own."""
    bench = _code_table_runs(tmp_path, monkeypatch, {
        "mbpp_team_s41": {"magrpo": [0, 0], "naive": [0, 0]},
        "mbpp_team_s42": {"magrpo": [4, 4], "naive": [0, 0]},
        "mbpp_team_s43": {"magrpo": [4, 4], "naive": [0, 0]},
        "mbpp_single_s42": {"magrpo": [4, 4]},
        "mbpp_single_s43": {"magrpo": [4, 4]}})
    lines = {line.split(" | ")[0]: line for line in bench.table().splitlines() if line.startswith("| ")}
    assert ("| MAGRPO team minus the trained single model | 42, 43 | +0.000 [+0.000, +0.000] |"
            in lines["| MAGRPO team minus the trained single model"])


def test_code_table_reads_the_archive_of_a_run_here_without_rows(tmp_path, monkeypatch):
    """A run folder here that is training again (no eval/table.json yet) does not hide its archived rows."""
    bench = _code_table_runs(tmp_path, monkeypatch, {"table_mbpp_team_s41": {"magrpo": [4, 0]}}, where="kept")
    (tmp_path / "runs" / "mbpp_team_s41").mkdir(parents=True)
    assert bench.load()[("mbpp", "team")].keys() == {41}


def test_code_table_cost_leaves_out_a_step_paused_for_the_suite():
    """A step over 4x its run's median was paused (kill -STOP): out of the minutes a step, and a seed's minutes
    are its other steps' mean times its steps."""
    bench = load("code_table")
    steps = [60.0, 60.0, 120.0, 3000.0]
    runs = {41: {"metrics": [{"step": k, "perf/step_s": s} for k, s in enumerate(steps)],
                 "precision": [{"dtype": "float32", "device": "cpu"}]}}
    assert bench.cost(runs) == ("1.3 min/step, 5 min/seed (3 steps, 1 paused left out; float32 on cpu, HF generate)")


@pytest.mark.slow
@pytest.mark.parametrize("row", ["team", "single"])
def test_code_table_trains_a_row_and_samples_it_on_every_held_out_problem(row, tmp_path, monkeypatch):
    """bench/code_table.py's own path, with the tiny model in the presets' place: a run trains from the preset (the
    single row: algorithm=centralized), resumes finished, and its rows are the newest checkpoint (`magrpo`) and the
    untrained base (`naive`) on all 32 held-out MBPP problems, each kept in eval/table.json and not sampled again."""
    import json

    bench = load("code_table")
    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(bench, "KEPT", tmp_path / "kept")
    extra = ["model_name=tiny", "max_new_tokens=6", "num_generations=2", "reward_workers=1"]
    path = bench.train("mbpp", row, 7, 2, extra)
    assert json.loads((path / "config.json").read_text())["algorithm"] == ("centralized" if row == "single" else
                                                                           "magrpo")
    assert bench.train("mbpp", row, 7, 2, extra) == path  # finished: resumes and trains no more
    assert [json.loads(line)["step"] for line in open(path / "metrics.jsonl")] == [1, 2]
    rows = {r["method"]: r for r in bench.evaluate(path, ["magrpo", "naive"], n=2)}
    assert rows["magrpo"]["step"] == 2 and "step" not in rows["naive"]
    for r in rows.values():
        assert len(r["per_item"]["correct"]) == 32 and r["num_samples"] == 2 and "aux_call" in r["per_item"]
    kept = (path / "eval" / "table.json").read_text()
    assert bench.evaluate(path, ["magrpo", "naive"], n=2) and (path / "eval" / "table.json").read_text() == kept
    assert (bench.archive(path) / "eval" / "table.json").read_text() == kept


def _table_rows(tmp_path, monkeypatch, runs: dict):
    """Run folders whose rows are given whole: {name: {method: {"per_item": ..., other fields}}}."""
    import json

    bench = load("code_table")
    monkeypatch.setattr(bench, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(bench, "KEPT", tmp_path / "kept")
    monkeypatch.setattr(bench, "OUT", tmp_path / "code_table.md")
    for name, rows in runs.items():
        (tmp_path / "runs" / name / "eval").mkdir(parents=True)
        (tmp_path / "runs" / name / "config.json").write_text("{}")
        (tmp_path / "runs" / name / "eval" / "table.json").write_text(json.dumps(
            {m: {"method": m, "num_samples": 4, "cooperation_rate": 0.0, "wall_s": 1.0, **r} for m, r in rows.items()}))
    return bench


def _row(correct, reward=None, aux=None, **fields):
    return {"per_item": {"correct": correct, "reward": reward or [0.0] * len(correct),
                         "aux_call": aux or [0.0] * len(correct)}, **fields}


def _lines(bench) -> dict:
    return {line.split(" | ")[0]: line for line in bench.table().splitlines() if line.startswith("| ")}


def test_code_table_pairs_each_seed_with_its_own_seed(tmp_path, monkeypatch):
    bench = _table_rows(tmp_path, monkeypatch, {
        "mbpp_team_s41": {"magrpo": _row([4, 4])}, "mbpp_team_s42": {"magrpo": _row([0, 0])},
        "mbpp_single_s41": {"magrpo": _row([4, 4])}, "mbpp_single_s42": {"magrpo": _row([0, 0])}})
    line = _lines(bench)["| MAGRPO team minus the trained single model"]
    assert "| 41, 42 | +0.000 [+0.000, +0.000] | +0.00, +0.00 |" in line


def test_code_table_columns_are_in_the_headers_order(tmp_path, monkeypatch):
    """Distinct values per metric: pass@1 0.5, pass@4 1, reward 0.9, main calls aux 0.1, cooperation paid 0.5."""
    bench = _table_rows(tmp_path, monkeypatch, {
        "mbpp_team_s41": {"magrpo": _row([2, 2], [0.9, 0.9], [0.1, 0.1], cooperation_rate=0.5)},
        "mbpp_team_s42": {"naive": _row([0, 0])},
        "mbpp_single_s41": {"magrpo": _row([0, 0], [0.2, 0.2], [0.6, 0.6])}})
    lines = _lines(bench)
    assert lines["| MAGRPO team"].startswith(
        "| MAGRPO team | 41 | 0.500 [0.500, 0.500] | 0.50 | 1.000 [1.000, 1.000] | 0.900 [0.900, 0.900] | "
        "0.100 [0.100, 0.100] | 0.500 |")
    assert lines["| MAGRPO team minus the trained single model"] == (
        "| MAGRPO team minus the trained single model | 41 | +0.500 [+0.500, +0.500] | +0.50 | "
        "+1.000 [+1.000, +1.000] | +0.700 [+0.700, +0.700] | -0.500 [-0.500, -0.500] |")
    assert lines["| MAGRPO team minus the untrained team"] == (  # seed 42 has no MAGRPO row
        "| MAGRPO team minus the untrained team | - | - | - | - | - | - |")


def test_code_table_has_no_pass_at_4_from_fewer_than_4_samples(tmp_path, monkeypatch):
    bench = _table_rows(tmp_path, monkeypatch, {"mbpp_team_s41": {"magrpo": _row([1, 2], num_samples=2)}})
    assert "| MAGRPO team | 41 | 0.750 [0.500, 1.000] | 0.75 | - |" in _lines(bench)["| MAGRPO team"]


def test_code_table_schemes_are_weighted_by_passing_programs():
    bench = load("code_table")
    runs = {1: {"rows": {"m": {"num_passing": 3, "schemes/passing": {"a": 1.0}}}},
            2: {"rows": {"m": {"num_passing": 1, "schemes/passing": {"b": 1.0}}}}}
    assert bench.schemes_cell(runs, "m") == "4 passing: a 75%, b 25%"


@pytest.mark.parametrize("runs", [
    {"mbpp_team_s1": {"magrpo": _row([4, 0, 0])}, "mbpp_team_s2": {"magrpo": _row([4, 0])}},  # two seeds
    {"mbpp_team_s1": {"magrpo": _row([4, 0, 0])}, "mbpp_single_s1": {"magrpo": _row([4])}},  # team and single
    {"mbpp_team_s1": {"magrpo": _row([4, 0, 0])}, "mbpp_single_s1": {"magrpo": _row([4, 0])}}])
def test_code_table_refuses_rows_over_different_problems(runs, tmp_path, monkeypatch):
    """A difference of rows over other problems would pair nothing (or broadcast one problem over all)."""
    bench = _table_rows(tmp_path, monkeypatch, runs)
    with pytest.raises(ValueError, match="same held-out problems"):
        bench.table()
