"""Traces taken over HTTP from a live llama-server (llama.cpp's own server, started here on 127.0.0.1 with
the tiny GGUF models): equal, position by position, to the in-process llama.cpp dump of the same model,
prompts and tokens; the same from its OpenAI-compatible endpoint; the same at any concurrency; and a
server killed mid-dump loses nothing complete, the rerun ends on the same bits as a dump straight through.

Tolerance of the comparison with the in-process dump: the token ids of every row agree exactly; the
log-probs within 5e-5. Both are llama.cpp's float32 arithmetic on the same weights (the server is built
from the very llama.cpp of llama-cpp-python), but the server decodes the draft one token per call while the
in-process dump feeds each sequence in one batch, and it computes the softmax in float32 where the trace
writer's log-sum-exp is float64: the accumulation order differs, measured at most 5.4e-6 here; 5e-5 is
ten times that and far below any difference a rule could see (a log-prob error e moves a probability by
a factor exp(e) - 1 ~ e).
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from local_servers import FakeServer, llama_server
from locations import HANG_GUARD

from cactus_theory import SamplingSettings, load_trace

pytestmark = [pytest.mark.llamacpp, pytest.mark.servers]

TOLERANCE = 5e-5
SETTINGS = SamplingSettings(temperature=1.0, top_k=10, top_p=1.0)
WORDS = "ab cd ef gh ij kl mn op qr st uv wx yz the quick brown fox jumps over a lazy dog".split()


def _prompts(n, path):
    lines = [" ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(2 + i % 4)) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    from cactus_theory._data._prompts import load_prompts

    return load_prompts(str(path))


def _dump(verifier, draft, prompts, out, **options):
    from cactus_theory._servers._dump import dump_server_trace

    options = {"settings": SETTINGS, "max_new_tokens": 24, "top_k": 16, "chat": False, **options}
    return dump_server_trace(verifier, draft, prompts, str(out), **options)


def _rows(trace):
    """{id: (tokens, {role: (normalised log-probs, ids)})} of a trace."""
    out = {}
    for seq in trace:
        out[seq.id] = (
            np.asarray(seq.tokens),
            {r: (seq.topk_logits[r] - seq.lse[r][:, None], np.asarray(seq.topk_ids[r])) for r in ("target", "draft")},
        )
    return out


def _same_bits(a, b):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key][0], b[key][0])
        for role in ("target", "draft"):
            np.testing.assert_array_equal(a[key][1][role][0], b[key][1][role][0])
            np.testing.assert_array_equal(a[key][1][role][1], b[key][1][role][1])


def test_a_server_trace_equals_the_in_process_llama_dump_position_by_position(llama_pair, tiny_ggufs, tmp_path):
    verifier, draft = llama_pair
    prompts = _prompts(4, tmp_path / "prompts.txt")
    summary = _dump(verifier.url, draft.url, prompts, tmp_path / "server")
    assert summary.written_prompts == 4 and not summary.refused
    served = load_trace(str(tmp_path / "server"))
    assert served.manifest["tail_known"] is True and served.top_k == 16 and served.vocab_size == 64
    meta = served.metadata
    assert meta["servers"]["verifier"]["url"] == verifier.url and meta["servers"]["draft"]["engine"] == "llama.cpp"
    assert meta["sampling"] == SETTINGS.as_dict()
    # the same model, prompts and tokens in this process: teacher-forced on the server's completions
    completions = tmp_path / "completions.jsonl"
    completions.write_text(
        "".join(json.dumps({"id": s.id, "token_ids": [int(t) for t in s.tokens]}) + "\n" for s in served)
    )
    from cactus_theory._cli import main

    code = main(
        [
            "dump",
            "--engine",
            "llama.cpp",
            "--verifier",
            str(tiny_ggufs[0]),
            "--draft",
            str(tiny_ggufs[1]),
            "--prompts",
            str(tmp_path / "prompts.txt"),
            "--completions",
            str(completions),
            "--out",
            str(tmp_path / "local"),
            "--top-logits",
            "16",
            "--max-new-tokens",
            "24",
            "--temperature",
            "1",
            "--top-k",
            "10",
            "--top-p",
            "1",
            "--quiet",
        ]
    )
    assert code == 0
    local = _rows(load_trace(str(tmp_path / "local")))
    server = _rows(served)
    assert local.keys() == server.keys()
    for key in server:
        np.testing.assert_array_equal(server[key][0], local[key][0])
        for role in ("target", "draft"):
            (a, ia), (b, ib) = server[key][1][role], local[key][1][role]
            np.testing.assert_array_equal(ia, ib)  # the same top-16 tokens in the same order
            np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE)
            assert not np.array_equal(a, np.zeros_like(a))
    # the prompt lengths recorded agree too
    assert [r.prompt_tokens for r in served.records()] == [
        r.prompt_tokens for r in load_trace(str(tmp_path / "local")).records()
    ]


def test_the_openai_endpoint_and_any_concurrency_give_the_same_trace(llama_pair, tmp_path):
    verifier, draft = llama_pair
    prompts = _prompts(5, tmp_path / "prompts.txt")
    _dump(verifier.url, draft.url, prompts, tmp_path / "native")
    _dump(verifier.url, draft.url, prompts, tmp_path / "openai", protocol="openai")
    _dump(verifier.url, draft.url, prompts, tmp_path / "concurrent", concurrency=3)
    native = _rows(load_trace(str(tmp_path / "native")))
    _same_bits(native, _rows(load_trace(str(tmp_path / "openai"))))
    _same_bits(native, _rows(load_trace(str(tmp_path / "concurrent"))))
    assert load_trace(str(tmp_path / "openai")).metadata["servers"]["verifier"]["protocol"] == "openai"


def test_a_rerun_skips_what_the_trace_holds(llama_pair, tmp_path):
    verifier, draft = llama_pair
    prompts = _prompts(3, tmp_path / "prompts.txt")
    first = _dump(verifier.url, draft.url, prompts, tmp_path / "t", limit=2)
    again = _dump(verifier.url, draft.url, prompts, tmp_path / "t")
    assert (first.written_prompts, again.written_prompts, again.trace_prompts) == (2, 1, 3)


class _KillAfter:
    """A proxy in front of a llama-server that forwards requests and, once ``after`` completion requests
    have been answered, kills the server: the next request meets a dead server (deterministic, no timing)."""

    def __init__(self, server, after):
        import httpx

        self.server, self.after, self.answered = server, after, 0
        self.lock = threading.Lock()
        self.http = httpx.Client(timeout=HANG_GUARD)  # the server answers or is dead: no budget

        def handler(method, path, body, headers):
            if path.startswith("/completion") and self.answered >= self.after:
                self.server.kill()
            try:
                response = self.http.request(method, self.server.url + path, json=body)
            except httpx.HTTPError as exc:
                return 502, {"error": {"message": f"upstream gone: {exc}"}}
            if path.startswith("/completion"):
                with self.lock:
                    self.answered += 1
            return response.status_code, response.text

        self.fake = FakeServer(handler)


def test_a_server_killed_mid_dump_loses_nothing_and_the_rerun_ends_on_the_same_bits(
    server_binary, tiny_ggufs, tmp_path
):
    prompts = _prompts(6, tmp_path / "prompts.txt")
    logs = tmp_path / "logs"
    logs.mkdir()
    with llama_server(server_binary, tiny_ggufs[1], "-np", "1", "-c", "256", log_dir=logs) as draft:
        with llama_server(server_binary, tiny_ggufs[0], "-np", "1", "-c", "256", log_dir=logs) as verifier:
            _dump(verifier.url, draft.url, prompts, tmp_path / "straight")
            proxy = _KillAfter(verifier, after=3)  # prompt 1 and 2 generated, then the verifier dies
            with proxy.fake:
                from cactus_theory._servers._http import ServerError

                with pytest.raises(ServerError, match="--server"):
                    _dump(proxy.fake.url, draft.url, prompts, tmp_path / "broken", retries=1, shard_positions=1)
            held = load_trace(str(tmp_path / "broken"))
            assert 1 <= len(held) < len(prompts)  # what completed is on disk, nothing else
        # the verifier restarts (another port: a resume compares what is served, not where)
        with llama_server(server_binary, tiny_ggufs[0], "-np", "1", "-c", "256", log_dir=logs) as verifier:
            summary = _dump(verifier.url, draft.url, prompts, tmp_path / "broken")
    assert summary.trace_prompts == len(prompts) and summary.written_prompts == len(prompts) - len(held)
    _same_bits(_rows(load_trace(str(tmp_path / "straight"))), _rows(load_trace(str(tmp_path / "broken"))))
