"""Judge pairs (kit/judge/pairs.py): both orders, ties on disagreement, the same budget, ledger and cache as the
judge's scores; through the real anthropic client against a local Messages server, and through the rule oracle.

Run: python -m pytest tests/test_judge_pairs.py      (a few seconds; no network, no key)
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("anthropic")

from kit.judge.judge import Judge  # noqa: E402
from kit.judge.pairs import (JudgePreference, both_orders, judged_pairs, oracle_judge,  # noqa: E402
                             parse_preference)

GOOD, BAD = ("a fine summary", "a longer and careful summary"), ("x", "y")


def longer(completions) -> float:
    return float(sum(len(c) for c in completions))


def test_the_last_prefer_line_is_the_verdict():
    assert parse_preference("A reads better.\nPREFER: A") == 1
    assert parse_preference("prefer: b") == -1
    assert parse_preference("PREFER: A\n...on reflection\nPREFER: TIE") == 0
    assert parse_preference("I like A") is None and parse_preference(None) is None


def test_both_orders_must_agree_else_a_tie():
    assert both_orders(1, -1) == 1  # a first: A; b first: B (= a again)
    assert both_orders(-1, 1) == -1
    assert both_orders(1, 1) == 0  # "A" whatever is shown first: position bias, no pair
    assert both_orders(0, 0) == 0
    assert both_orders(None, -1) is None


def test_a_verdict_in_one_order_and_a_tie_in_the_other_is_a_tie():
    """Issue 41: a preference counts only when both orders state it; one order's tie makes the pair a tie (0),
    whichever order it is and whichever answer the other order prefers."""
    assert both_orders(1, 0) == 0  # a first: A (a); b first: tie
    assert both_orders(0, -1) == 0  # a first: tie; b first: B (a)
    assert both_orders(-1, 0) == 0  # a first: B (b); b first: tie
    assert both_orders(0, 1) == 0  # a first: tie; b first: A (b)


def test_the_oracle_prefers_the_better_answer_in_both_orders_and_pays_two_calls(tmp_path):
    judge = oracle_judge(tmp_path, longer, log=lambda *_: None)
    prefer = JudgePreference(judge, "longer is better")
    assert prefer(GOOD, BAD) == 1 and prefer(BAD, GOOD) == -1
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["calls"] == 2  # (GOOD, BAD) asked in both orders; (BAD, GOOD) is the same two requests: cached
    assert ledger["spent_usd"] > 0 and judge.client.messages.calls == 2


def test_a_judge_with_only_position_bias_gives_no_pairs(tmp_path):
    prefer = JudgePreference(oracle_judge(tmp_path, longer, bias="A", log=lambda *_: None), "r")
    assert prefer(GOOD, BAD) == 0
    assert judged_pairs(3, lambda i, j: prefer([GOOD, BAD, GOOD][i], [GOOD, BAD, GOOD][j])) == []


def test_judge_pairs_stop_at_the_budget_cap(tmp_path):
    """haiku-4-5 at $1/$5 per million: the worst case of one request (its bytes + 16 output tokens) is about
    $0.0004; a $0.001 cap lets two requests out, so the third comparison's requests are refused."""
    judge = oracle_judge(tmp_path, longer, budget_usd=0.001, log=lambda *_: None)
    prefer = JudgePreference(judge, "r" * 200)
    verdicts = [prefer(GOOD, (f"{k}", "")) for k in range(4)]
    assert verdicts[0] == 1 and None in verdicts
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["spent_usd"] <= 0.001 and judge.stopped


def test_judged_pairs_in_order_stop_at_the_requested_number():
    """Scores [0.1, 0.9, 0.5]: (0,1) -> (1,0), (0,2) -> (2,0), (1,2) -> (1,2); with 2 wanted, (1,2) is never asked."""
    scores, asked = [0.1, 0.9, 0.5], []

    def prefer(i, j):
        asked.append((i, j))
        return int(np.sign(scores[i] - scores[j]))

    assert judged_pairs(3, prefer, "all") == [(1, 0), (2, 0), (1, 2)]
    asked.clear()
    assert judged_pairs(3, prefer, "all", 2) == [(1, 0), (2, 0)] and asked == [(0, 1), (0, 2)]
    shuffled = judged_pairs(3, prefer, "random", None, np.random.default_rng(3))
    assert sorted(shuffled) == [(1, 0), (1, 2), (2, 0)]
    with pytest.raises(ValueError, match="reward_gap"):
        judged_pairs(3, prefer, "reward_gap")


class PreferServer(BaseHTTPRequestHandler):
    """A Messages API that prefers the answer holding 'careful', or says nothing usable for '[mute]'."""

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        prompt = body["messages"][0]["content"]
        with self.server.lock:
            self.server.prompts.append(prompt)
        a = prompt.split("Answer A:")[1].split("Answer B:")[0]
        text = "hmm" if "[mute]" in prompt else ("PREFER: A" if "careful" in a else "PREFER: B")
        data = json.dumps({"id": "m", "type": "message", "role": "assistant", "model": body["model"],
                           "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                           "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 20}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), PreferServer)
    srv.lock, srv.prompts = threading.Lock(), []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_through_the_anthropic_client_each_order_is_one_priced_request(tmp_path, server):
    judge = Judge(tmp_path, "claude-haiku-4-5", 1.0, max_tokens=64, api_key="test-key",
                  base_url=f"http://127.0.0.1:{server.server_address[1]}", log=lambda *_: None)
    prefer = JudgePreference(judge, "careful is better")
    assert prefer(GOOD, BAD) == 1
    assert prefer(BAD + ("[mute]",), GOOD) is None  # no verdict: unscored, not a tie
    first, second = server.prompts[:2]
    assert first.index("a fine summary") < first.index("\nx") and second.index("\nx") < second.index("a fine")
    ledger = json.loads((tmp_path / "budget.json").read_text())
    assert ledger["calls"] == 4 and ledger["spent_usd"] == pytest.approx(4 * (100 * 1.0 + 20 * 5.0) / 1e6)


def test_the_oracle_scores_one_text_as_the_judge_would(tmp_path):
    judge = oracle_judge(tmp_path, longer, score_max=40.0, log=lambda *_: None)
    assert judge.score("r", "[agent 0]\nabcd\n\n[agent 1]\nef") == pytest.approx(0.15)  # 6 characters of 40


def test_the_oracle_reads_empty_answers(tmp_path):
    prefer = JudgePreference(oracle_judge(tmp_path, longer, log=lambda *_: None), "r")
    assert prefer(("", ""), ("", "9")) == -1 and prefer(("", ""), ("", "")) == 0
