"""A cost model from servers' own timings (``calibrate --server``): the numbers a server reports become the cost
model's parts exactly (a local stand-in that reports known timings), and against live llama-servers the cost
file works with ``plan`` on a trace taken from the same servers, with llama-server's drafting policy."""

from __future__ import annotations

import numpy as np
import pytest
from local_servers import FakeServer

from cactus_theory._servers._calibrate import calibrate_server
from cactus_theory.plan import load_cost

pytestmark = [pytest.mark.servers]

VOCAB, EMBD, PARAMS = 1000, 64, 640_000  # the unembedding's share of a decode step: 1000 * 64 / 640000 = 0.1


def _llama_like(decode_ms, per_token_ms, base_ms, slots=2):
    """A server answering as llama-server, with timings: decode_ms per generated token, and prompt_ms of k new
    tokens = base_ms + k * per_token_ms."""

    def handle(method, path, body, headers):
        if path == "/props":
            return 200, {"build_info": "b1-fake", "total_slots": slots, "default_generation_settings": {"n_ctx": 4096}}
        if path == "/v1/models":
            return 200, {"data": [{"id": "fake.gguf", "meta": {"n_vocab": VOCAB, "n_embd": EMBD, "n_params": PARAMS}}]}
        if path == "/tokenize":
            return 200, {"tokens": [i % VOCAB for i in range(3, 3 + len(body["content"]) // 3)]}
        if path == "/completion":
            prompt = body["prompt"]
            cached = handle.cache.get(body.get("id_slot"), [])
            new = (
                len(prompt) - len(cached)
                if body.get("cache_prompt") and prompt[: len(cached)] == cached
                else len(prompt)
            )
            if body.get("cache_prompt"):
                handle.cache[body.get("id_slot")] = list(prompt)
            timings = {
                "prompt_n": new,
                "prompt_ms": base_ms + new * per_token_ms,
                "predicted_n": body.get("n_predict", 0),
                "predicted_per_token_ms": decode_ms,
            }
            return 200, {"tokens": [], "timings": timings, "completion_probabilities": []}
        return 404, {"error": {"message": "no"}}

    handle.cache = {}
    return handle


def test_the_cost_model_holds_the_servers_own_timings():
    with (
        FakeServer(_llama_like(decode_ms=40.0, per_token_ms=28.0, base_ms=10.0)) as v,
        FakeServer(_llama_like(decode_ms=25.0, per_token_ms=6.5, base_ms=18.0)) as d,
    ):
        cost = calibrate_server(v.url, d.url, batches=(1, 2), max_block=4, repeats=2, prompt_lengths=(32,))
    share = VOCAB * EMBD / PARAMS
    assert cost.source["row_share"] == pytest.approx(share)
    assert cost.verify_block[1] == pytest.approx(0.040)
    for k in (2, 3, 4):  # prompt processing of k tokens plus k - 1 rows' unembedding
        assert cost.verify_block[k] == pytest.approx((10.0 + 28.0 * k + (k - 1) * share * 40.0) / 1e3)
    assert cost.draft_token == pytest.approx(0.025)
    assert cost.draft_read_token == pytest.approx(0.0065)  # the slope of the draft's k-token forwards
    assert cost.prefill["verifier"][32] == pytest.approx((10.0 + 28.0 * 32) / 1e3)
    # at batch 2: a step verifying 3 tokens of each of 2 sequences is one forward of 6 tokens with 6 rows out
    two = cost.at_batch(2)
    assert two.verify_block[3] == pytest.approx((10.0 + 28.0 * 6 + 5 * share * 40.0) / 1e3)
    assert two.draft_read_token == pytest.approx(2 * 0.0065)
    assert cost.source["kind"] == "server" and cost.source["verifier"]["engine"] == "llama.cpp"


def test_too_few_slots_and_servers_without_timings_are_refused():
    from cactus_theory._servers._http import ServerError

    with FakeServer(_llama_like(40.0, 28.0, 10.0, slots=1)) as v, FakeServer(_llama_like(25.0, 6.5, 18.0)) as d:
        with pytest.raises(ServerError, match="--parallel 2"):
            calibrate_server(v.url, d.url, batches=(1, 2), max_block=2, repeats=1, prompt_lengths=(8,))

    def no_timings(method, path, body, headers):
        answer = _llama_like(40.0, 28.0, 10.0)(method, path, body, headers)
        if path == "/completion":
            return 200, {"tokens": []}
        return answer

    with FakeServer(no_timings) as v, FakeServer(_llama_like(25.0, 6.5, 18.0)) as d:
        with pytest.raises(ServerError, match="reports no timings"):
            calibrate_server(v.url, d.url, max_block=2, repeats=1, prompt_lengths=(8,))


@pytest.mark.llamacpp
def test_calibrate_and_plan_against_live_llama_servers(server_binary, tiny_ggufs, tmp_path, capsys):
    from local_servers import llama_server

    from cactus_theory._cli import main

    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "p.txt").write_text("ab cd ef\nthe quick fox\nhello world\n")
    with (
        llama_server(server_binary, tiny_ggufs[0], "-np", "2", "-c", "512", log_dir=logs) as v,
        llama_server(server_binary, tiny_ggufs[1], "-np", "2", "-c", "512", log_dir=logs) as d,
    ):
        assert (
            main(
                [
                    "calibrate",
                    "--server",
                    v.url,
                    "--draft-server",
                    d.url,
                    "--batch",
                    "1,2",
                    "--max-block",
                    "3",
                    "--repeats",
                    "1",
                    "--context",
                    "32",
                    "--prompt-lengths",
                    "16",
                    "--out",
                    str(tmp_path / "cost.json"),
                ]
            )
            == 0
        )
        assert (
            main(
                [
                    "dump",
                    "--server",
                    v.url,
                    "--draft-server",
                    d.url,
                    "--prompts",
                    str(tmp_path / "p.txt"),
                    "--out",
                    str(tmp_path / "trace"),
                    "--prompt-format",
                    "raw",
                    "--top-logits",
                    "32",
                    "--max-new-tokens",
                    "16",
                    "--quiet",
                ]
            )
            == 0
        )
    cost = load_cost(tmp_path / "cost.json")
    assert cost.batch_sizes == (1, 2) and np.all(np.diff(list(cost.verify_fit.values())) >= 0)
    capsys.readouterr()
    assert (
        main(
            [
                "plan",
                str(tmp_path / "trace"),
                "--cost",
                str(tmp_path / "cost.json"),
                "--rules",
                "strict",
                "--m",
                "3",
                "--draft-mode",
                "greedy",
                "--draft-policy",
                "llama.cpp(p_min=0.3)",
                "--trust-cost",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["strict", "llama.cpp(p_min=0.3)"] for line in out.splitlines() if line.strip())
