"""A hostile server and an impatient user (the fifth audit): a body sent a byte at a time is cut off at the
request's time-out, a row with no mass is refused, answers of another JSON shape and absurd timings are
refused in one line naming the field, secrets never leak in any form, port 0 is no port, control characters
are escaped, and a body is read up to a stated limit. Stand-ins on 127.0.0.1 (vLLM's and llama-server's
shapes, as ``fake_engines`` writes them)."""

from __future__ import annotations

import base64
import json

import pytest
from fake_engines import ToyModel, V, vllm_handler
from local_servers import Dribbler, FakeServer, free_port

from cactus_theory import SamplingSettings
from cactus_theory._servers import _http
from cactus_theory._servers._calibrate import calibrate_server
from cactus_theory._servers._dump import dump_server_trace
from cactus_theory._servers._http import ServerClient, ServerError, public_url

pytestmark = [pytest.mark.servers]

VERIFIER, DRAFT = ToyModel(0), ToyModel(1)
SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


def test_a_body_sent_a_byte_at_a_time_is_cut_off_at_the_requests_time_out():
    with Dribbler() as server:
        client = ServerClient(server.url, timeout=1.0, retries=0)
        with pytest.raises(ServerError, match=r"did not complete its answer within --timeout 1 s") as info:
            client.post("/completion", {"prompt": [1]})
    assert "\n" not in str(info.value)


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_requests_time_out_and_not_retried():
    """Each byte within httpx's per-read timeout, the whole beyond ``timeout``: the request ends at its deadline
    (a watchdog closes it), once, not once per retry."""
    import threading

    with Dribbler(pause=0.3, headers=True) as server:
        client = ServerClient(server.url, timeout=1.0, retries=4)
        outcome = []

        def ask():
            try:
                client.post("/completion", {"prompt": [1]})
            except ServerError as exc:
                outcome.append(str(exc))

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(120)  # a hang guard: the headers alone take 20 s to dribble, the body an hour
        assert not asker.is_alive(), "the request outlived the hang guard"
        assert server.accepted == 1  # one try: a deadline is not retried
    assert outcome and "did not complete its answer within --timeout 1 s" in outcome[0]
    client.close()


def test_a_body_beyond_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(_http, "MAX_BODY_BYTES", 1000)

    def handler(method, path, body, headers):
        return 200, {"tokens": list(range(2000))}

    with FakeServer(handler) as s:
        with pytest.raises(ServerError, match="answered more than 0 MiB"):
            ServerClient(s.url, retries=0).post("/tokenize", {})


def test_a_row_with_no_mass_is_refused(prompts, tmp_path):
    with FakeServer(vllm_handler(VERIFIER, faults={"massless": True})) as v, FakeServer(vllm_handler(DRAFT)) as d:
        with pytest.raises(ServerError, match=r"position 0: the likeliest token's log-prob is -9999 .*no mass"):
            dump_server_trace(
                v.url,
                d.url,
                prompts[:1],
                str(tmp_path / "t"),
                settings=SETTINGS,
                max_new_tokens=3,
                top_k=3,
                vocab_size=V,
                retries=0,
            )
    assert not (tmp_path / "t" / "shard-00000.safetensors").exists()


