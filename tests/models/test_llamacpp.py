"""The llama.cpp engine (issue 34), on tiny GGUF models written in the test: its logits against
the transformers forward of the same float32 weights, its sequences (isolation in one batch,
cache removal), dumps and decoding on it, several prompts in one batch against one at a time,
and the command line."""

import json

import numpy as np
import pytest
from optional import torch
from tiny_models import tiny_model, write_tiny_gguf

from cactus_theory._math._sampling import SamplingSettings
from cactus_theory.traces import Trace

pytestmark = [pytest.mark.llamacpp, pytest.mark.models]

#: llama.cpp keeps its KV cache in float16: logits of order 10 agree with the float32 forward
#: to a few 1e-3 (measured 2.7e-3); a real difference (a wrong position, another sequence's
#: cache) moves them by whole units.
ATOL = 2e-2
SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama_models")
    verifier, draft = tiny_model(2), tiny_model(3, layers=1)
    return (
        verifier,
        draft,
        str(write_tiny_gguf(verifier, d / "verifier.gguf")),
        str(write_tiny_gguf(draft, d / "draft.gguf")),
    )


def _reference(model, ids):
    """The transformers forward over the whole sequence at once: (len, V) float32 logits."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).logits[0].numpy()


def test_logits_of_several_sequences_in_one_batch_match_each_sequence_alone_in_transformers(pair):
    from cactus_theory._models._hf import load_model

    hf_model, _, path, _ = pair
    model, _, identity = load_model(path, engine="llama.cpp", sequences=3)
    assert identity["files"]["verifier.gguf"]["sha256"] and model.vocab_size == 64
    inputs = [[3, 5, 7, 9, 11], [2, 4], [40, 41, 42, 43, 44, 45, 46]]
    seqs = [model.sequence() for _ in inputs]
    outs = model.evaluate([(s, ids, "all") for s, ids in zip(seqs, inputs, strict=True)])
    for ids, out in zip(inputs, outs, strict=True):
        np.testing.assert_allclose(out.numpy(), _reference(hf_model, ids), atol=ATOL)
    # a second step: each sequence continues at its own positions
    more = [[13], [6, 8, 10], [47, 48]]
    outs = model.evaluate([(s, ids, "last") for s, ids in zip(seqs, more, strict=True)])
    for ids, extra, out in zip(inputs, more, outs, strict=True):
        assert out.shape == (1, 64)
        np.testing.assert_allclose(out.numpy()[0], _reference(hf_model, ids + extra)[-1], atol=ATOL)
    with pytest.raises(ValueError, match="all 3 sequences"):
        model.sequence()
    seqs[0].close()  # its slot is free again, its cache emptied
    again = model.sequence()
    np.testing.assert_allclose(again.feed([1, 2, 3]).numpy(), _reference(hf_model, [1, 2, 3]), atol=ATOL)


def test_crop_removes_the_rejected_tail_from_the_cache(pair):
    from cactus_theory._models._hf import cached_model, load_model

    hf_model, _, path, _ = pair
    model = load_model(path, engine="llama.cpp")[0]
    seq = cached_model(model)
    seq.feed([3, 5, 7, 9, 11, 13])
    seq.crop(3)  # keep 3, 5, 7: the other three were "rejected"
    assert seq.length == 3
    out = seq.feed([20, 21])
    np.testing.assert_allclose(out.numpy(), _reference(hf_model, [3, 5, 7, 20, 21])[3:], atol=ATOL)
    # without the removal the new tokens would attend to the stale ones: the logits would differ
    stale = _reference(hf_model, [3, 5, 7, 9, 11, 13, 20, 21])[6:]
    assert np.abs(stale - out.numpy()).max() > 10 * ATOL
    with pytest.raises(ValueError, match=f"would hold {model.context + 6} tokens, more than the context of"):
        seq.feed([1] * (model.context + 1))


def test_teacher_forced_rows_and_end_ids_match_the_transformers_path(pair):
    from cactus_theory._models._hf import eos_ids, load_model, teacher_forced_logits

    hf_model, _, path, _ = pair
    model, tok, _ = load_model(path, engine="llama.cpp")
    hf, hf_tok, _ = load_model(path)
    prompt, tokens = [5, 6, 7], [9, 10, 11, 1]
    rows = teacher_forced_logits(model, prompt, tokens)
    np.testing.assert_allclose(rows, _reference(hf_model, prompt + tokens[:-1])[2:], atol=ATOL)
    assert eos_ids(model, tok) == eos_ids(hf, hf_tok) == {1}
    assert tok.get_vocab() == hf_tok.get_vocab()


def _prompts():
    from cactus_theory._data._prompts import Prompt

    texts = ["ab cd ef", "gh", "ij kl mn op", "qr st", "uv wx"]
    return [Prompt(id=f"p{i}", task="toy", text=t, index=i) for i, t in enumerate(texts)]


@pytest.mark.parametrize(
    "rule, options",
    [
        ("sps", {}),
        ("cactus(delta=1)", {"drift": True}),
        ("block", {}),
        ("sps", {"draft_policy": "p-min(0.5)"}),
        ("lossy(alpha=0.6)", {"bonus_policy": "relaxed"}),
    ],
)
def test_a_batch_of_prompts_decodes_as_each_prompt_alone(pair, rule, options):
    from cactus_theory._models._decoding import speculative_batch_steps, speculative_generate
    from cactus_theory._models._hf import drain, encode_chat, eos_ids, load_model

    _, _, v_path, d_path = pair
    verifier, tok, _ = load_model(v_path, engine="llama.cpp", sequences=5)
    draft = load_model(d_path, engine="llama.cpp", sequences=5)[0]
    ids = [encode_chat(tok, p.text) for p in _prompts()]
    seeds = [11, 12, 13, 14, 15]
    eos = eos_ids(verifier, tok)
    batch = drain(speculative_batch_steps(verifier, draft, rule, 3, ids, seeds, SETTINGS, 24, eos, **options))
    for prompt_ids, seed, got in zip(ids, seeds, batch, strict=True):
        alone = speculative_generate(verifier, draft, rule, 3, SETTINGS, 24, seed, prompt_ids, eos, **options)
        assert got.tokens == alone.tokens and got.accepted == alone.accepted and got.drafted == alone.drafted
        if options.get("drift"):
            # the same laws, from logits that differ by llama.cpp's rounding in batches of another shape
            np.testing.assert_allclose(got.token_kl, alone.token_kl, rtol=1e-3, atol=1e-12)
        assert got.total_seconds >= got.prefill_seconds > 0 and len(got.token_seconds) == len(got.tokens)


def test_a_drafter_equal_to_the_verifier_is_always_accepted_in_a_batch(pair):
    """SpS with p = q accepts every draft: each step emits m + 1 tokens, and the draft caches
    that lack the last accepted draft get it (the all-accepted path)."""
    from cactus_theory._models._decoding import autoregressive_batch_steps, speculative_batch_steps
    from cactus_theory._models._hf import drain, encode_chat, load_model

    _, _, v_path, _ = pair
    verifier, tok, _ = load_model(v_path, engine="llama.cpp", sequences=4)
    same = load_model(v_path, engine="llama.cpp", sequences=4)[0]
    ids = [encode_chat(tok, p.text) for p in _prompts()[:4]]
    got = drain(speculative_batch_steps(verifier, same, "sps", 4, ids, [1, 2, 3, 4], SETTINGS, 20))
    for res in got:
        assert res.accepted == [4] * 4 and len(res.tokens) == 20
    alone = drain(autoregressive_batch_steps(verifier, ids, [1, 2, 3, 4], SETTINGS, 20))
    # the verifier alone, batched, is the dumper's sampling loop run per prompt
    from cactus_theory._models._hf import generate

    for prompt_ids, seed, res in zip(ids, [1, 2, 3, 4], alone, strict=True):
        tokens, _, _ = generate(verifier, prompt_ids, SETTINGS, 20, torch.Generator().manual_seed(seed), set())
        assert res.tokens == tokens


def test_batches_need_one_engine_and_one_seed_per_prompt(pair):
    from cactus_theory._models._decoding import speculative_batch_steps
    from cactus_theory._models._hf import drain, load_model

    v_path = pair[2]
    hf = load_model(v_path)[0]
    model = load_model(v_path, engine="llama.cpp")[0]
    with pytest.raises(ValueError, match=r"different engines \(\['hf', 'llama\.cpp'\]\)"):
        drain(speculative_batch_steps(model, hf, "sps", 2, [[1, 2]], [0]))
    with pytest.raises(ValueError, match="one seed per prompt"):
        drain(speculative_batch_steps(model, model, "sps", 2, [[1, 2], [3]], [0]))
    with pytest.raises(ValueError, match="GGUF files"):
        load_model("Qwen/Qwen2.5-0.5B", engine="llama.cpp")
    with pytest.raises(ValueError, match="engine must be one of"):
        load_model(v_path, engine="vllm")
    with pytest.raises(ValueError, match=r"apply to engine 'llama\.cpp' only"):
        load_model(v_path, sequences=4)


def test_a_missing_binding_names_the_extra(monkeypatch):
    import sys

    from cactus_theory._models import _llamacpp

    _llamacpp._lib.cache_clear()
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    try:
        with pytest.raises(ValueError, match=r"pip install -e '\.\[llamacpp\]'"):
            _llamacpp._lib()
    finally:
        _llamacpp._lib.cache_clear()


def test_a_llama_dump_matches_the_forward_resumes_bit_for_bit_and_refuses_the_other_engine(pair, tmp_path):
    from cactus_theory._data._trace_format import TraceError
    from cactus_theory._models._dump import dump_trace
    from cactus_theory._models._hf import encode_chat, load_model

    hf_verifier, hf_draft, v_path, d_path = pair
    prompts = _prompts()[:3]
    args = dict(settings=SETTINGS, max_new_tokens=6, top_k=16, store_full=True, progress=False, engine="llama.cpp")
    dump_trace(v_path, d_path, prompts, tmp_path / "straight", **args)
    dump_trace(v_path, d_path, prompts, tmp_path / "resumed", limit=1, **args)
    dump_trace(v_path, d_path, prompts, tmp_path / "resumed", **args)
    straight, resumed = Trace(tmp_path / "straight"), Trace(tmp_path / "resumed")
    assert straight.metadata["engine"] == "llama.cpp" and straight.metadata["versions"]["llama_cpp_python"]
    tok = load_model(v_path)[1]
    by_id = {s.id: s for s in resumed}
    for seq in straight:
        other = by_id[seq.id]
        assert list(seq.tokens) == list(other.tokens)
        for role in ("target", "draft"):
            assert np.array_equal(seq.full_logits[role], other.full_logits[role])  # bit for bit
        ids = encode_chat(tok, next(p.text for p in prompts if p.id == seq.id))
        full = ids + list(seq.tokens[:-1])
        np.testing.assert_allclose(seq.full_logits["target"], _reference(hf_verifier, full)[len(ids) - 1 :], atol=ATOL)
        np.testing.assert_allclose(seq.full_logits["draft"], _reference(hf_draft, full)[len(ids) - 1 :], atol=ATOL)
    with pytest.raises(TraceError, match="cannot resume"):
        dump_trace(v_path, d_path, prompts, tmp_path / "straight", **{**args, "engine": "hf"})


def test_cli_dump_decode_batch_and_calibrate_on_the_llama_engine(pair, tmp_path, capsys):
    from cactus_theory._cli import main

    _, _, v_path, d_path = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"instruction": t.text}) + "\n" for t in _prompts()))
    models = ["--verifier", v_path, "--draft", d_path, "--engine", "llama.cpp"]
    common = [*models, "--prompts", str(prompts), "--field", "instruction", "--quiet", "--max-new-tokens", "8"]
    assert main(["dump", *common, "--out", str(tmp_path / "t")]) == 0
    assert Trace(tmp_path / "t").metadata["engine"] == "llama.cpp"
    out = tmp_path / "r.jsonl"
    argv = ["decode", *common, "--rule", "sps,cactus", "-m", "3", "--batch", "2", "--baseline", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "throughput at batch 2 (3 batches)" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10 and {r["batch_size"] for r in records} == {1, 2}
    assert all(r["baseline"]["batch_seconds"] > 0 and r["batch"] == 2 for r in records)
    assert main(argv) == 0 and len(out.read_text().splitlines()) == 10  # a rerun decodes nothing again
    capsys.readouterr()
    # the Hugging Face engine decodes and calibrates batches too (its slots, on its device)
    assert (
        main(
            [
                "decode",
                "--verifier",
                v_path,
                "--draft",
                d_path,
                "--prompt",
                "ab cd",
                "--batch",
                "2",
                "--quiet",
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    cost = tmp_path / "cost.json"
    assert (
        main(
            [
                "calibrate",
                *models,
                "--max-block",
                "3",
                "--repeats",
                "2",
                "--context",
                "16",
                "--prompt-lengths",
                "4,8",
                "--quiet",
                "--out",
                str(cost),
                "--batch",
                "1,3",
            ]
        )
        == 0
    )
    data = json.loads(cost.read_text())
    assert data["source"]["engine"] == "llama.cpp" and data["source"]["versions"]["llama_cpp_python"]
    assert set(data["batch"]) == {"3"} and set(data["batch"]["3"]["verify_block"]) == {"1", "2", "3"}
    assert len(data["batch"]["3"]["samples"]["draft_token"]) == 2
    assert "batch 3: a draft step" in capsys.readouterr().out
    # plan from this calibration at both sizes
    assert (
        main(
            [
                "plan",
                str(tmp_path / "t"),
                "--cost",
                str(cost),
                "--trust-cost",
                "--rules",
                "sps",
                "--m",
                "1,2",
                "--batch",
                "1,3",
                "--bootstrap",
                "100",
                "--quiet",
            ]
        )
        == 0
    )
    assert "break-even B" in capsys.readouterr().out
    capsys.readouterr()
    hf_cost = tmp_path / "hf-cost.json"
    assert (
        main(
            [
                "calibrate",
                "--verifier",
                v_path,
                "--draft",
                d_path,
                "--batch",
                "2",
                "--quiet",
                "--max-block",
                "2",
                "--repeats",
                "2",
                "--context",
                "16",
                "--prompt-lengths",
                "4",
                "--out",
                str(hf_cost),
            ]
        )
        == 0
    )
    data = json.loads(hf_cost.read_text())
    assert data["source"]["decoder"] == "device" and set(data["batch"]["2"]["verify_block"]) == {"1", "2"}


def test_a_batch_is_fed_in_ascending_sequence_ids_whatever_the_order_asked(pair):
    """llama.cpp splits a batch whose sequence ids are out of order into several passes (issue 42: the verifier alone
    ran slower at batch 2 than at batch 1 in decoding; on the 1.5B verifier, 2 cores, a step of 4 sequences took
    191-258 ms out of order and 137-140 ms in order). ``evaluate`` feeds them in ascending id, hands each request its
    own logits back in the order asked, and new sequences take the lowest free id."""
    from types import SimpleNamespace

    from cactus_theory._models._hf import load_model

    hf_model, _, path, _ = pair
    model, _, _ = load_model(path, engine="llama.cpp", sequences=4)
    seqs = [model.sequence() for _ in range(4)]
    assert [q.seq_id for q in seqs] == [0, 1, 2, 3]
    seqs[0].close()
    seqs[1].close()
    again = model.sequence()
    assert again.seq_id == 0  # the lowest free id, not the last one freed
    fed = []
    real, lib = model.lib.llama_decode, model.lib

    def spy(ctx, batch):
        fed.append([int(batch.seq_id[i][0]) for i in range(batch.n_tokens)])
        return real(ctx, batch)

    model.lib = SimpleNamespace(**{name: getattr(lib, name) for name in dir(lib) if name.startswith("llama_")})
    model.lib.llama_decode = spy
    inputs = {3: [5, 6, 7], 2: [9], 0: [11, 12]}
    order = [seqs[3], seqs[2], again]  # asked in descending ids
    outs = model.evaluate([(q, inputs[q.seq_id], "all") for q in order])
    assert fed == [[0, 0, 2, 3, 3, 3]]
    for q, out in zip(order, outs, strict=True):
        np.testing.assert_allclose(out.numpy(), _reference(hf_model, inputs[q.seq_id]), atol=ATOL)


@pytest.mark.parametrize("quantization", ["Q8_0", "Q4_0"])
def test_the_build_runs_quantised_models(tmp_path, quantization):
    """llama.cpp's quantised kernels on a tiny model in 8- and 4-bit blocks, in a child process (a build whose
    kernels crash, as a native build on x86-64 with AVX-512 and AMX did on the Q4_K_M pair, fails this test
    instead of killing the test run); its logits are the float model's up to the blocks' rounding."""
    import subprocess
    import sys

    from locations import HANG_GUARD, ROOT

    model = tiny_model(6)
    path = write_tiny_gguf(model, tmp_path / "q.gguf", quantization=quantization)
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import numpy as np\n"
        "from cactus_theory.hf import load_model\n"
        f"m, _, _ = load_model({str(path)!r}, engine='llama.cpp', progress=False)\n"
        "s = m.sequence(); out = s.feed([3, 4, 5, 6, 7])\n"
        "for _ in range(8):\n    out = s.feed([int(out[-1].argmax())])\n"
        "np.save(sys.argv[1], m.sequence().feed([3, 4, 5, 6, 7]).numpy())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == 0, (
        f"llama.cpp ended with {done.returncode} on a {quantization} model (a negative code is a signal: -11 a "
        "segmentation fault): rebuild llama-cpp-python with portable kernels (scripts/check.sh's CMAKE_ARGS)\n"
        + done.stderr[-2000:]
    )
    got = np.load(tmp_path / "out.npy")
    want = _reference(model, [3, 4, 5, 6, 7])
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < (0.05 if quantization == "Q8_0" else 0.3) * scale  # the blocks' rounding


@pytest.mark.parametrize("engine", ["llama.cpp", "hf"])
def test_a_next_token_row_is_its_prompt_s_alone_whatever_came_before(pair, engine):
    """The exact referee's one pass per prompt: a row after other prompts (sharing a prefix or not) equals the
    row of a fresh cache bit for bit, so a problem's law does not depend on the problems before it (another
    worker's, a resumed run's). Feeding only the unshared tail changes llama.cpp's kernels (measured)."""
    from cactus_theory._models._llamacpp import LlamaCppModel
    from cactus_theory._models._prefix import NextTokenLogits

    model = LlamaCppModel(pair[2], sequences=2) if engine == "llama.cpp" else pair[0]
    shared = [5, 9, 14, 3, 7, 22, 8, 11, 30, 2, 6, 17, 4, 12, 19, 25]
    prompts = [[*shared, 40, 41, 42], [*shared, 43, 44], [7, 8, 9, 10] * 5, [*shared, 45, 46, 47, 48]]
    rows = NextTokenLogits(model)
    after_others = [rows(p) for p in prompts]
    rows.close()
    for prompt, got in zip(prompts, after_others, strict=True):
        alone = NextTokenLogits(model)
        np.testing.assert_array_equal(got, alone(prompt))
        alone.close()
        np.testing.assert_allclose(got, _reference(pair[0], prompt)[-1], atol=ATOL, rtol=0)
