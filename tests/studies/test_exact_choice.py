"""The exact quality referee: each token rule's expected accuracy at the answer position against a brute-force
enumeration of the draft and of the acceptance outcomes (written out step by step from the rule's acceptance
and correction), the lossless rule's difference exactly 0, the sampled referee on the same problems agreeing
within its Monte Carlo error on a tiny pair, records resumed and summarised from the file alone, the command
line, and a cluster of two workers giving what one process gives, bit for bit."""

import json

import numpy as np
import pytest
from locations import FIXTURES
from optional import torch  # noqa: F401  (the models extra)

from cactus_theory import SamplingSettings, make_rule
from cactus_theory._analysis._referee_summary import read_exact_records, summarize_exact
from cactus_theory._analysis._rescore import exact_answer_accuracy
from cactus_theory._data._graders import load_problems
from cactus_theory._rules._protocol import judgement_of
from cactus_theory._studies._exact_choice import exact_choice_referee, letter_token_ids
from cactus_theory._util._study import RUN_SECONDS
from cactus_theory.testing import conformance_rules, make_case

TOKEN_RULES = [r for r in conformance_rules() if judgement_of(r).per_token]
SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


def _brute_force(rule, p, q, correct, logits):
    """P(the emitted token is in ``correct``): the drafted token n ~ p, accepted with the rule's acceptance
    a_n (then n is emitted), else a token of its correction r_n: sum_n p(n) [a_n 1{n in C} + (1 - a_n) r_n(C)],
    every draft enumerated (a drafter of no probability at n drafts it never)."""
    total = 0.0
    for n in range(p.shape[-1]):
        if p[n] == 0:
            continue
        a = float(np.asarray(rule.acceptance(p, q, n, logits=logits)))
        r = np.asarray(rule.correction(p, q, n, logits=logits), dtype=np.float64)
        total += p[n] * (a * (n in correct) + (1 - a) * r[list(correct)].sum())
    return total


@pytest.mark.parametrize("rule", TOKEN_RULES, ids=[r.describe() for r in TOKEN_RULES])
def test_the_exact_accuracy_is_the_brute_force_law_of_every_token_rule(rule):
    for seed in range(6):
        p, q, logits = make_case(seed, 7)
        correct = [seed % 7, (seed + 3) % 7]
        got = exact_answer_accuracy(rule, p, q, correct, logits=logits)
        want = _brute_force(rule.at_slot(0), np.asarray(p), np.asarray(q), correct, logits)
        assert got["accuracy"] == pytest.approx(want, rel=1e-9, abs=1e-12), (rule.describe(), seed)
    alone = exact_answer_accuracy(None, p, q, correct)
    assert alone["accuracy"] == pytest.approx(float(np.asarray(q)[correct].sum() / np.asarray(q).sum()), abs=1e-15)


def test_block_and_tree_rules_are_refused():
    p = q = np.ones(4) / 4
    for spec in ("block", "rrs(k=2)"):
        with pytest.raises(ValueError, match="needs a token rule's law"):
            exact_answer_accuracy(make_rule(spec), p, q, [0])


@pytest.mark.models
def test_the_letters_tokens_read_as_the_letter(gguf_pair):
    from cactus_theory._models._hf import load_model

    _, tokenizer, _ = load_model(gguf_pair[0], dtype="float32", cache=False)
    letters = letter_token_ids(tokenizer, "AB")
    for letter, ids in letters.items():
        assert ids and all(tokenizer.decode([i]).strip() == letter for i in ids)


