"""Small random traces the tests build on disk: models' metadata, logits, traces with given ids and tasks, a
trace split into parts as ``--part`` dumps make them, and a row-by-row comparison of analyses."""

import numpy as np

from cactus_theory import SamplingSettings
from cactus_theory.traces import prompt_part, trace_from_arrays

SAMPLING = {"sampling": SamplingSettings(temperature=1.0, top_k=8, top_p=1.0).as_dict()}


def trace_metadata(**extra):
    return {
        "verifier": {"name": "v", "files": {"v.bin": {"sha256": "a" * 64, "bytes": 1}}},
        "draft": {"name": "d", "files": {"d.bin": {"sha256": "b" * 64, "bytes": 1}}},
        "tokenizer_sha256": "c" * 64,
        "seed": 0,
        **SAMPLING,
        **extra,
    }


def random_logits(rng, n, vocab=40):
    target = rng.normal(size=(n, vocab)) * 2
    draft = target + rng.normal(size=(n, vocab))
    return draft, target, rng.integers(0, vocab, size=n)


def random_trace(directory, seed, ids, tasks=None, metadata=None, lengths=None, shard_positions=None):
    rng = np.random.default_rng(seed)
    lengths = lengths or [int(x) for x in rng.integers(6, 15, size=len(ids))]
    draft, target, tokens = random_logits(rng, sum(lengths))
    trace = trace_from_arrays(
        directory,
        draft,
        target,
        tokens,
        sequence_lengths=lengths,
        ids=ids,
        tasks=tasks or ["math" if i % 2 else "code" for i in range(len(ids))],
        top_k=16,
        metadata=metadata or trace_metadata(),
    )
    return trace


def same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            assert x[key] == y[key] or (x[key] != x[key] and y[key] != y[key]), (key, x[key], y[key])


def split_parts(tmp_path, n=3):
    ids = [f"q-{i}" for i in range(12)]
    dirs = []
    for k in range(1, n + 1):
        mine = [i for i in ids if prompt_part(i, n) == k]
        d = tmp_path / f"part-{k}"
        random_trace(d, k, mine, metadata=trace_metadata(part=f"{k}/{n}", created=f"2026-01-0{k}"))
        dirs.append(str(d))
    return dirs


def long_answer_records(world, problems, decoded, m, seed, models=("a", "b")):
    """The sampled referee's records of answers kept with rows, made in an ``AnswerWorld``: one answer a method
    of ``decoded`` ({label: None or a rule}) to each of ``problems`` (problem indices) drawn from its exact law,
    graded by the world, its rows the world's log-probabilities at each position as raw logits (every token kept:
    the chain is top-k of the vocabulary at temperature 1, so the processed rows are the world's)."""
    from cactus_theory._analysis._answer_rows import sequence_rows

    settings = SamplingSettings(temperature=1.0, top_k=world.vocab, top_p=1.0)
    setting = {
        "sampling": settings.as_dict(),
        "m": m,
        "models": {
            "verifier": {"name": "v", "files": {"v.bin": {"sha256": models[0] * 64}}},
            "draft": {"name": "d", "files": {"d.bin": {"sha256": models[1] * 64}}},
        },
    }
    rng = np.random.default_rng(seed)
    out = []
    for label, method in decoded.items():
        answers = world.sample(method, m, np.asarray(problems), rng)
        for place, (i, a) in enumerate(zip(problems, answers, strict=True)):
            tokens = world.answers[a].tolist()
            rows = sequence_rows(np.log(world._q[i, a]), np.log(world._p[i, a]), tokens, world.vocab)
            out.append(
                {
                    "record": "cactus-theory evaluate",
                    "id": f"w-{place}",
                    "problem": f"{place:016x}",
                    "benchmark": "world",
                    "method": label,
                    "sample": 0,
                    "seed": 0,
                    "setting": setting,
                    "token_ids": tokens,
                    "tokens": len(tokens),
                    "text": "",
                    "correct": bool(world.correct[i, a]),
                    "extracted": None,
                    "detail": "",
                    "rows": rows,
                }
            )
    return out


def choice_records(count, seed):
    """Exact-referee records of ``count`` synthetic problems: each model's raw logits over 40 tokens at the answer
    position (kept whole: 40 of 40), the correct letter the verifier's likeliest token, the verifier alone's exact
    accuracy."""
    from cactus_theory._analysis._answer_rows import answer_rows
    from cactus_theory._analysis._referee_summary import EXACT_KIND
    from cactus_theory._math._sampling import SamplingSettings, processed_probs

    settings = SamplingSettings(temperature=1.0, top_k=10, top_p=1.0)
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        raw_q = rng.normal(0, 2.0, 40).astype(np.float32).astype(np.float64)
        raw_p = (raw_q + rng.normal(0, 1.5, 40)).astype(np.float32).astype(np.float64)
        correct = [int(np.argmax(raw_q))]  # the verifier's favourite: a rule that drifts to the drafter loses
        q = processed_probs(raw_q, settings)
        out.append(
            {
                "record": EXACT_KIND,
                "id": f"p{i}",
                "problem": f"digest{i}",
                "benchmark": "choice",
                "method": "verifier alone",
                "accuracy": float(q[correct].sum()),
                "kl": 0.0,
                "tv": 0.0,
                "rows": answer_rows(raw_q, raw_p, correct, 40),
                "setting": {"sampling": settings.as_dict()},
            }
        )
    return out
