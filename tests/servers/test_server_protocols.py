"""The vLLM and SGLang protocols against local stand-ins (``fake_engines``: answers shaped as those engines'
code writes them, computed from toy bigram models), checked against the toy models' own log-probs; and
everything a bad server can do, each refused in one line (exit 2 on the CLI): unreachable, HTTP errors,
malformed JSON, NaN / +inf, fewer than K log-probs, K above the server's limit, ids outside the vocabulary,
empty completions, mismatched tokenizers; retries on 503; keys and URL passwords never shown or stored."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fake_engines import ToyModel, V, sglang_handler, toy_ids, vllm_handler
from local_servers import FakeServer, free_port

from cactus_theory import SamplingSettings, load_trace
from cactus_theory._data._prompts import load_prompts
from cactus_theory._servers._dump import dump_server_trace
from cactus_theory._servers._http import ServerClient, ServerError, public_url

pytestmark = [pytest.mark.servers]

VERIFIER, DRAFT = ToyModel(0), ToyModel(1)
SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


def _expected(model, prompt_ids, tokens, k):
    """Top-k (log-probs, ids) of the toy model at every generated position (the independent computation)."""
    ids, lps, last = [], [], [prompt_ids[-1], *tokens[:-1]]
    for prev in last:
        lp = model.logprobs(prev)
        order = np.argsort(-lp, kind="stable")[:k]
        ids.append(order)
        lps.append(lp[order])
    return np.asarray(lps), np.asarray(ids)


def _check_against_toys(trace, prompts, chat, k):
    assert len(trace) == len(prompts)
    for seq, prompt in zip(trace, prompts, strict=True):
        ids = toy_ids(prompt.text, chat)
        assert seq.meta["prompt_tokens"] == len(ids)
        tokens = [int(t) for t in seq.tokens]
        for role, model in (("target", VERIFIER), ("draft", DRAFT)):
            lps, order = _expected(model, ids, tokens, k)
            np.testing.assert_array_equal(seq.topk_ids[role], order)
            np.testing.assert_allclose(seq.topk_logits[role], lps, rtol=0, atol=1e-6)  # float32 storage
            np.testing.assert_array_equal(seq.lse[role], 0.0)


def test_a_vllm_pair_gives_the_toy_models_distributions(prompts, tmp_path):
    with FakeServer(vllm_handler(VERIFIER)) as v, FakeServer(vllm_handler(DRAFT, name="toy/draft")) as d:
        summary = dump_server_trace(
            v.url,
            d.url,
            prompts,
            str(tmp_path / "t"),
            settings=SETTINGS,
            max_new_tokens=6,
            top_k=5,
            vocab_size=V,
            concurrency=2,
        )
        sent = [body for method, path, body, _ in v.requests if path == "/v1/completions"]
    assert summary.written_positions == 18 and not summary.refused
    trace = load_trace(str(tmp_path / "t"))
    _check_against_toys(trace, prompts, True, 5)
    server = trace.metadata["servers"]["verifier"]
    assert (server["engine"], server["protocol"], server["version"], server["model"]) == (
        "vllm",
        "openai",
        "0.11.0",
        "toy/verifier",
    )
    # what was asked: token-id prompts, K log-probs as token ids, the sampling settings
    assert all(b["return_tokens_as_token_ids"] and b["logprobs"] == 5 and b["top_k"] == 8 for b in sent)
    assert all(isinstance(b["prompt"], list) for b in sent)


def test_an_sglang_pair_gives_the_toy_models_distributions(prompts, tmp_path):
    with FakeServer(sglang_handler(VERIFIER)) as v, FakeServer(sglang_handler(DRAFT, name="toy/draft")) as d:
        dump_server_trace(
            v.url,
            d.url,
            prompts,
            str(tmp_path / "t"),
            settings=SETTINGS,
            max_new_tokens=5,
            top_k=4,
            vocab_size=V,
            tokenizer=toy_ids,
        )
        sent = [body for _, path, body, _ in d.requests if path == "/generate"]
    trace = load_trace(str(tmp_path / "t"))
    _check_against_toys(trace, prompts, True, 4)
    assert trace.metadata["servers"]["draft"]["engine"] == "sglang"
    assert all(b["return_logprob"] and b["logprob_start_len"] == len(b["input_ids"]) - 5 for b in sent)


def test_sglang_without_a_tokenizer_says_to_give_one(prompts, tmp_path):
    with FakeServer(sglang_handler(VERIFIER)) as v, FakeServer(sglang_handler(DRAFT)) as d:
        with pytest.raises(ServerError, match="--tokenizer"):
            dump_server_trace(v.url, d.url, prompts, str(tmp_path / "t"), vocab_size=V)


def test_retries_on_503_then_succeeds(prompts, tmp_path):
    faults = {"busy": 2}
    with FakeServer(vllm_handler(VERIFIER, faults=faults)) as v, FakeServer(vllm_handler(DRAFT)) as d:
        dump_server_trace(
            v.url, d.url, prompts[:1], str(tmp_path / "t"), settings=SETTINGS, max_new_tokens=3, top_k=3, vocab_size=V
        )
    assert faults["busy"] == 0 and len(load_trace(str(tmp_path / "t"))) == 1


def test_a_client_retries_with_backoff_and_gives_up_with_the_status():
    calls = []

    def handler(method, path, body, headers):
        calls.append(path)
        return 429, {"error": {"message": "slow down"}}, {"Retry-After": "0"}

    with FakeServer(handler) as s:
        client = ServerClient(s.url, retries=2, backoff=0.0)
        with pytest.raises(ServerError, match=r"HTTP 429 \(busy\)"):
            client.post("/v1/completions", {})
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("faults", "k_limit", "k", "match"),
    [
        ({"malformed": "{not json"}, 20, 3, "malformed JSON"),
        (
            {"malformed": '{"choices": [{"logprobs": {"tokens": [], "top_logprobs": [], "x": NaN}}]}'},
            20,
            3,
            "malformed JSON",
        ),
        ({"infinite": True}, 20, 3, "not a number a distribution can have"),
        ({"short": True}, 20, 4, "fewer than K = 4"),
        ({"outside": True}, 20, 3, "outside the vocabulary"),
        ({}, 2, 3, "greater than max allowed: 2"),
        ({"empty": True}, 20, 3, "empty completion"),
    ],
)
def test_a_bad_answer_is_refused_in_one_line_naming_it(prompts, tmp_path, faults, k_limit, k, match):
    with FakeServer(vllm_handler(VERIFIER, faults=faults, k_limit=k_limit)) as v, FakeServer(vllm_handler(DRAFT)) as d:
        with pytest.raises(ServerError, match=match) as info:
            dump_server_trace(
                v.url,
                d.url,
                prompts[:1],
                str(tmp_path / "t"),
                settings=SETTINGS,
                max_new_tokens=3,
                top_k=k,
                vocab_size=V,
                retries=0,
            )
    message = str(info.value)
    assert "\n" not in message and v.url in message


def test_the_cli_exits_2_with_one_line_for_an_unreachable_server(prompts, tmp_path, capsys):
    from cactus_theory._cli import main

    dead = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "p.txt").write_text("hello\n")
    code = main(
        [
            "dump",
            "--server",
            dead,
            "--draft-server",
            dead,
            "--prompts",
            str(tmp_path / "p.txt"),
            "--out",
            str(tmp_path / "t"),
            "--retries",
            "0",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "could not be reached" in err[0] and dead in err[0]


def test_mismatched_tokenizers_are_refused(prompts, tmp_path):
    def other(method, path, body, headers):
        if path == "/tokenize" and "prompt" in body:
            ids = toy_ids(body["prompt"], False)
            return 200, {"count": len(ids), "max_model_len": 4096, "tokens": [(t + 1) % V for t in ids]}
        return vllm_handler(DRAFT)(method, path, body, headers)

    with FakeServer(vllm_handler(VERIFIER)) as v, FakeServer(other) as d:
        with pytest.raises(ServerError, match=r"tokenize .* differently"):
            dump_server_trace(v.url, d.url, prompts, str(tmp_path / "t"), vocab_size=V)


def test_mismatched_vocabulary_sizes_are_refused(prompts, tmp_path):
    def llama(vocab):
        def handle(method, path, body, headers):
            if path == "/props":
                return 200, {"build_info": "b1-test", "total_slots": 1, "default_generation_settings": {"n_ctx": 256}}
            if path == "/v1/models":
                return 200, {"data": [{"id": "m.gguf", "meta": {"n_vocab": vocab}}]}
            return 404, {"error": {"message": "no"}}

        return handle

    with FakeServer(llama(64)) as v, FakeServer(llama(65)) as d:
        with pytest.raises(ServerError, match="64 tokens, the draft's 65"):
            dump_server_trace(v.url, d.url, prompts, str(tmp_path / "t"))


def test_an_api_key_is_sent_but_never_shown_or_stored(prompts, tmp_path, monkeypatch):
    secret = "sk-test-1234567890"
    monkeypatch.setenv("MY_KEY", secret)
    seen = []

    def handler(method, path, body, headers):
        seen.append(headers.get("Authorization"))
        if path == "/v1/completions":  # an error body that echoes the key back
            return 401, {"error": {"message": f"bad key {headers.get('Authorization')}"}}
        return vllm_handler(VERIFIER)(method, path, body, headers)

    with FakeServer(handler) as v, FakeServer(vllm_handler(DRAFT)) as d:
        url = v.url.replace("http://", "http://user:hunter2@")
        with pytest.raises(ServerError) as info:
            dump_server_trace(
                url, d.url, prompts[:1], str(tmp_path / "t"), vocab_size=V, api_key_env="MY_KEY", retries=0
            )
    assert f"Bearer {secret}" in seen
    assert secret not in str(info.value) and "***" in str(info.value) and "hunter2" not in str(info.value)
    manifest = (tmp_path / "t" / "manifest.json").read_text()
    assert secret not in manifest and "hunter2" not in manifest
    assert json.loads(manifest)["metadata"]["servers"]["verifier"]["url"] == v.url


def test_public_url_drops_credentials_query_and_fragment():
    assert public_url("https://u:p@example.org:8443/v1/?token=x#f") == "https://example.org:8443/v1"
    assert public_url("http://[::1]:8080") == "http://[::1]:8080"
    with pytest.raises(ServerError, match="--server must be an http"):
        ServerClient("ftp://example.org")


def test_llama_server_positions_inside_a_character_are_asked_for_alone(prompts, tmp_path):
    """llama-server leaves out the log-probs of a token that ends inside a character and its grammar fails on
    one (the stand-in does both, as the server's code does): the dump still holds every position, equal to
    the toy models' distributions."""
    from fake_engines import llama_handler

    # every fourth token id ends inside a character (the one letter 'a' is token 7, whole)
    partial = frozenset(range(0, V, 4)) - {7}
    with (
        FakeServer(llama_handler(VERIFIER, partial=partial)) as v,
        FakeServer(llama_handler(DRAFT, partial=partial)) as d,
    ):
        dump_server_trace(
            v.url, d.url, prompts, str(tmp_path / "t"), settings=SETTINGS, max_new_tokens=12, top_k=5, chat=False
        )
    trace = load_trace(str(tmp_path / "t"))
    held = [int(t) for s in trace for t in s.tokens]
    assert any(t in partial for t in held)  # the case arose
    assert any(s.meta.get("rescored_positions") for s in trace)
    _check_against_toys(trace, prompts, False, 5)


@pytest.mark.models
def test_the_server_and_the_model_dumps_run_one_session(prompts, tmp_path, monkeypatch):
    """Both dumps are one resumable session (``DumpSession``) fed with rows, and return its one summary."""
    from tiny_models import tiny_model, tiny_tokenizer

    from cactus_theory._data import _dump_session
    from cactus_theory.traces import dump_trace

    sessions, real = [], _dump_session.DumpSession.__enter__

    def enter(self):
        sessions.append(self.what)
        return real(self)

    monkeypatch.setattr(_dump_session.DumpSession, "__enter__", enter)
    with FakeServer(vllm_handler(VERIFIER)) as v, FakeServer(vllm_handler(DRAFT, name="toy/draft")) as d:
        served = dump_server_trace(
            v.url,
            d.url,
            prompts,
            str(tmp_path / "s"),
            settings=SETTINGS,
            max_new_tokens=3,
            top_k=5,
            vocab_size=V,
            limit=2,
        )
    pair = (tiny_model(0), tiny_tokenizer()), (tiny_model(1, layers=1), tiny_tokenizer())
    mine = dump_trace(
        *pair, prompts, tmp_path / "m", settings=SETTINGS, max_new_tokens=3, top_k=5, progress=False, limit=2
    )
    assert sessions == ["dump (server)", "dump"]
    assert type(served) is type(mine) is _dump_session.DumpSummary
    assert (served.written_prompts, mine.written_prompts) == (2, 2)


def test_a_protocol_in_one_plugin_file_is_detected_and_dumps(tmp_path):
    """Adding a protocol is one file: ``toy_protocol.py`` (the page's worked example), given to the command line
    with --plugin, is offered by --protocol, recognised by detection and dumps a trace whose rows are the toy
    models' own (run in a fresh interpreter, so no other test sees the protocol registered)."""
    import pathlib
    import subprocess
    import sys

    from fake_engines import toyrpc_handler
    from locations import HANG_GUARD

    here = pathlib.Path(__file__).resolve().parent
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\nsome text\n")
    with FakeServer(toyrpc_handler(VERIFIER)) as v, FakeServer(toyrpc_handler(DRAFT, name="toy/draft")) as d:
        argv = [
            "--plugin",
            str(here / "toy_protocol.py"),
            "dump",
            "--server",
            v.url,
            "--draft-server",
            d.url,
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "t"),
            "--max-new-tokens",
            "5",
            "--top-logits",
            "4",
            "--temperature",
            "1",
            "--top-k",
            "8",
            "--top-p",
            "1",
            "--quiet",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "cactus_theory", *argv], capture_output=True, text=True, timeout=HANG_GUARD
        )
        assert done.returncode == 0, done.stderr[-2000:]
        helped = subprocess.run(
            [sys.executable, "-m", "cactus_theory", "--plugin", str(here / "toy_protocol.py"), "dump", "--help"],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
        )
    assert "toyrpc" in helped.stdout
    trace = load_trace(str(tmp_path / "t"))
    assert trace.metadata["servers"]["verifier"]["protocol"] == "toyrpc"
    assert trace.metadata["servers"]["draft"]["engine"] == "toyserve"
    _check_against_toys(trace, load_prompts(str(prompts)), True, 4)
    # the protocol is this process's no more than before: a fresh registry holds the built-in ones
    from cactus_theory.servers import protocol_names

    assert "toyrpc" not in protocol_names() and protocol_names() == ("llama.cpp", "sglang", "openai")


