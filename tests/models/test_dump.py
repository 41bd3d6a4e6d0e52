"""Dumping traces from models: an interrupted dump says so and its rerun says it resumes; a GGUF load says
it dequantises and what that costs."""

import numpy as np
import pytest

from cactus_theory._cli import main
from cactus_theory.traces import Trace


@pytest.mark.models
def test_an_interrupted_dump_says_so_and_the_rerun_says_it_resumes(
    tmp_path, capsys, gguf_pair, monkeypatch, mixed_prompt_file
):
    import cactus_theory._models._dump as dump

    v, d = gguf_pair
    path = mixed_prompt_file
    argv = [
        "dump",
        "--verifier",
        v,
        "--draft",
        d,
        "--prompts",
        str(path),
        "--max-new-tokens",
        "5",
        "--out",
        str(tmp_path / "t"),
        "--quiet",
    ]
    real, calls = dump._finish, []

    def stop_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C as the second prompt completes
        return real(*args, **kwargs)

    monkeypatch.setattr(dump, "_finish", stop_on_the_second)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped after 1 prompt(s) of this run" in err and "1 of 4 prompts are in" in err
    assert "rerun the same command to resume" in err
    monkeypatch.setattr(dump, "_finish", real)
    assert main(argv) == 0
    captured = capsys.readouterr()
    held = Trace(tmp_path / "t")
    assert f"resuming {tmp_path / 't'}: 1 of 4 prompts done" in captured.err
    assert f"the trace holds 4 prompts, {held.n_positions:,} positions" in captured.err


@pytest.mark.models
def test_a_gguf_load_says_it_dequantises_and_what_it_costs(tmp_path, capsys, gguf_pair):
    from cactus_theory.hf import load_model

    load_model(gguf_pair[1], cache=False, progress=True)
    err = capsys.readouterr().err
    assert "dequantising draft.gguf" in err and "GiB of memory" in err and "--no-model-cache" in err
    help_text = " ".join(main.__globals__["build_parser"]().format_help().split())
    assert "compare" in help_text


# --- batched dumps -------------------------------------------------------------------------------

PROMPTS = [
    # lengths 2..6, and a prompt whose continuation ends early (t1 is the tiny tokenizer's end token)
    {"id": f"b{i}", "text": " ".join(f"t{(7 * i + j) % 60 + 2}" for j in range(2 + i % 5))}
    for i in range(9)
]


def _prompts(rows=PROMPTS):
    from cactus_theory._data._prompts import Prompt

    return [Prompt(id=r["id"], task="toy", text=r["text"], index=i) for i, r in enumerate(rows)]


def _dump(out, prompts, **kw):
    from tiny_models import tiny_model, tiny_tokenizer

    from cactus_theory import SamplingSettings
    from cactus_theory.traces import dump_trace

    args = {
        "settings": SamplingSettings(temperature=1.0, top_k=20, top_p=0.9),
        "max_new_tokens": 7,
        "top_k": 16,
        "progress": False,
        "seed": 5,
    }
    args.update(kw)
    return dump_trace(
        (tiny_model(0), tiny_tokenizer()), (tiny_model(1, layers=1), tiny_tokenizer()), prompts, out, **args
    )


def _by_id(path):
    return {s.id: s for s in Trace(path)}


def _close(a, b):
    """Two traces of the same prompts: the same tokens and top-K ids, logits and log-sum-exps equal to
    float32 rounding (the batch's shapes change the rounding of the products, ~1e-7 relative)."""
    a, b = _by_id(a), _by_id(b)
    assert sorted(a) == sorted(b)
    for key, s in a.items():
        t = b[key]
        np.testing.assert_array_equal(s.tokens, t.tokens)
        for role in ("target", "draft"):
            np.testing.assert_array_equal(s.topk_ids[role], t.topk_ids[role])
            np.testing.assert_allclose(s.topk_logits[role], t.topk_logits[role], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(s.lse[role], t.lse[role], rtol=1e-6, atol=1e-5)


@pytest.mark.models
@pytest.mark.parametrize("batch", [2, 3, 16])
def test_a_batched_dump_equals_the_batch_of_one(tmp_path, batch):
    one = _dump(tmp_path / "one", _prompts(), batch=1)
    many = _dump(tmp_path / "many", _prompts(), batch=batch)
    assert many.written_positions == one.written_positions and many.written_prompts == 9
    _close(tmp_path / "one", tmp_path / "many")
    meta = Trace(tmp_path / "many").metadata
    assert (meta["batch"], meta["device"], meta["prefill_group"]) == (batch, "cpu", max(1, batch // 8))
    assert meta["sampler"].startswith("splitmix64")


@pytest.mark.models
def test_a_prompts_trace_does_not_depend_on_its_batch_mates(tmp_path):
    mine = _prompts()[4]
    _dump(tmp_path / "alone", [mine], batch=4)
    others = [p for p in _prompts() if p.id != mine.id]
    _dump(tmp_path / "among", [*others[:5][::-1], mine, *others[5:]], batch=4)  # other company, other order
    alone, among = _by_id(tmp_path / "alone")[mine.id], _by_id(tmp_path / "among")[mine.id]
    np.testing.assert_array_equal(alone.tokens, among.tokens)
    np.testing.assert_allclose(alone.topk_logits["target"], among.topk_logits["target"], rtol=1e-5, atol=1e-5)


@pytest.mark.models
def test_a_free_slot_takes_the_next_prompt_at_once(tmp_path, monkeypatch):
    """Sequences of different lengths in 2 slots: the batch stays full until the prompts run out (the
    count of running sequences never rises again once it falls), and every prompt is dumped."""
    import cactus_theory._models._dump as dump

    running, real = [], dump._step

    def step(session, live, *args):
        running.append(len(live))
        return real(session, live, *args)

    monkeypatch.setattr(dump, "_step", step)
    monkeypatch.setattr(dump, "eos_ids", lambda model, tokenizer: set(range(2, 22)))  # ends at random places
    summary = _dump(tmp_path / "t", _prompts(), batch=2, max_new_tokens=6)
    lengths = sorted(s.n_positions for s in Trace(tmp_path / "t"))
    assert summary.written_prompts == 9 and len(set(lengths)) > 1  # the sequences end at different steps
    assert running == sorted(running, reverse=True) and running[0] == 2
    assert len(running) < sum(lengths)  # two at a time


@pytest.mark.models
def test_a_resume_keeps_the_traces_batch_and_refuses_another(tmp_path):
    from cactus_theory.traces import TraceError

    _dump(tmp_path / "t", _prompts(), batch=3, limit=4)
    with pytest.raises(TraceError, match=r"cannot resume .*its batch is 3, this run has 2"):
        _dump(tmp_path / "t", _prompts(), batch=2)
    summary = _dump(tmp_path / "t", _prompts())  # no batch given: the trace's
    assert summary.written_prompts == 5 and Trace(tmp_path / "t").metadata["batch"] == 3
    _dump(tmp_path / "straight", _prompts(), batch=3)
    a, b = _by_id(tmp_path / "t"), _by_id(tmp_path / "straight")
    for key, s in a.items():  # the same bits as a run straight through
        np.testing.assert_array_equal(s.tokens, b[key].tokens)
        np.testing.assert_array_equal(s.topk_logits["target"], b[key].topk_logits["target"])
        np.testing.assert_array_equal(s.lse["draft"], b[key].lse["draft"])
