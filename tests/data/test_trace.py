"""Trace format, sampling settings, imports, prompt loaders and the dumper (tiny models)."""

import json
import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from locations import FIXTURES
from optional import torch
from sampling_reference import reference_probs as _reference_probs
from tiny_models import tiny_model, tiny_tokenizer
from trace_builders import random_trace

from cactus_theory import Cactus, SpS, analyze_trace, step_metrics
from cactus_theory._cli import main
from cactus_theory._data._prompts import Prompt, mixed_prompts
from cactus_theory._data._trace_import import import_topk_logprobs, trace_from_arrays
from cactus_theory._data._trace_writer import TraceWriter
from cactus_theory._math._sampling import SamplingSettings, processed_probs
from cactus_theory._models._dump import dump_trace
from cactus_theory.traces import Trace, TraceError, TraceSequence, import_logits, load_prompts

DATA = FIXTURES / "benchmarks"  # made-up records in each benchmark's format


@pytest.mark.torch
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.0, 0.3, 0.6, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 3, 20]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
)
def test_processed_probs_match_the_definition(seed, temperature, top_k, top_p):
    logits = np.random.default_rng(seed).normal(0, 3, size=(4, 12))
    want = _reference_probs(logits, temperature, top_k, top_p)
    got = processed_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    got_t = processed_probs(torch.as_tensor(logits), temperature=temperature, top_k=top_k, top_p=top_p)
    np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-12, atol=1e-15)