def test_a_server_two_protocols_recognise_names_the_one_assumed_in_its_errors(prompts, tmp_path):
    """A vLLM server that also answers /props as llama-server does: both protocols recognise it, llama.cpp's
    is asked first, and its /completion is a 404: the error says which protocol was assumed and why."""
    from cactus_theory._servers._protocols import detect_protocol, open_server

    inner = vllm_handler(VERIFIER)

    def both(method, path, body, headers):
        if path == "/props":
            return 200, {"build_info": "b1-fake", "default_generation_settings": {"n_ctx": 4096}}
        if path in ("/completion", "/detokenize") or (path == "/tokenize" and "content" in (body or {})):
            return 404, {"detail": "Not Found"}  # llama-server's native endpoints: vLLM has none
        return inner(method, path, body, headers)

    with FakeServer(both) as v, FakeServer(vllm_handler(DRAFT, name="toy/draft")) as d:
        client = ServerClient(v.url, retries=0)
        assert detect_protocol(client) == "llama.cpp"
        assert client.assumed.startswith("protocol 'llama.cpp' assumed: 'openai' also recognise this server")
        with pytest.raises(ServerError) as err:
            dump_server_trace(v.url, d.url, prompts, tmp_path / "t", max_new_tokens=3, top_k=4, progress=False)
        message = str(err.value)
        assert "HTTP 404" in message and "protocol 'llama.cpp' assumed" in message and "--protocol" in message
        assert "\n" not in message
        _, speaker = open_server(d.url)
        assert speaker.client.assumed == "protocol 'openai' detected; give --protocol to choose another"


