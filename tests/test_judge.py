"""The LLM judge against a local server that speaks the Messages API: the real anthropic client, no network.

Run: python -m pytest tests/test_judge.py
"""

import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("anthropic")

from kit.judge.judge import PRICES, SCORE_SYSTEM, Budget, Judge, parse_score, price_of  # noqa: E402
from kit.tasks.rewards import JudgeReward  # noqa: E402

KEY = "test-key-" + secrets.token_hex(16)  # made per run: no key-shaped literal in the repository
MODEL = "claude-haiku-4-5"  # $1 / $5 per million tokens


class FakeMessages(BaseHTTPRequestHandler):
    """Behaviour by a marker in the prompt: [429] once then OK, [500] always, [slow] 2 s, [hang] 8 s, [junk] bad
    JSON."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        prompt = body["messages"][0]["content"]
        server = self.server
        with server.lock:
            server.requests.append({"prompt": prompt, "headers": dict(self.headers)})
            seen = server.seen.get(prompt, 0)
            server.seen[prompt] = seen + 1
        if "[429]" in prompt and seen == 0:
            return self._send(429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
                              {"retry-after": "0"})
        if "[500]" in prompt:
            return self._send(500, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
        if "[slow]" in prompt:
            time.sleep(2.0)
        if "[hang]" in prompt:
            time.sleep(8.0)
            server.replied.append(prompt)  # after the client's timeout: it must have given up before this
        if "[junk]" in prompt:
            return self._send(200, b"{this is not json")
        text = "Looks fine.\nSCORE: 7" if "[noscore]" not in prompt else "I cannot say."
        usage = {"input_tokens": server.input_tokens, "output_tokens": server.output_tokens}
        self._send(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                         "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                         "stop_sequence": None, "usage": usage})

    def _send(self, status, payload, headers=None):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeMessages)
    srv.lock, srv.requests, srv.seen, srv.replied = threading.Lock(), [], {}, []
    srv.handle_error = lambda request, address: None  # a reply to a client that was killed: a broken pipe, no news
    srv.input_tokens, srv.output_tokens = 100, 20
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()


def make_judge(tmp_path, server, log=None, **kw):
    kw.setdefault("budget_usd", 1.0)
    kw.setdefault("max_tokens", 64)
    kw.setdefault("timeout", 5.0)
    kw.setdefault("max_retries", 2)
    return Judge(tmp_path, MODEL, api_key=KEY, base_url=server.url, log=log or (lambda *_: None), **kw)


def test_a_normal_reply_is_scored_and_its_cost_written_to_the_ledger(tmp_path, server):
    judge = make_judge(tmp_path, server)
    assert judge.score("be good", "hello") == pytest.approx(0.7)
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["spent_usd"] == pytest.approx((100 * 1.0 + 20 * 5.0) / 1e6)
    assert ledger["calls"] == 1 and ledger["input_tokens"] == 100 and ledger["output_tokens"] == 20
    assert any(KEY in v for v in server.requests[0]["headers"].values())  # the key goes to the API only


def test_identical_requests_are_served_from_the_cache(tmp_path, server):
    judge = make_judge(tmp_path, server)
    assert judge.score("r", "same text") == judge.score("r", "same text")
    assert len(server.requests) == 1 and judge.budget.calls == 1


def test_rate_limit_is_retried_then_succeeds(tmp_path, server):
    judge = make_judge(tmp_path, server)
    assert judge.score("r", "[429] text") == pytest.approx(0.7)
    assert len(server.requests) == 2 and judge.budget.calls == 1


def test_server_errors_leave_the_item_unscored_and_cost_nothing(tmp_path, server):
    said = []
    judge = make_judge(tmp_path, server, log=said.append, max_retries=1)
    assert judge.score("r", "[500] text") is None
    assert len(server.requests) == 2 and judge.budget.spent == 0.0
    assert any("unscored" in line for line in said)


def test_a_reply_slower_than_the_timeout_is_unscored_quickly(tmp_path, server):
    judge = make_judge(tmp_path, server, timeout=0.3, max_retries=0)
    assert judge.score("r", "[hang] text") is None
    # given up at its 0.3 s timeout, before the server's reply (8 s later): judged by the order of events, not a clock
    assert any("[hang]" in r["prompt"] for r in server.requests) and server.replied == []
    assert 0 < judge.budget.spent <= judge.budget.cap  # billing unknown: the worst case is counted


def test_malformed_json_and_a_reply_without_a_score_are_unscored_not_a_crash(tmp_path, server):
    judge = make_judge(tmp_path, server, max_retries=0)
    assert judge.score("r", "[junk] text") is None
    assert judge.score("r", "[noscore] text") is None


def test_the_cap_is_never_exceeded_under_8_concurrent_callers(tmp_path, server):
    said = []
    judge = make_judge(tmp_path, server, log=said.append, budget_usd=0.01, max_tokens=100)
    worst = judge.worst_case_usd("x" * 200, "y" * 200)
    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda i: judge.score("rubric", f"text number {i}"), range(80)))
    billed = len(server.requests) * (100 * 1.0 + 20 * 5.0) / 1e6  # what the server charged, from its usage
    assert judge.budget.spent <= 0.01 and billed <= 0.01
    assert 0 < sum(s is not None for s in scores) < 80 and worst < 0.01
    assert sum("cap reached" in line for line in said) == 1  # said once
    assert any("80%" in line for line in said)
    assert json.loads((tmp_path / "budget.json").read_text())["spent_usd"] <= 0.01


def test_a_restarted_run_continues_the_ledger(tmp_path, server):
    first = make_judge(tmp_path, server)
    first.score("r", "one")
    spent = first.budget.spent
    again = make_judge(tmp_path, server)
    assert again.budget.spent == pytest.approx(spent)
    again.score("r", "two")
    assert again.budget.spent == pytest.approx(2 * spent) and again.budget.calls == 2
    over = make_judge(tmp_path, server, budget_usd=spent)  # the cap already reached: no more calls
    assert over.score("r", "three") is None and len(server.requests) == 2


def test_without_a_key_the_judge_is_off_with_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    said = []
    judge = Judge(tmp_path, MODEL, log=said.append)
    assert not judge.enabled and judge.score("r", "t") is None and len(said) == 1
    reward = JudgeReward(judge, "r")({"id": "x"}, ("a", "b"))
    assert reward.total == 0.0 and reward.parts["judge_unscored"] == 1.0


@pytest.mark.parametrize("reply, score", [
    ("SCORE: 7", 0.7), ("score = 8/10", 0.8), ("**Score:** 9", 0.9), ("SCORE: 3\nSCORE: 6", 0.6),
    ('{"score": 5}', 0.5), ("SCORE: 12", 1.0), ("SCORE: 4/5", 0.8), ("no number here", None), ("", None),
])
def test_parse_score(reply, score):
    assert parse_score(reply) == (pytest.approx(score) if score is not None else None)


def test_prices_live_in_one_table_and_unknown_models_are_refused():
    assert price_of("claude-sonnet-4-5-20250929") == PRICES["claude-sonnet-4"]
    with pytest.raises(ValueError, match="no price"):
        price_of("gpt-4o")
    with pytest.raises(ValueError, match=">= 0"):
        Budget("/tmp/x.json", -1)


def test_the_key_never_reaches_any_file_of_a_training_run(tmp_path, server, monkeypatch):
    """A tiny run with the judge as a reward and code-task expert feedback: grep every file it wrote."""
    from kit.run.config import load_config
    from kit.trainers.trainer import Trainer

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    said = []
    cfg = load_config("tiny_cpu", overrides=[
        f"run_dir={tmp_path / 'run'}", "progress=false", "task=code", "task_args={dataset: coop}", "num_steps=2",
        "batch_size=1", "num_generations=2", "max_new_tokens=8", "num_turns=2", "eval_every=1",
        "num_eval_items=1", f"judge_model={MODEL}", "judge_budget_usd=0.01", "use_judge_reward=true",
        "judge_feedback=true", "save_every=1"])
    trainer = Trainer(cfg, log=said.append)
    trainer.train()
    trainer.close()
    assert len(server.requests) > 0 and (tmp_path / "run" / "budget.json").exists()
    rollouts = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert any("Expert feedback:" in p for r in rollouts if r["turn"] == 1 for p in r["prompts"])
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert not any(KEY in str(line) for line in said)


def _spend_until_refused(path, cap, results):
    budget = Budget(path, cap, log=lambda *_: None)
    calls = 0
    while budget.reserve(0.003):  # worst case 0.003, real cost 0.001
        time.sleep(0.001)
        budget.settle(0.003, 0.001)
        calls += 1
    results.put(calls)


def test_the_cap_holds_for_a_run_spread_over_two_processes(tmp_path):
    """Data-parallel training scores on every process: two ledgers of the same run must not each spend the cap."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    workers = [ctx.Process(target=_spend_until_refused, args=(tmp_path / "budget.json", 0.05, results))
               for _ in range(2)]
    for w in workers:
        w.start()
    calls = [results.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(timeout=10)
    assert all(c > 0 for c in calls)  # both processes used the judge
    assert 0.05 - 0.003 <= sum(calls) * 0.001 <= 0.05  # together: up to the cap, never past it
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["calls"] == sum(calls) and ledger["spent_usd"] == pytest.approx(sum(calls) * 0.001)
    assert ledger["reserved_usd"] == {}


def test_after_failures_in_a_row_the_judge_is_off_for_the_cooldown_with_one_line(tmp_path, server):
    said = []
    judge = make_judge(tmp_path, server, log=said.append, max_retries=0, max_failures=2, cooldown_s=0.3)
    assert [judge.score("r", f"[500] {i}") for i in range(6)] == [None] * 6
    assert len(server.requests) == 2  # the third call and later ones never went out
    assert sum("off for 0.3 s" in line for line in said) == 1
    time.sleep(0.4)  # the cooldown is over: the next call tries again
    assert judge.score("r", "fine now") == pytest.approx(0.7) and len(server.requests) == 3
    assert judge.score("r", "[500] once more") is None and len(server.requests) == 4  # one failure: still on


def test_the_ledger_counts_http_requests_and_billed_calls_apart(tmp_path, server):
    judge = make_judge(tmp_path, server, max_retries=1)
    judge.score("r", "[429] retried once")  # 2 requests, 1 billed call
    judge.score("r", "[500] always")  # 2 requests, an error status: not billed
    judge.score("r", "plain")  # 1 request, billed
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert (ledger["calls"], ledger["requests"], ledger["billed_calls"], ledger["failed_calls"]) == (3, 5, 2, 1)
    assert len(server.requests) == 5


def _score_then_hang(run_dir, url):
    Judge(run_dir, MODEL, budget_usd=1.0, max_tokens=64, timeout=30, max_retries=0, api_key=KEY, base_url=url,
          log=lambda *_: None).score("r", "[slow] in flight when the process dies")


def test_a_process_killed_with_a_call_in_flight_is_charged_its_worst_case(tmp_path, server):
    import multiprocessing

    proc = multiprocessing.get_context("fork").Process(target=_score_then_hang, args=(tmp_path, server.url))
    proc.start()
    for _ in range(600):  # until the request has reached the API
        if server.requests:
            break
        time.sleep(0.01)
    proc.kill()
    proc.join()
    judge = make_judge(tmp_path, server)
    worst = judge.worst_case_usd(SCORE_SYSTEM, server.requests[0]["prompt"])
    assert judge.budget.spent == pytest.approx(worst) and judge.budget.reservations == {}
    ledger = json.loads((tmp_path / "budget.json").read_text())  # charged on disk, once
    assert ledger["spent_usd"] == pytest.approx(worst) and ledger["crashed_usd"] == pytest.approx(worst)
    assert make_judge(tmp_path, server).budget.spent == pytest.approx(worst)


def test_a_reservation_of_a_reused_pid_on_another_boot_is_not_mistaken_for_a_live_one(tmp_path):
    import os

    from kit.judge.judge import _me

    (tmp_path / "budget.json").write_text(json.dumps({"spent_usd": 0.0, "reserved_usd": {
        _me(): 0.001, f"{os.getpid()}:deadbeef:1": 0.002}}))
    budget = Budget(tmp_path / "budget.json", 1.0)
    assert budget.spent == pytest.approx(0.002) and list(budget.reservations) == [_me()]


def test_the_failure_policy_config_fields_reach_the_judge(tmp_path, monkeypatch):
    from kit.run.config import load_config
    from kit.tasks.rewards import reward_model_for
    from kit.tasks.toy import DigitSum

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    cfg = load_config("tiny_cpu", overrides=[f"run_dir={tmp_path}", f"judge_model={MODEL}", "use_judge_reward=true",
                                             "judge_timeout_s=7", "judge_max_retries=1", "judge_max_failures=4",
                                             "judge_cooldown_s=9"])
    judge = reward_model_for(cfg, DigitSum(), log=lambda *_: None).funcs[-1].judge
    assert (judge.client.timeout, judge.client.max_retries, judge.max_failures, judge.cooldown_s) == (7, 1, 4, 9)