def _llama_info(**changes):
    """A llama-server's /props and /v1/models, with ``changes`` ({path: answer}) in place of them."""

    def handle(method, path, body, headers):
        if path in changes:
            return 200, changes[path]
        if path == "/props":
            return 200, {"build_info": "b1-test", "total_slots": 1, "default_generation_settings": {"n_ctx": 256}}
        if path == "/v1/models":
            return 200, {"data": [{"id": "m.gguf", "meta": {"n_vocab": V}}]}
        return 404, {"error": {"message": "no"}}

    return handle


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"/v1/models": {"data": ["toy"]}}, "data[0] is 'toy', not a JSON object"),
        ({"/v1/models": {"data": [{"id": "m", "meta": [1, 2]}]}}, "data[0].meta is [1, 2], not a JSON object"),
        ({"/v1/models": {"data": "toy"}}, "data is 'toy', not a list of models"),
        ({"/props": {"build_info": "b", "default_generation_settings": "x"}}, "default_generation_settings is 'x'"),
    ],
)
def test_answers_of_another_json_shape_are_refused_naming_the_field(prompts, tmp_path, capsys, changes, field):
    from cactus_theory._cli import main

    with FakeServer(_llama_info(**changes)) as v, FakeServer(_llama_info()) as d:
        with pytest.raises(ServerError, match=field.replace("[", r"\[").replace("]", r"\]")):
            dump_server_trace(v.url, d.url, prompts, str(tmp_path / "t"), retries=0)
        prompt_file = tmp_path / "p.txt"
        prompt_file.write_text("hello\n")
        code = main(
            [
                "dump",
                "--server",
                v.url,
                "--draft-server",
                d.url,
                "--prompts",
                str(prompt_file),
                "--out",
                str(tmp_path / "u"),
                "--retries",
                "0",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and v.url in err[0] and "Traceback" not in err[0]


def test_an_unexpected_shape_anywhere_is_one_line_naming_the_server(prompts, tmp_path):
    """An OpenAI completion whose logprobs are a string: the protocol's readers turn it into one line."""

    def handler(method, path, body, headers):
        if path == "/v1/completions":
            return 200, {"choices": [{"logprobs": "x", "finish_reason": "length"}]}
        return vllm_handler(VERIFIER)(method, path, body, headers)

    with FakeServer(handler) as v, FakeServer(vllm_handler(DRAFT)) as d:
        with pytest.raises(ServerError, match="returned no log-probs") as info:
            dump_server_trace(
                v.url,
                d.url,
                prompts[:1],
                str(tmp_path / "t"),
                settings=SETTINGS,
                max_new_tokens=3,
                top_k=3,
                vocab_size=V,
                retries=0,
            )
    assert v.url in str(info.value)


def test_url_credentials_never_leak_as_a_basic_token(prompts, tmp_path):
    token = base64.b64encode(b"alice:hunter2pw").decode()

    def handler(method, path, body, headers):
        if path == "/v1/completions":  # an error body that echoes the Authorization header
            return 401, {"error": {"message": f"bad credentials {headers.get('Authorization')}"}}
        return vllm_handler(VERIFIER)(method, path, body, headers)

    with FakeServer(handler) as v, FakeServer(vllm_handler(DRAFT)) as d:
        url = v.url.replace("http://", "http://alice:hunter2pw@")
        with pytest.raises(ServerError) as info:
            dump_server_trace(url, d.url, prompts[:1], str(tmp_path / "t"), vocab_size=V, retries=0)
    message = str(info.value)
    assert "bad credentials" in message and token not in message and token.rstrip("=") not in message
    assert "hunter2pw" not in message and "Basic ***" in message


def test_a_key_with_a_line_end_is_stripped_and_never_shown_in_any_form(tmp_path, monkeypatch):
    seen = []

    def handler(method, path, body, headers):
        seen.append(headers.get("Authorization"))
        return 401, {"error": {"message": f"echo {headers.get('Authorization')!r} {json.dumps('sk-SECRET123')}"}}

    monkeypatch.setenv("MY_KEY", "sk-SECRET123\r\n")  # a key file saved with Windows line ends
    with FakeServer(handler) as s:
        client = ServerClient(s.url, api_key_env="MY_KEY", retries=0)
        with pytest.raises(ServerError) as info:
            client.post("/v1/completions", {})
    assert seen == ["Bearer sk-SECRET123"] and "SECRET123" not in str(info.value)
    assert client.redact("a sk-SECRET123 b 'sk-SECRET123\\r' c") == "a *** b '***\\r' c"
    monkeypatch.setenv("MY_KEY", "sk-SE\x07CRET")
    with pytest.raises(ServerError, match="control characters") as info:
        ServerClient("http://127.0.0.1:9", api_key_env="MY_KEY")
    assert "CRET" not in str(info.value)


def test_every_form_of_a_secret_is_redacted():
    client = ServerClient("http://u:p%40ss%2Fw0rd@127.0.0.1:9", retries=0)
    secret = "p@ss/w0rd"
    for form in (secret, "p%40ss%2Fw0rd", base64.b64encode(b"u:p@ss/w0rd").decode(), json.dumps(secret)[1:-1]):
        assert client.redact(f"x {form} y") == "x *** y", form


def test_port_zero_is_refused_and_never_becomes_port_80():
    assert public_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    with pytest.raises(ServerError, match="port 0 is no server's port"):
        ServerClient("http://127.0.0.1:0")
    with pytest.raises(ServerError, match=r"port is not a number in 1\.\.65535"):
        ServerClient("http://127.0.0.1:99999")


def test_a_servers_text_reaches_the_terminal_with_its_control_characters_escaped():
    def handler(method, path, body, headers):
        return 500, {"error": {"message": "boom \x1b[2J\x1b]0;owned\x07 done"}}

    with FakeServer(handler) as s:
        with pytest.raises(ServerError) as info:
            ServerClient(s.url, retries=0).post("/completion", {})
    message = str(info.value)
    assert "\x1b" not in message and "\x07" not in message and "\\x1b[2J" in message and "done" in message


def test_calibrate_server_refuses_a_server_without_timings_saying_what_to_do_and_takes_a_time_out(capsys):
    from cactus_theory._cli import main

    with FakeServer(vllm_handler(VERIFIER)) as v, FakeServer(vllm_handler(DRAFT)) as d:
        with pytest.raises(
            ServerError,
            match=r"speaks openai: only llama.cpp's llama-server reports .*calibrate "
            r"--verifier MODEL --draft MODEL",
        ):
            calibrate_server(v.url, d.url, timeout=5, retries=0)
        code = main(["calibrate", "--server", v.url, "--draft-server", d.url, "--timeout", "5", "--retries", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--protocol" not in err and "only llama.cpp's llama-server" in err


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("fast", "timings.predicted_per_token_ms is 'fast', not a number"),
        (1e-300, "1e-300 ms lies outside what a machine measures"),
    ],
)
def test_calibrate_server_refuses_timings_no_machine_measures(value, match):
    def llama(method, path, body, headers):
        if path == "/completion":
            return 200, {"tokens": [5], "timings": {"predicted_per_token_ms": value, "prompt_ms": 1.0, "prompt_n": 1}}
        if path == "/tokenize":
            return 200, {"tokens": [3, 4, 5]}
        return _llama_info()(method, path, body, headers)

    with FakeServer(llama) as v, FakeServer(llama) as d:
        with pytest.raises(ServerError, match=match):
            calibrate_server(v.url, d.url, repeats=1, max_block=2, prompt_lengths=(4,), retries=0)


def test_a_dead_port_is_named(tmp_path):
    with pytest.raises(ServerError, match="could not be reached"):
        ServerClient(f"http://127.0.0.1:{free_port()}", retries=0).get("/props")