def test_a_plugin_protocol_whose_detection_raises_is_named_and_is_not_the_users_input(tmp_path):
    """Its exception (a ValueError here) is shown naming the protocol and its module, exit 1, not 2."""
    import pathlib
    import subprocess
    import sys

    from locations import HANG_GUARD

    plugin = tmp_path / "broken_protocol.py"
    plugin.write_text(
        "from cactus_theory.servers import ServerProtocol\n\n\n"
        "class Broken(ServerProtocol):\n"
        "    name = 'broken'\n"
        "    detect_order = 1\n\n"
        "    @classmethod\n"
        "    def detects(cls, client):\n"
        "        raise ValueError('a bug in the plugin')\n\n"
        "    _read_info = prompt_ids = generate = score = None\n"
    )
    prompts_file = tmp_path / "p.txt"
    prompts_file.write_text("hello\n")
    with FakeServer(vllm_handler(VERIFIER)) as v, FakeServer(vllm_handler(DRAFT, name="toy/draft")) as d:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cactus_theory",
                "--plugin",
                str(plugin),
                "dump",
                "--server",
                v.url,
                "--draft-server",
                d.url,
                "--prompts",
                str(prompts_file),
                "--out",
                str(tmp_path / "t"),
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD,
            cwd=str(pathlib.Path(__file__).parents[2]),
        )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "protocol 'broken' (broken_protocol.Broken) failed while detecting the server" in lines[0]
    assert "ValueError: a bug in the plugin" in lines[0]
