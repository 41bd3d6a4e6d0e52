"""Quality traces: the exact referee's records keep each problem's answer rows (the top logits of both models and
their log-sum-exps), from which every registered token rule is scored again without a model, under any chain,
equal to the model run's accuracy, KL and TV to 1e-12 (the model run reads the whole rows; rescoring eight logits
of 64); a chain that may reach past the kept logits, a rule the kept logits do not decide, and broken rows are
refused in one line."""

import json

import numpy as np
import pytest
from optional import torch  # noqa: F401  (the models extra)

from cactus_theory import SamplingSettings, make_rule
from cactus_theory._analysis._answer_rows import answer_rows, read_answer_rows
from cactus_theory._analysis._rescore import rescore_exact
from cactus_theory._data._graders import load_problems
from cactus_theory._rules._protocol import judgement_of
from cactus_theory._studies._exact_choice import exact_choice_referee
from cactus_theory.testing import conformance_rules

pytestmark = pytest.mark.models
TOKEN_RULES = [r for r in conformance_rules() if judgement_of(r).per_token]
SETTINGS = SamplingSettings(temperature=0.8, top_k=6, top_p=0.9)
KEPT = 8


@pytest.fixture(scope="module")
def pair(gguf_pair):
    from cactus_theory._models._hf import load_model

    return load_model(gguf_pair[0], dtype="float32", cache=False), load_model(
        gguf_pair[1], dtype="float32", cache=False
    )


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    path = tmp_path_factory.mktemp("choices") / "choices.jsonl"
    rows = [{"question": f"ab {i} cd", "choices": ["ab", "cd", "ef", "gh"], "answer": "ABCD"[i % 4]} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_problems("choice", path=str(path))


def _decided(rule, records) -> bool:
    """Whether the kept logits decide ``rule`` (rules reading raw logits may need more than the top eight)."""
    try:
        rescore_exact(records, [rule])
    except ValueError as exc:
        assert "reads raw logits the records do not keep" in str(exc)
        return False
    return True


@pytest.mark.parametrize("chain", ["vllm", "llama.cpp"])
def test_rescoring_equals_the_model_run_for_every_registered_token_rule(pair, problems, chain):
    settings = SamplingSettings(
        temperature=0.8, top_k=6, top_p=0.9, min_p=0.05 if chain == "llama.cpp" else 0.0, chain=chain
    )
    run = exact_choice_referee(*pair, problems, TOKEN_RULES, settings=settings, rows=KEPT)
    alone = [r for r in run if r["method"] == "verifier alone"]
    assert all(len(r["rows"]["target"]["ids"]) == KEPT for r in alone)  # eight of the 64 tokens kept
    decided = [rule for rule in TOKEN_RULES if _decided(rule, alone)]
    assert len(decided) >= len(TOKEN_RULES) - 3  # only rules over the whole row's raw logits may be refused
    again = rescore_exact(alone, decided)
    model = {(r["id"], r["method"]): r for r in run}
    for rec in again:
        want = model[(rec["id"], rec["method"])]
        for key in ("accuracy", "kl", "tv"):
            if np.isinf(want[key]):
                assert rec[key] == want[key], (rec["method"], key)
            else:
                assert abs(rec[key] - want[key]) <= 1e-12, (rec["method"], key, rec[key], want[key])
        assert rec["setting"]["sampling"] == settings.as_dict()


def test_rescoring_under_another_chain_is_the_model_run_under_it(pair, problems):
    rules = ["sps", "cactus(delta=1)", "lossy(alpha=0.5)"]
    vllm = exact_choice_referee(*pair, problems, rules, settings=SETTINGS, rows=KEPT)
    llama = SamplingSettings(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05, chain="llama.cpp")
    direct = exact_choice_referee(*pair, problems, rules, settings=llama, rows=KEPT)
    again = rescore_exact(vllm, rules, settings=llama)
    model = {(r["id"], r["method"]): r["accuracy"] for r in direct}
    assert all(abs(r["accuracy"] - model[(r["id"], r["method"])]) <= 1e-12 for r in again)
    assert again[0]["setting"]["rescored"] == SETTINGS.as_dict()


def test_rescoring_refuses_what_the_kept_rows_cannot_decide(pair, problems):
    alone = [r for r in exact_choice_referee(*pair, problems, ["sps"], settings=SETTINGS, rows=KEPT)]
    with pytest.raises(ValueError, match="may keep tokens beyond the 8 logits"):
        rescore_exact(alone, ["sps"], settings=SamplingSettings(top_k=20))
    with pytest.raises(ValueError, match="may keep tokens beyond"):
        rescore_exact(alone, ["sps"], settings=SamplingSettings(top_k=4, chain=("temperature", "top_p", "top_k")))
    with pytest.raises(ValueError, match="judges whole blocks"):
        rescore_exact(alone, ["block"])
    stripped = [{k: v for k, v in r.items() if k != "rows"} for r in alone]
    with pytest.raises(ValueError, match="keep no answer rows"):
        rescore_exact(stripped, ["sps"])


def _rows(**change):
    z = np.array([5.0, 4.0, 3.5, 1.0, 0.5, -1.0, -2.0, -3.0, -4.0, -5.0])
    entry = answer_rows(z, z[::-1].copy(), [1], n=4)
    for role, fields in change.items():
        entry[role] = {**entry[role], **fields} if isinstance(fields, dict) else fields
    return entry


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"target": {"logits": [5.0, float("nan"), 3.5, 1.0]}}, "not a finite number"),
        ({"target": {"ids": [0, 1, 2, 99]}}, "outside the vocabulary"),
        ({"target": {"ids": [0, 1, 1, 3]}}, "lists a token twice"),
        ({"target": {"logits": [5.0, 4.0, 6.0, 1.0]}}, "decreasing order"),
        ({"target": {"lse": 4.0}}, "more than the whole row's mass"),
        ({"correct": []}, "no correct letter's token ids"),
        ({"correct": [10]}, "outside the vocabulary"),
        ({"target": {"probs": [0.5, 0.3, 0.1, 0.1]}}, "processed probabilities, not raw logits"),
        ({"vocab": True}, "whole numbers"),
    ],
)
def test_broken_rows_are_refused_in_one_line(change, match):
    entry = _rows()
    for key, value in change.items():
        entry[key] = {**entry[key], **value} if isinstance(value, dict) and key in entry else value
    with pytest.raises(ValueError, match=match):
        read_answer_rows(entry, "record of 'p0'")
    assert read_answer_rows(_rows(), "fine").correct.tolist() == [1]