def _choices(tmp_path, count, offset=0):
    """``count`` four-choice questions on the tiny models' alphabet (their answer letters vary)."""
    path = tmp_path / f"choices{offset}.jsonl"
    rows = [
        {"question": f"ab cd {i + offset}", "choices": ["ab", "cd", "ef", "gh"], "answer": "ABCD"[(i + offset) % 4]}
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_pair(gguf_pair):
    from cactus_theory._models._hf import load_model

    return load_model(gguf_pair[0], dtype="float32", cache=False), load_model(
        gguf_pair[1], dtype="float32", cache=False
    )


RULES = ["sps", "cactus(delta=1)", "lossy(alpha=0.5)", "always-accept"]


def _same(a, b) -> bool:
    """Rows equal bit for bit, NaN equal to NaN (an interval there is none of: an infinite drift's)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.models
def test_sampled_decoding_agrees_with_the_exact_law_within_its_error(tiny_pair, tmp_path):
    """The sampled referee (one token at the answer position, K samples, the real decoders) on the same
    problems: each method's accuracy within 4 standard errors of the exact one."""
    from cactus_theory._studies._quality import evaluate_rules

    verifier, draft = tiny_pair
    problems = load_problems("choice", path=_choices(tmp_path, 4))
    exact = exact_choice_referee(verifier, draft, problems, RULES, settings=SETTINGS)
    k = 150
    sampled = evaluate_rules(
        verifier, draft, problems, RULES, m=2, settings=SETTINGS, max_new_tokens=1, samples=k, batch=4, drift=False
    )
    for method in ["verifier alone", *RULES]:
        want = np.mean([r["accuracy"] for r in exact if r["method"] == method])
        got = np.mean([r["correct"] for r in sampled if r["method"] == method])
        variance = np.mean([r["accuracy"] * (1 - r["accuracy"]) for r in exact if r["method"] == method])
        se = np.sqrt(variance / (k * len(problems)))
        assert abs(got - want) <= 4 * se + 1e-9, (method, got, want, se)
    rows = {r["method"]: r for r in summarize_exact(exact, n_boot=200).rows}
    assert rows["sps"]["difference"] == 0.0 and (rows["sps"]["low"], rows["sps"]["high"]) == (0.0, 0.0)
    assert rows["always-accept"]["tv"] > 0 and rows["sps"]["tv"] < 1e-12


@pytest.mark.models
def test_records_resume_and_the_summary_comes_from_the_file_alone(tiny_pair, tmp_path):
    verifier, draft = tiny_pair
    problems = load_problems("choice", path=_choices(tmp_path, 6))
    out = tmp_path / "exact.jsonl"
    first = exact_choice_referee(verifier, draft, problems[:3], RULES, settings=SETTINGS, out=out)
    everything = exact_choice_referee(verifier, draft, problems, RULES, settings=SETTINGS, out=out)
    assert everything[: len(first)] == first and len(everything) == 6 * 5
    assert _same(
        summarize_exact(read_exact_records(out), n_boot=300).rows, summarize_exact(everything, n_boot=300).rows
    )
    with pytest.raises(ValueError, match="holds records of another setting"):
        exact_choice_referee(verifier, draft, problems, RULES, settings=SamplingSettings(temperature=0.5), out=out)
    with pytest.raises(ValueError, match="one token to decide the grade"):
        exact_choice_referee(verifier, draft, load_problems("gsm8k", FIXTURES / "benchmarks"), RULES)


@pytest.mark.llamacpp
@pytest.mark.models
def test_the_command_line_runs_the_exact_referee_and_summarises_its_records(gguf_pair, tmp_path, capsys):
    from cactus_theory._cli import main

    out = tmp_path / "exact.jsonl"
    argv = [
        "evaluate",
        "--verifier",
        gguf_pair[0],
        "--draft",
        gguf_pair[1],
        "--engine",
        "llama.cpp",
        "--rule",
        "sps,cactus(delta=1)",
        "--benchmark",
        "choice",
        "--file",
        str(_choices(tmp_path, 3)),
        "--exact",
        "--threads",
        "1",
        "--bootstrap",
        "200",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| choice | verifier alone | 3 |" in table and "| choice | sps | 3 | " in table
    assert main(["evaluate", "--summarize", str(out), "--bootstrap", "200"]) == 0
    assert capsys.readouterr().out.strip() == table.split("records in")[0].strip()
    assert main([*argv[:9], "--benchmark", "gsm8k", "--data", str(FIXTURES / "benchmarks"), "--exact"]) == 2
    assert "--exact needs a benchmark where one token decides" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.models
def test_a_cluster_of_two_workers_gives_what_one_process_gives(gguf_pair, tiny_pair, tmp_path):
    from cactus_theory._analysis._engines import close_quietly, local_dask_cluster
    from cactus_theory._analysis._referee_summary import summarize_records
    from cactus_theory._studies._quality import evaluate_rules

    verifier, draft = tiny_pair
    problems = load_problems("choice", path=_choices(tmp_path, 6))
    options = {"dtype": "float32", "cache": False, "progress": False}
    kwargs = {"m": 2, "settings": SETTINGS, "max_new_tokens": 3, "samples": 2, "batch": 2, "drift": True}
    one = evaluate_rules(verifier, draft, problems, RULES[:2], **kwargs)
    exact_one = exact_choice_referee(verifier, draft, problems, RULES, settings=SETTINGS)
    client, cluster = local_dask_cluster(2)
    try:
        out = tmp_path / "cluster.jsonl"
        spread = evaluate_rules(*gguf_pair, problems, RULES[:2], client=client, load_options=options, out=out, **kwargs)
        exact_spread = exact_choice_referee(
            *gguf_pair, problems, RULES, client=client, load_options=options, settings=SETTINGS
        )
    finally:
        close_quietly(client, cluster)
    strip = lambda recs: [{k: v for k, v in r.items() if k not in ("record", RUN_SECONDS)} for r in recs]  # noqa: E731
    assert strip(spread) == strip(one)
    assert summarize_records(str(out)).rows == summarize_records(one).rows
    assert [r["accuracy"] for r in exact_spread] == [r["accuracy"] for r in exact_one]
    assert _same(summarize_exact(exact_spread).rows, summarize_exact(exact_one).rows)


def test_intervals_of_drift_never_print_a_negative_bound():
    """A lossless rule's KL at the answer token is 0 up to rounding, which can fall a hair below 0: the record
    keeps 0, and the table never prints a bound below it (records of an earlier version included)."""
    records = []
    for i in range(30):
        base = {"id": f"c-{i}", "problem": f"{i}", "benchmark": "choice", "answer": "A", "tv": 0.0}
        records.append({**base, "method": "verifier alone", "accuracy": 0.5, "kl": 0.0})
        records.append({**base, "method": "sps", "accuracy": 0.5, "kl": -1e-17 * (i % 3), "tv": 1e-17})
    table = summarize_exact(records, n_boot=200).table()
    assert "-0.0000" not in table and "| sps | 30 |" in table
    p = np.array([0.2, 0.5, 0.3])
    assert exact_answer_accuracy(make_rule("sps"), p, p, [0])["kl"] >= 0.0