@pytest.mark.torch
@given(
    seed=st.integers(0, 2**32 - 1),
    temperature=st.sampled_from([0.3, 0.6, 1.7]),
    top_k=st.sampled_from([1, 3, 20]),
    top_p=st.sampled_from([1.0, 0.95, 0.5]),
    masked=st.booleans(),
)
def test_processed_probs_with_a_small_top_k_of_a_large_vocabulary_match_the_definition(
    seed, temperature, top_k, top_p, masked
):
    """top-k far below the vocabulary takes the path that never sorts the whole row."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, size=(3, 700))
    if masked:
        logits[:, rng.integers(0, 700, size=300)] = -np.inf
    want = _reference_probs(logits, temperature, top_k, top_p)
    got = processed_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    got_t = processed_probs(torch.as_tensor(logits), temperature=temperature, top_k=top_k, top_p=top_p)
    np.testing.assert_allclose(got_t.numpy(), want, rtol=1e-12, atol=1e-15)
    got_f = processed_probs(
        torch.as_tensor(logits, dtype=torch.bfloat16), temperature=temperature, top_k=top_k, top_p=top_p
    )
    assert got_f.dtype == torch.float32 and abs(float(got_f.sum(-1).max()) - 1) < 1e-5


@pytest.mark.torch
def test_a_small_top_k_keeps_every_tie_with_the_k_th_logit():
    logits = np.full(1000, -3.0)
    logits[[10, 500, 900]] = 5.0  # three tied for the top: top-2 keeps all three
    logits[7] = 4.0
    for row in (logits, torch.as_tensor(logits)):
        got = np.asarray(processed_probs(row, temperature=1.0, top_k=2, top_p=1.0))
        want = np.zeros(1000)
        want[[10, 500, 900]] = 1 / 3
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
        # top-p 0.5 after them: the stable order (by index) keeps the first two of the tie
        got = np.asarray(processed_probs(row, temperature=1.0, top_k=2, top_p=0.5))
        want = np.zeros(1000)
        want[[10, 500]] = 0.5
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)


def test_sampling_settings_are_checked():
    with pytest.raises(ValueError, match="temperature must be"):
        SamplingSettings(temperature=-1)
    with pytest.raises(ValueError, match="top_p must lie in"):
        SamplingSettings(top_p=0)
    with pytest.raises(ValueError, match="top_k must be"):
        SamplingSettings(top_k=-2)
    with pytest.raises(ValueError, match="NaN"):
        processed_probs(np.array([[0.0, np.nan]]), temperature=1.0, top_k=0, top_p=1.0)


def _random_logits(seed, n=30, vocab=200):
    rng = np.random.default_rng(seed)
    base = rng.normal(0, 2.5, size=(n, vocab))
    return base + rng.normal(0, 1.0, size=(n, vocab)), base, rng.integers(vocab, size=n)


def test_round_trip_is_exact_for_recorded_settings(tmp_path):
    draft, target, tokens = _random_logits(0)
    trace = trace_from_arrays(tmp_path / "t", draft, target, tokens, sequence_lengths=[10, 20], top_k=32)
    full = trace_from_arrays(tmp_path / "f", draft, target, tokens, sequence_lengths=[10, 20], store_full=True)
    settings = SamplingSettings(temperature=0.6, top_k=20, top_p=0.95)
    for seq, seq_full in zip(trace, full, strict=True):
        p, q = seq.distributions(settings)
        p_full, q_full = seq_full.distributions(settings)
        for rule in (SpS(), Cactus(1.0)):
            a = step_metrics(rule, p, q)
            b = step_metrics(rule, p_full, q_full)
            np.testing.assert_allclose(a.acceptance, b.acceptance, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(a.kl_emitted_target, b.kl_emitted_target, rtol=1e-9, atol=1e-13)
            np.testing.assert_allclose(a.entropy_change, b.entropy_change, rtol=1e-9, atol=1e-12)
    assert trace.n_positions == 30 and len(trace) == 2


def test_the_kept_distributions_never_exceed_their_cap_the_oldest_going_first(tmp_path, monkeypatch):
    """``TraceSequence.KEPT_DISTRIBUTIONS_BYTES`` bounds what reading a trace of any size keeps: with room for
    two sequences' results, reading five keeps the last two (the same arrays come back) and not the first ones
    (computed again, equal)."""
    TraceSequence.forget_distributions()
    draft, target, tokens = _random_logits(0)
    trace = trace_from_arrays(tmp_path / "t", draft, target, tokens, sequence_lengths=[6] * 5, top_k=32)
    settings = SamplingSettings(temperature=1.0, top_k=20)
    seqs = list(trace)
    size = sum(a.nbytes for a in seqs[0].distributions(settings))  # every sequence's arrays have this size
    TraceSequence.forget_distributions()
    monkeypatch.setattr(TraceSequence, "KEPT_DISTRIBUTIONS_BYTES", 2 * size)
    first = [seq.distributions(settings) for seq in seqs]
    again = [seq.distributions(settings) for seq in seqs[3:]]
    assert all(a[0] is b[0] and a[1] is b[1] for a, b in zip(first[3:], again, strict=True))  # kept
    redone = seqs[0].distributions(settings)
    assert redone[0] is not first[0][0]  # dropped: computed again ...
    np.testing.assert_array_equal(redone[0], first[0][0])  # ... to the same values
    TraceSequence.forget_distributions()


def test_lumped_tail_error_is_bounded_by_the_tail_mass(tmp_path):
    """No top-k at temperature 1: each model's mass outside its own top-K becomes one bucket.
    Acceptance is 1 - TV(p, q), and moving at most a tail's mass changes TV by at most that mass,
    so |lumped - exact| <= tail(p) + tail(q). The test also reports how small it is in practice."""
    draft, target, tokens = _random_logits(1, vocab=300)
    trace = trace_from_arrays(tmp_path / "t", draft, target, tokens, top_k=16)
    full = trace_from_arrays(tmp_path / "f", draft, target, tokens, store_full=True)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
    (seq,), (seq_full,) = list(trace), list(full)
    p, q = seq.distributions(settings)
    p_full, q_full = seq_full.distributions(settings)
    lumped = step_metrics(SpS(), p, q).acceptance
    exact = step_metrics(SpS(), p_full, q_full).acceptance
    tail = p[:, -1] + q[:, -1]
    assert np.all(np.abs(lumped - exact) <= tail + 1e-12)
    assert np.max(np.abs(lumped - exact)) < 0.5 * np.max(tail)  # well inside the bound here
    with pytest.raises(TraceError, match="need the tail's shape"):
        seq.distributions(temperature=0.7, top_k=0, top_p=1.0)


def test_resume_after_a_crash_loses_nothing(tmp_path):
    draft, target, tokens = _random_logits(2, n=40)
    parts = [(f"s{i}", slice(10 * i, 10 * i + 10)) for i in range(4)]
    directory = tmp_path / "t"
    with pytest.raises(RuntimeError):
        with TraceWriter(directory, 200, top_k=8, shard_positions=10) as writer:
            for sid, sl in parts[:3]:
                writer.add(sid, "x", tokens[sl], target[sl], draft[sl])
            raise RuntimeError("killed")
    writer = TraceWriter(directory, 200, top_k=8, shard_positions=10)
    assert writer.done_ids == {"s0", "s1", "s2"}  # each was a complete shard
    for sid, sl in parts:
        if sid not in writer.done_ids:
            writer.add(sid, "x", tokens[sl], target[sl], draft[sl])
    writer.close()
    one_shot = trace_from_arrays(tmp_path / "o", draft, target, tokens, sequence_lengths=[10] * 4, top_k=8)
    for a, b in zip(Trace(directory), one_shot, strict=True):
        np.testing.assert_array_equal(a.topk_logits["target"], b.topk_logits["target"])
        np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not [f for f in os.listdir(directory) if f.endswith(".tmp")]


def test_damaged_traces_give_clear_errors(tmp_path):
    draft, target, tokens = _random_logits(3)
    directory = tmp_path / "t"
    trace_from_arrays(directory, draft, target, tokens, top_k=8)
    shard = directory / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="sha256"):
        Trace(directory)
    shard.write_bytes(bytes(data[:-100]))
    with pytest.raises(TraceError, match="truncated"):
        Trace(directory)
    shard.unlink()
    with pytest.raises(TraceError, match="missing"):
        Trace(directory)
    (directory / "manifest.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace(directory)
    with pytest.raises(TraceError, match=r"no manifest\.json"):
        Trace(tmp_path)
    with pytest.raises(TraceError, match="does not exist"):
        Trace(tmp_path / "nowhere")


def test_vocabulary_and_resume_mismatches(tmp_path):
    draft, target, tokens = _random_logits(4)
    with pytest.raises(TraceError, match="draft vocabulary 199 != verifier vocabulary 200"):
        trace_from_arrays(tmp_path / "a", draft[:, :199], target, tokens)
    trace_from_arrays(tmp_path / "b", draft, target, tokens, top_k=8)
    with pytest.raises(TraceError, match="cannot resume"):
        TraceWriter(tmp_path / "b", 200, top_k=16)
    with pytest.raises(TraceError, match="NaN"):
        bad = target.copy()
        bad[3, 4] = np.nan
        trace_from_arrays(tmp_path / "c", draft, bad, tokens)


@pytest.mark.torch
def test_imports_from_files(tmp_path):
    draft, target, tokens = _random_logits(5)
    np.savez(tmp_path / "x.npz", draft_logits=draft, target_logits=target, tokens=tokens, sequence_lengths=[12, 18])
    a = import_logits(tmp_path / "x.npz", tmp_path / "a", top_k=8)
    torch.save(
        {
            "draft_logits": torch.as_tensor(draft),
            "target_logits": torch.as_tensor(target),
            "tokens": torch.as_tensor(tokens),
        },
        tmp_path / "x.pt",
    )
    b = import_logits(tmp_path / "x.pt", tmp_path / "b", top_k=8)
    np.save(tmp_path / "x.npy", np.stack([draft, target]))
    c = import_logits(tmp_path / "x.npy", tmp_path / "c", top_k=8, tokens=tokens)
    assert len(a) == 2 and len(b) == 1 and c.n_positions == 30
    with pytest.raises(TraceError, match="unsupported extension"):
        import_logits(tmp_path / "x.csv", tmp_path / "d")


def test_topk_logprob_lists_flag_an_unknown_tail(tmp_path):
    draft, target, tokens = _random_logits(6, n=5, vocab=50)

    def lists(logits):
        lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        return [[{int(j): float(row[j]) for j in np.argsort(-row)[:25]} for row in lp]]

    trace = import_topk_logprobs(tmp_path / "v", lists(draft), lists(target), [tokens], vocab_size=50)
    assert trace.manifest["tail_known"] is False
    (seq,) = list(trace)
    p, _ = seq.distributions(temperature=0.6, top_k=20, top_p=0.95)  # exact: top_k <= 25
    p_ref = processed_probs(draft, temperature=0.6, top_k=20, top_p=0.95)
    np.testing.assert_allclose(
        np.sort(p, axis=-1)[:, ::-1][:, :20], np.sort(p_ref, axis=-1)[:, ::-1][:, :20], atol=1e-6
    )
    with pytest.raises(TraceError, match="does not know"):
        seq.distributions(temperature=1.0, top_k=0, top_p=1.0)


def test_prompt_loaders_read_every_benchmark():
    files = {
        "gsm8k": "gsm8k/test.jsonl",
        "humaneval": "humaneval/HumanEval.jsonl.gz",
        "mbpp": "mbpp/mbpp.jsonl",
        "mt_bench": "mt_bench/question.jsonl",
        "spec_bench": "spec_bench/question.jsonl",
    }
    for name, rel in files.items():
        prompts = load_prompts(DATA / rel, dataset=name, limit=3)
        assert [p.id for p in prompts] == [f"{name}-{i}" for i in range(3)]
        assert all(len(p.text) > 10 and len(p.source["sha256"]) == 64 for p in prompts)
    assert load_prompts(DATA / files["gsm8k"], dataset="gsm8k")[0].text.endswith("give the final answer after '####'.")
    assert "```python\ndef add(a: int" in load_prompts(DATA / files["humaneval"], dataset="humaneval")[0].text
    assert "assert larger(2, 5) == 5" in load_prompts(DATA / files["mbpp"], dataset="mbpp")[0].text
    mixed = mixed_prompts(DATA, {"gsm8k": 2, "humaneval": 2})
    assert [p.task for p in mixed] == ["gsm8k", "humaneval", "gsm8k", "humaneval"]
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(DATA / "nowhere.jsonl")


def test_a_missing_benchmark_file_says_where_to_get_it(tmp_path, monkeypatch):
    from cactus_theory._data._prompts import benchmark_file, data_directory

    monkeypatch.setenv("CACTUS_THEORY_DATA", str(tmp_path / "data"))
    assert data_directory() == str(tmp_path / "data")
    assert data_directory(DATA) == str(DATA)
    with pytest.raises(
        ValueError, match=r"gsm8k: .*test.jsonl does not exist. Download github.com/openai/grade-school"
    ):
        mixed_prompts(None, {"gsm8k": 1})
    monkeypatch.delenv("CACTUS_THEORY_DATA")
    assert data_directory().endswith(os.path.join("cactus_theory", "data")) or "CACTUS_THEORY_CACHE" in os.environ
    assert benchmark_file("mbpp", DATA) == str(DATA / "mbpp" / "mbpp.jsonl")


def test_the_dataset_is_chosen_never_guessed(tmp_path):
    path = tmp_path / "humaneval_questions.jsonl"  # a path naming a benchmark no longer wraps the prompts
    path.write_text('{"question": "1 + 1?"}\n')
    (prompt,) = load_prompts(path)
    assert prompt.text == "1 + 1?" and prompt.task == "humaneval_questions" and prompt.id == "humaneval_questions-0"
    assert load_prompts(path, dataset="gsm8k")[0].text.startswith("1 + 1?\nSolve the problem")
    with pytest.raises(ValueError, match=r"line 1: not a mt_bench record .* leave out --dataset"):
        load_prompts(path, dataset="mt_bench")


@pytest.mark.models
def test_dump_with_tiny_models_is_consistent_and_resumes(tmp_path):
    tokenizer = tiny_tokenizer()
    verifier, draft = tiny_model(0), tiny_model(1, layers=1)
    prompts = [
        Prompt(id=f"p{i}", task="toy", text=" ".join(f"t{(3 * i + j) % 60 + 2}" for j in range(5)), index=i)
        for i in range(3)
    ]
    settings = SamplingSettings(temperature=0.8, top_k=10, top_p=0.95)
    out = tmp_path / "trace"

    def dump(batch, **extra):
        return dump_trace(
            (verifier, tokenizer),
            (draft, tokenizer),
            batch,
            out,
            settings=settings,
            max_new_tokens=6,
            top_k=16,
            store_full=True,
            progress=False,
            **extra,
        )

    n = dump(prompts[:2], shard_positions=1).written_positions
    assert n > 0
    trace = Trace(out)
    assert trace.metadata["sampling"] == settings.as_dict()
    for seq, prompt in zip(trace, prompts, strict=False):
        ids = tokenizer(prompt.text)["input_ids"]
        # the verifier's cached logits equal a fresh forward pass on the same prefix
        with torch.no_grad():
            fresh = verifier(input_ids=torch.tensor([ids + list(seq.tokens[:-1])])).logits[0, len(ids) - 1 :].float()
        np.testing.assert_allclose(seq.full_logits["target"], fresh.numpy(), rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            fresh = draft(input_ids=torch.tensor([ids + list(seq.tokens[:-1])])).logits[0, len(ids) - 1 :].float()
        np.testing.assert_allclose(seq.full_logits["draft"], fresh.numpy(), atol=1e-5)
        assert seq.meta["source"]["dataset"] == "toy"
    more = dump(prompts)
    assert len(Trace(out)) == 3 and more.written_positions == Trace(out).n_positions - n  # only the new prompt
    assert (more.written_prompts, more.trace_prompts, more.trace_positions) == (1, 3, Trace(out).n_positions)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metadata"]["versions"]["torch"] == torch.__version__
    assert manifest["metadata"]["teacher_forced"] is False

    # teacher-forced on the sampled tokens: nothing is sampled, and both models' logits equal the
    # sampled trace's (KV-cache generation vs one forward pass over the whole sequence)
    sampled = {seq.id: seq for seq in Trace(out)}
    forced = tmp_path / "forced"
    dump_trace(
        (verifier, tokenizer),
        (draft, tokenizer),
        prompts,
        forced,
        completions={k: list(seq.tokens) for k, seq in sampled.items()},
        settings=settings,
        max_new_tokens=6,
        top_k=16,
        store_full=True,
        progress=False,
    )
    forced_trace = Trace(forced)
    assert forced_trace.metadata["teacher_forced"] is True
    for seq in forced_trace:
        np.testing.assert_array_equal(seq.tokens, sampled[seq.id].tokens)
        for side in ("target", "draft"):
            np.testing.assert_allclose(seq.full_logits[side], sampled[seq.id].full_logits[side], rtol=1e-4, atol=1e-4)


@pytest.mark.models
@pytest.mark.parametrize(
    "completions, message",
    [
        ({"p0": [3, 4]}, "no tokens for 1 prompt"),
        ({"p0": [3, 4], "p1": []}, "non-empty 1-D"),
        ({"p0": [3, 4], "p1": [2.5]}, "integer token ids"),
        ({"p0": [3, 4], "p1": [5] * 7}, "more than max_new_tokens=6"),
        ({"p0": [3, 4], "p1": [10**6]}, "outside the verifier's vocabulary"),
    ],
)
def test_dump_rejects_bad_completions(tmp_path, completions, message):
    tokenizer = tiny_tokenizer()
    prompts = [Prompt(id=f"p{i}", task="toy", text="t2 t3", index=i) for i in range(2)]
    with pytest.raises(ValueError, match=message):
        dump_trace(
            (tiny_model(0), tokenizer),
            (tiny_model(1, layers=1), tokenizer),
            prompts,
            tmp_path / "t",
            completions=completions,
            max_new_tokens=6,
            progress=False,
        )


def test_dump_checks_limit_before_loading_the_models(tmp_path):
    prompts = [Prompt(id="p0", task="toy", text="t2 t3", index=0)]
    missing = str(tmp_path / "no-such-model.gguf")  # loading it would fail with another message
    with pytest.raises(ValueError, match="limit must be an integer >= 0"):
        dump_trace(missing, missing, prompts, tmp_path / "t", limit=-1, progress=False)
    assert not (tmp_path / "t").exists()


def test_analysis_matches_a_direct_computation_and_the_cli(tmp_path, capsys):
    from cactus_theory import analyze_trace
    from cactus_theory._analysis._outputs import write_outputs
    from cactus_theory.traces import parse_rules

    draft, target, tokens = _random_logits(7, n=60, vocab=120)
    tasks = ["gsm8k", "humaneval", "gsm8k"]
    trace = trace_from_arrays(
        tmp_path / "t",
        draft,
        target,
        tokens,
        sequence_lengths=[20, 15, 25],
        tasks=tasks,
        top_k=32,
        metadata={"sampling": SamplingSettings().as_dict()},
    )
    rules = parse_rules("sps,cactus,mentored", deltas=[0.5])
    result = analyze_trace(trace, rules, ms=(4,), n_boot=200, progress=False)
    # direct: per position metrics on each sequence, then AL over block starts, pooled over sequences
    direct_al, starts, acc, n = 0.0, 0, 0.0, 0
    for seq in trace:
        p, q = seq.distributions(SamplingSettings())
        sm = step_metrics(Cactus(0.5), p, q)
        from cactus_theory import expected_accepted_length

        al = expected_accepted_length(sm.acceptance, 4)[: seq.n_positions - 3]
        direct_al, starts = direct_al + al.sum(), starts + al.size
        acc, n = acc + sm.acceptance.sum(), n + seq.n_positions
    row = next(r for r in result.rows if r["rule"] == "cactus(delta=0.5)" and r["task"] == "all")
    np.testing.assert_allclose(row["al"], direct_al / starts, rtol=1e-12)
    np.testing.assert_allclose(row["acceptance"], acc / n, rtol=1e-12)
    assert row["al_lo"] <= row["al"] <= row["al_hi"]
    assert {r["task"] for r in result.rows} == {"all", "gsm8k", "humaneval"}
    sps = next(r for r in result.rows if r["rule"] == "sps" and r["task"] == "all")
    assert abs(sps["kl_emitted_target"]) < 1e-12  # lossless
    paths = write_outputs(result, str(tmp_path / "out"))
    assert len(paths) == 5  # csv, json, three figures (two tasks: the per-task one too)
    assert (
        main(["analyze", str(tmp_path / "t"), "--rules", "sps,tas", "--m", "4", "--quiet", "--bootstrap", "100"]) == 0
    )
    assert "tas" in capsys.readouterr().out
    with pytest.raises(ValueError, match="unknown rule"):
        parse_rules("cactus,speculative")


@pytest.mark.models
def test_dump_from_gguf_files_written_with_the_gguf_package(tmp_path):
    from tiny_models import write_tiny_gguf

    verifier, draft = tiny_model(2), tiny_model(3, layers=1)
    v_path = write_tiny_gguf(verifier, tmp_path / "verifier.gguf")
    d_path = write_tiny_gguf(draft, tmp_path / "draft.gguf")
    prompt = Prompt(id="g0", task="toy", text="ab cd ef", index=0)
    settings = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)
    n = dump_trace(
        str(v_path),
        str(d_path),
        [prompt],
        tmp_path / "trace",
        settings=settings,
        max_new_tokens=5,
        top_k=16,
        store_full=True,
        progress=False,
    )
    trace = Trace(tmp_path / "trace")
    (seq,) = list(trace)
    assert n.written_positions == seq.n_positions and trace.metadata["verifier"]["files"]["verifier.gguf"]
    from cactus_theory._models._hf import encode_chat, load_model

    _, tok, _ = load_model(str(v_path))
    ids = encode_chat(tok, prompt.text)
    with torch.no_grad():  # the GGUF weights are the HF model's: same logits as the original
        fresh = verifier(input_ids=torch.tensor([ids + list(seq.tokens[:-1])])).logits[0, len(ids) - 1 :]
    np.testing.assert_allclose(seq.full_logits["target"], fresh.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.models
def test_cli_dump_teacher_forced_on_a_completions_file(tmp_path, capsys):
    from tiny_models import write_tiny_gguf

    from cactus_theory._models._hf import encode_chat, load_model

    verifier, draft = tiny_model(4), tiny_model(5, layers=1)
    v_path = write_tiny_gguf(verifier, tmp_path / "verifier.gguf")
    d_path = write_tiny_gguf(draft, tmp_path / "draft.gguf")
    questions = tmp_path / "gsm8k.jsonl"
    questions.write_text('{"question": "ab cd"}\n{"question": "ef gh ab"}\n{"question": "cd"}\n')
    forced_tokens = {"gsm8k-0": [5, 9, 1], "gsm8k-2": [7, 7, 7, 3]}
    completions = tmp_path / "completions.jsonl"
    completions.write_text("".join(json.dumps({"id": k, "token_ids": v}) + "\n" for k, v in forced_tokens.items()))
    args = ["dump", "--verifier", str(v_path), "--draft", str(d_path), "--prompts", str(questions)]
    args += ["--completions", str(completions), "--max-new-tokens", "8", "--full-rows", "--dtype", "float32"]
    args += ["--out", str(tmp_path / "t")]
    assert main(args) == 0
    assert "1 prompt(s) without a completion skipped" in capsys.readouterr().out
    trace = Trace(tmp_path / "t")
    assert trace.metadata["teacher_forced"] is True and trace.metadata["max_new_tokens"] == 8
    _, tok, _ = load_model(str(v_path))
    texts = {"gsm8k-0": "ab cd", "gsm8k-2": "cd"}
    assert sorted(seq.id for seq in trace) == sorted(forced_tokens)
    for seq in trace:
        assert list(seq.tokens) == forced_tokens[seq.id]
        ids = encode_chat(tok, load_prompts(questions)[int(seq.id[-1])].text)
        assert load_prompts(questions)[int(seq.id[-1])].text.startswith(texts[seq.id])
        for side, model in (("target", verifier), ("draft", draft)):
            with torch.no_grad():
                fresh = model(input_ids=torch.tensor([ids + forced_tokens[seq.id][:-1]])).logits[0, len(ids) - 1 :]
            np.testing.assert_allclose(seq.full_logits[side], fresh.numpy(), rtol=1e-4, atol=1e-4)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "gsm8k-0", "token_ids": [1]}\n{"id": "gsm8k-0"}\n')
    base = args[:7]  # dump --verifier V --draft D --prompts FILE
    assert main([*base, "--completions", str(bad), "--out", str(tmp_path / "t2")]) != 0
    assert "bad.jsonl, line 2: expected a JSON object with 'id' and 'token_ids'" in capsys.readouterr().err
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text('{"id": "mbpp-0", "token_ids": [1]}\n')
    assert main([*base, "--completions", str(unknown), "--out", str(tmp_path / "t3")]) != 0
    assert "--completions: 1 id(s) match no prompt, e.g. ['mbpp-0']" in capsys.readouterr().err


def test_report_on_a_small_trace(tmp_path):

    draft, target, tokens = _random_logits(8, n=40, vocab=100)
    trace_from_arrays(
        tmp_path / "t",
        draft,
        target,
        tokens,
        sequence_lengths=[20, 20],
        tasks=["gsm8k", "mt_bench"],
        top_k=32,
        metadata={"sampling": SamplingSettings().as_dict()},
    )
    assert main(["report", "--trace", str(tmp_path / "t"), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    # the per-task figure too (two tasks), and the GPU-like plan (no calibration of this pair exists)
    assert md.count("![") == 11 and "cactus(delta=1)" in md and "plan_gpu_profile.png" in md
    assert "multi_draft.png" in md and "optimum (i.i.d.)" in md
    assert "block_verification.png" in md and "| block vs sps |" in md
    assert "## Predicted speedups" in md and "No calibration of this trace's model pair" in md
    assert "Every rule at the paper grid's parameters" in md and "`rfsd(divergence=js, threshold=0.3)`" in md
    html = (tmp_path / "r" / "report.html").read_text()
    assert "data:image/png;base64," in html
    # tables are tables: no Markdown pipe rows in the HTML, outside the fixed-width text blocks
    outside_pre = [part.split("</pre>", 1)[-1] for part in html.split("<pre>")]
    assert not any(line.lstrip().startswith("|") for part in outside_pre for line in part.splitlines())
    assert html.count("<table>") >= 5 and "Where the time went" in html
    # the independent sections ran in a second process where the machine has two cores, here otherwise
    meanwhile = " (on the other core, meanwhile)" if (os.cpu_count() or 1) >= 2 else ""
    assert "## Where the time went" in md and f"| Gamma(delta): worst-case search{meanwhile} |" in md


def test_a_checksum_failure_names_the_trace_directory(tmp_path):
    trace = random_trace(tmp_path / "t", 1, ["a", "b"])
    shard = os.path.join(trace.directory, trace.manifest["shards"][0]["file"])
    with open(shard, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    with pytest.raises(TraceError, match=r"shard-00000.safetensors of '.*/t' fails its sha256"):
        Trace(trace.directory)


def test_manifest_flags_and_sampling_are_type_checked(tmp_path):
    random_trace(tmp_path / "t", 0, ["a", "b"])
    path = tmp_path / "t" / "manifest.json"
    good = json.loads(path.read_text())
    for key, value, match in (
        ("tail_known", "no", "tail_known must be true or false"),
        ("store_full", 1, "store_full must be true or false"),
    ):
        path.write_text(json.dumps({**good, key: value}))
        with pytest.raises(TraceError, match=match):
            Trace(tmp_path / "t")
    for sampling, match in (
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"top_k": [20]}, "top_k must be an integer"),
        ({"tempreature": 1.0}, "unknown field"),
        ("greedy", "must be an object"),
    ):
        path.write_text(json.dumps({**good, "metadata": {**good["metadata"], "sampling": sampling}}))
        with pytest.raises(TraceError, match=f"metadata.sampling.*{match}"):
            analyze_trace(tmp_path / "t", ["sps"], ms=(2,), n_boot=0)
