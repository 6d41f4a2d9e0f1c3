"""Every numbered notebook runs top to bottom (KIT_SMOKE=1, Colab-only cells dropped), and is committed clean.

Run: python -m pytest tests/test_notebooks.py      (slow: a kernel per notebook)
"""

import os
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_the_eight_notebooks_exist_and_are_committed_without_outputs():
    assert [p.name[:2] for p in NOTEBOOKS] == ["00", "01", "02", "03", "04", "05", "06", "07"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert "colab-badge.svg" in nb.cells[0].source, path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name} has outputs"


def test_notebooks_match_their_generator(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "notebooks"))
    try:
        import build_notebooks
    finally:
        sys.path.pop(0)
    monkeypatch.setattr(build_notebooks, "HERE", tmp_path)
    build_notebooks.build()
    for path in NOTEBOOKS:
        assert (tmp_path / path.name).read_text() == path.read_text(), \
            f"{path.name} differs from notebooks/build_notebooks.py: edit the script and run it"


def test_only_colab_tagged_cells_touch_install_or_drive_mounting():
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            tags = cell.metadata.get("tags", [])
            if "pip install" in cell.source or "mount_drive" in cell.source or "flush_drive" in cell.source:
                assert "colab" in tags, f"{path.name}: {cell.source[:60]!r} must be tagged colab"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom_in_smoke_mode(path, tmp_path_factory, monkeypatch):
    from nbclient import NotebookClient

    smoke_dir = tmp_path_factory.getbasetemp() / "smoke_run"  # shared: made once by the first notebook
    monkeypatch.setenv("KIT_SMOKE", "1")
    monkeypatch.setenv("KIT_SMOKE_DIR", str(smoke_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if "colab" not in c.metadata.get("tags", [])]
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if path.name.startswith("00"):
        assert "PASS: tiny_cpu" in text
    if path.name.startswith("06"):  # the game's own baselines, and the trained team, on the same deals
        assert "| random |" in text or "baseline random" in text
    if path.name.startswith("07"):  # the report's sections, shown with its figures
        assert "## The run" in text or any("## The run" in o.get("data", {}).get("text/markdown", "")
                                           for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    if path.name[:2] in ("01", "02", "03", "04", "06", "07"):  # figures render as images, not "<Figure ...>"
        assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert os.environ["KIT_SMOKE"] == "1"