def test_the_kept_rows_are_the_largest_logits_with_the_row_log_sum_exp():
    z = np.array([1.0, 7.0, 3.0, 7.0, -2.0], dtype=np.float32).astype(np.float64)
    entry = answer_rows(z, z, [2], n=3)
    assert entry["target"]["ids"] == [1, 3, 2]  # decreasing, ties by the lower id
    assert entry["target"]["logits"] == [7.0, 7.0, 3.0]
    assert entry["target"]["lse"] == pytest.approx(float(np.log(np.exp(z).sum())), abs=1e-12)
    back = read_answer_rows(json.loads(json.dumps(entry)))
    assert back.support().tolist() == [1, 2, 3]
    assert make_rule("sps") is not None


def test_records_of_two_tokenizers_or_two_runs_are_never_rescored_together(pair, problems):
    """Issue 67, item 6: rows of another tokenizer's size, or records of another run, mixed into one file."""
    alone = [r for r in exact_choice_referee(*pair, problems, ["sps"], settings=SETTINGS, rows=KEPT)]
    assert rescore_exact(alone, ["sps"])  # the run's own records rescore
    other = json.loads(json.dumps(alone))
    first = next(r for r in other if "rows" in r)
    first["rows"]["vocab"] = first["rows"]["vocab"] + 7  # a larger tokenizer's rows (its ids still inside it)
    with pytest.raises(ValueError, match="different tokenizers are never rescored together"):
        rescore_exact(other, ["sps"])
    mixed = json.loads(json.dumps(alone))
    next(r for r in mixed if "rows" in r)["setting"]["models"] = {"verifier": "another"}
    with pytest.raises(ValueError, match="different settings"):
        rescore_exact(mixed, ["sps"])
