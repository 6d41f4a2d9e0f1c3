"""An environment class defined in a notebook cell (issue 52): given as TRL takes it (`environment=MyEnv`), held in
the config as "__main__:MyEnv", sent by value to the environment's child process, resumed from the notebook.

Run: python -m pytest tests/test_notebook_environment.py
"""

import json
import os
from pathlib import Path

import nbformat
import pytest

from kit.sandbox.envclass import spec_of
from kit.sandbox.envhost import EnvHost, EnvironmentClassError

ROOT = Path(__file__).resolve().parents[1]

CELLS = [
    "import os, random\nfrom kit.run.config import from_dict, load_config, validate\n"
    "from kit.tasks.environments import key_rows\nfrom kit.trainers.trainer import Trainer",
    # a constant and a helper of the notebook that the class uses: they travel with it
    "BONUS = 0.25\n\ndef half(key):\n    return key[:3]",
    "class Guess:\n"
    "    \"\"\"Guess the key's first half.\"\"\"\n\n"
    "    def reset(self, **row):\n"
    "        self.key, self.said = row['key'], None\n"
    "        return 'Guess the first three digits.'\n\n"
    "    def say(self, digits: str) -> str:\n"
    "        \"\"\"Say the digits.\n\n        Args:\n            digits: three digits\n        \"\"\"\n"
    "        self.said = digits\n"
    "        return f'said by {os.getpid()}'\n\n"
    "    def nap(self, seconds: float) -> str:\n"
    "        \"\"\"Sleep.\n\n        Args:\n            seconds: how long\n        \"\"\"\n"
    "        import time\n        time.sleep(seconds)\n        return 'woke'\n\n"
    "    def get_reward(self) -> float:\n"
    "        return BONUS + (1.0 if self.said == half(self.key) else 0.0) + random.random() * 0",
    "from kit.sandbox.envhost import EnvHost\n"
    "host = EnvHost(Guess, timeout_s=5)\n"
    "host.reset([{'key': '123456'}])\n"
    "print('NAP', host.call(0, 'nap', {'seconds': 60}), 'RESTARTS', host.restarts)  # past the limit: a new child\n"
    "print('CALL', host.call(0, 'say', {'digits': '123'}), 'KERNEL', os.getpid(), 'REWARD', host.rewards([0]))\n"
    "host.close()\n"
    "cfg = load_config('tiny_cpu')\ncfg.environment = Guess\nprint('SET', validate(cfg).environment)",
    "rows = key_rows(os.environ['KIT_TEST_DIR'] + '/rows.jsonl', 6)\n"
    "def cfg():\n"
    "    values = {'run_dir': os.environ['KIT_TEST_DIR'] + '/run', 'progress': False, 'task': 'rows',\n"
    "              'task_args': {'file': str(rows), 'num_eval': 2, 'roles': ['left', 'right']},\n"
    "              'environment': Guess, 'max_tool_calls': 1, 'max_new_tokens': 8, 'num_steps': 2, 'save_every': 1,\n"
    "              'batch_size': 1, 'num_generations': 2, 'eval_every': 0}\n"
    "    return validate(from_dict(values, load_config('tiny_cpu')))\n"
    "first = Trainer(cfg(), log=lambda *_: None)\nfirst.train(max_steps=1)\nfirst.close()\n"
    "again = Trainer(cfg(), resume=True, log=lambda *_: None)\nagain.train()\nagain.close()\n"
    "print('SPEC', cfg().environment)",
    # hints as strings (a notebook keeps the future import for every later cell) name types the code never uses
    "from __future__ import annotations\nfrom typing import Optional",
    "class Later:\n"
    "    def reset(self, **row):\n        return None\n\n"
    "    def pick(self, n: Optional[int] = None) -> str:\n"
    "        \"\"\"Pick.\n\n        Args:\n            n: which\n        \"\"\"\n"
    "        return str(n)\n\n"
    "late = EnvHost(Later, timeout_s=10)\nprint('LATER', late.tools['pick']['function']['parameters'])\nlate.close()",
]


@pytest.mark.slow
def test_a_class_defined_in_a_notebook_cell_trains_and_resumes_from_the_notebook(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("KIT_TEST_DIR", str(tmp_path))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.outputs)
    assert not [o for c in nb.cells for o in c.outputs if o.output_type == "error"], text
    call, kernel = text.split("CALL ")[1].split(" KERNEL ")
    assert call.startswith("said by ") and call.split()[2] != kernel.split()[0]  # the tool ran in a child process
    assert "REWARD [1.25]" in text  # the class's notebook constant and helper went with it
    assert "timed out" in text and "RESTARTS 1" in text  # the restarted child got the class by value again
    assert "SET __main__:Guess" in text  # a class set on a config, then validated
    assert "LATER {'type': 'object', 'properties': {'n': {'type': 'integer'" in text
    assert "SPEC __main__:Guess" in text
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["environment"] == "__main__:Guess"
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]  # one step, then the resumed one
    assert all(m["reward/environment"] >= 0.25 for m in metrics)  # get_reward ran: BONUS is its floor
    with pytest.raises(EnvironmentClassError, match="run the cell that defines it first"):
        EnvHost(saved["environment"])  # outside the notebook the class is not defined: said, with what to do
    # ... but the run kept the class by value (Colab sixth pass, item 6): 02-07 reopen the run without its cell
    import sys

    from kit.sandbox.envclass import CLASS_FILE, restore_from_run

    assert (tmp_path / "run" / CLASS_FILE).exists()
    said = []
    monkeypatch.setattr(sys.modules["__main__"], "Guess", None, raising=False)  # undone after the test
    monkeypatch.delattr(sys.modules["__main__"], "Guess")
    restore_from_run(saved["environment"], tmp_path / "run", log=said.append)
    assert "using the copy the run kept" in said[0]
    host = EnvHost(saved["environment"], timeout_s=10)
    try:
        host.reset([{"key": "123456"}])
        assert host.call(0, "say", {"digits": "123"}).startswith("said by") and host.rewards([0]) == [1.25]
    finally:
        host.close()


def test_a_class_is_held_as_its_module_and_name():
    from kit.run.config import ConfigError, from_dict, load_config, validate
    from kit.tasks.environments import KeyHalves

    assert spec_of(KeyHalves) == "kit.tasks.environments:KeyHalves"
    assert validate(from_dict({"environment": KeyHalves}, load_config("tiny_cpu"))).environment == \
        "kit.tasks.environments:KeyHalves"

    def inner():
        class Local:
            def reset(self, **row):
                return None
        return Local

    with pytest.raises(ConfigError, match="top level"):
        from_dict({"environment": inner()}, load_config("tiny_cpu"))
    with pytest.raises(ConfigError, match="give a class"):
        from_dict({"environment": 3}, load_config("tiny_cpu"))


def test_a_notebook_class_that_is_not_defined_is_said_before_the_model_loads(tmp_path, monkeypatch):
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    def load(*_, **__):
        raise AssertionError("the model was loaded before the missing class was said")

    monkeypatch.setattr("kit.engine.models.build_team", load)
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path}", "environment=__main__:NotHere", "task=toy"])
    with pytest.raises(EnvironmentClassError, match="no class 'NotHere' is defined here: run the cell"):
        Trainer(cfg, log=lambda *_: None)
