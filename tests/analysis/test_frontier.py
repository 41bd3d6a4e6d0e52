"""The deployment frontier: every setting's predicted speedup beside its exact accuracy difference, the front
against a brute-force dominance check, the recommendation on rows where the answer is known (a setting just inside
the budget and a faster one just outside), and end to end on a random trace and synthetic referee records (whose
pairs must match)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trace_builders import random_trace, trace_metadata

from cactus_theory import SamplingSettings
from cactus_theory._analysis._answer_rows import answer_rows
from cactus_theory._analysis._frontier import decide, deployment_frontier, frontier_rules
from cactus_theory._analysis._referee_summary import ALONE, read_exact_records

SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


def _row(rule, m, speedup, difference, low):
    return {"rule": rule, "m": m, "speedup": speedup, "difference": difference, "low": low}


@settings(max_examples=80, deadline=None)
@given(points=st.lists(st.tuples(st.floats(0.5, 3), st.floats(-10, 2)), min_size=2, max_size=12))
def test_the_front_is_every_point_no_other_dominates(points):
    rows = [_row("sps" if i == 0 else f"r{i}", 1, s, d, d - 1) for i, (s, d) in enumerate(points)]
    decide(rows, 0.5)
    for i, a in enumerate(rows):
        dominated = any(
            b["speedup"] >= a["speedup"]
            and b["difference"] >= a["difference"]
            and (b["speedup"] > a["speedup"] or b["difference"] > a["difference"])
            for j, b in enumerate(rows)
            if j != i
        )
        assert a["front"] == (not dominated)


def test_the_recommendation_is_the_fastest_setting_whose_loss_stays_within_the_budget():
    rows = [
        _row("sps", 4, 1.5, 0.0, 0.0),
        _row("cactus(delta=1)", 4, 1.9, -0.3, -0.49),  # just inside 0.5 points: its loss's upper bound 0.49
        _row("cactus(delta=4)", 4, 2.1, -0.3, -0.51),  # faster, just outside
        _row("lossy(alpha=0.5)", 4, 1.7, +0.2, -0.1),
    ]
    assert decide(rows, 0.5)["rule"] == "cactus(delta=1)"
    assert [r["within"] for r in rows] == [True, True, False, True]
    assert decide(rows, 0.52)["rule"] == "cactus(delta=4)"
    assert decide(rows, 0.15)["rule"] == "lossy(alpha=0.5)"
    assert decide([r for r in rows if r["rule"] != "lossy(alpha=0.5)"], 0.05)["rule"] == "sps"  # none: SpS
    assert [r["best_m"] for r in rows] == [True] * 4
    # a draft as costly as a slow CPU's: every setting slower than the verifier alone (speedup 1, exactly lossless)
    slow = [_row(r["rule"], r["m"], r["speedup"] / 2.2, r["difference"], r["low"]) for r in rows]
    slow.append(_row("verifier alone", 0, 1.0, 0.0, 0.0))
    assert decide(slow, 0.52)["rule"] == "verifier alone" and slow[-1]["within"] and slow[-1]["front"]
    assert [r["front"] for r in slow[:-1]] == [False, False, False, True]  # the +0.2 points of lossy stay
    slow[1]["speedup"] = 1.01  # just faster than no speculation, its loss within the budget
    assert decide(slow, 0.5)["rule"] == "cactus(delta=1)"


def _records(seed, problems=40, vocab=40, models=("a", "b")):
    """Exact-referee records of random answer rows (the verifier alone's, which keep them)."""
    rng = np.random.default_rng(seed)
    out = []
    setting = {
        "sampling": SETTINGS.as_dict(),
        "models": {
            "verifier": {"name": "v", "files": {"v.bin": {"sha256": models[0] * 64}}},
            "draft": {"name": "d", "files": {"d.bin": {"sha256": models[1] * 64}}},
        },
        "benchmarks": ["choice"],
    }
    for i in range(problems):
        target = rng.normal(size=vocab) * 2
        draft = target + rng.normal(size=vocab)
        correct = [int(rng.integers(vocab))]
        out.append(
            {
                "record": "cactus-theory evaluate --exact",
                "id": f"choice-{i}",
                "problem": f"{i:016x}",
                "benchmark": "choice",
                "method": "verifier alone",
                "answer": "A",
                "accuracy": 0.0,
                "kl": 0.0,
                "tv": 0.0,
                "rows": answer_rows(target, draft, correct, n=16),
                "setting": setting,
            }
        )
    return out


def test_the_frontier_end_to_end(tmp_path):
    trace = random_trace(tmp_path / "t", 0, [f"q-{i}" for i in range(8)])
    rules = ["cactus(delta=1)", "lossy(alpha=0.5)", "tas"]
    frontier = deployment_frontier(trace, _records(1), 0.2, rules=rules, ms=(2, 4), n_boot=200)
    expected = ["sps", "cactus(delta=1)", "lossy(alpha=0.5)", "tas", "verifier alone"]
    assert sorted({r["rule"] for r in frontier.rows}) == sorted(expected)
    assert {r["m"] for r in frontier.rows} == {0, 2, 4}
    sps = [r for r in frontier.rows if r["rule"] == "sps"]
    assert all(r["difference"] == 0 and r["low"] == 0 and r["within"] for r in sps)
    chosen = frontier.recommendation
    assert chosen["within"] and chosen["speedup"] == max(r["speedup"] for r in frontier.rows if r["within"])
    (alone,) = [r for r in frontier.rows if r["rule"] == "verifier alone"]  # no speculation: 1x, lossless, m = 0
    assert (alone["m"], alone["speedup"], alone["difference"], alone["low"], alone["within"]) == (0, 1, 0, 0, True)
    slow = deployment_frontier(trace, _records(1), 0.95, rules=rules, ms=(2, 4), n_boot=200)  # a draft near 1x
    assert max(r["speedup"] for r in slow.rows if r["rule"] != "verifier alone") < 1
    assert slow.recommendation["rule"] == "verifier alone"
    assert slow.recommendation_line().startswith("deploy the verifier alone, without speculation")
    assert "deploy" in frontier.recommendation_line() and "chain vllm" in frontier.recommendation_line()
    assert any("two samples" in n for n in frontier.notes)
    written = frontier.write(tmp_path / "out")
    assert sorted(p.rsplit("/", 1)[1] for p in written) == [
        "frontier.csv",
        "frontier.json",
        "frontier.md",
        "frontier.png",
    ]
    with pytest.raises(ValueError, match="different weights"):
        deployment_frontier(trace, _records(1, models=("z", "b")), 0.2, rules=rules, ms=(2,), n_boot=50)
    with pytest.raises(ValueError, match="max_loss must be"):
        deployment_frontier(trace, _records(1), 0.2, rules=rules, max_loss=-1)


def test_every_family_enters_the_frontier_with_its_declared_grid():
    labels = [r.describe() for r in frontier_rules()]
    assert labels[0] == "sps" and len(labels) == len(set(labels))
    for family in ("cactus", "cactus-exact", "lossy", "mars", "relaxed-thinking", "relaxed-topk", "tas", "topk"):
        assert sum(label.split("(")[0] == family for label in labels) >= 4, family
    assert list(itertools.islice(labels, 1)) == ["sps"]
    assert "sampler-match" in labels  # a rule of one setting enters at its defaults
    assert trace_metadata()["verifier"]["files"]


def test_plan_quality_rescores_under_the_chain_given_keeping_the_records_other_settings(tmp_path, capsys):
    """``plan --quality RECORDS --chain llama.cpp --min-p 0.05``: the records' temperature, top-k and top-p (1.0,
    8, 1.0 here, not the flags' defaults) under llama.cpp's chain; without a flag, the records' own sampling;
    ``evaluate --rescore`` the same."""
    from cactus_theory._cli import main
    from cactus_theory.io import write_records

    random_trace(tmp_path / "t", 0, [f"q-{i}" for i in range(8)])
    records = write_records(_records(1), tmp_path / "records.jsonl.gz")
    base = ["plan", str(tmp_path / "t"), "--quality", records, "--cost-ratio", "0.2", "--rules", "cactus(delta=1)"]
    base += ["--m", "2", "--bootstrap", "100", "--quiet"]
    assert main([*base, "--chain", "llama.cpp", "--min-p", "0.05"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("sampling: ") and "chain llama.cpp" in first and "min-p 0.05" in first, first
    assert "temperature 1" in first and "top-k 8" in first, first
    assert main(base) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "chain vllm" in first and "min-p" not in first and "top-k 8" in first, first
    # evaluate --rescore reads the same flags the same way: the rescored records name the sampling used
    out = tmp_path / "rescored.jsonl.gz"
    again = ["evaluate", "--rescore", records, "--rule", "cactus(delta=1)", "--bootstrap", "100", "--out", str(out)]
    assert main([*again, "--chain", "llama.cpp", "--min-p", "0.05"]) == 0
    used = SamplingSettings.from_dict(read_exact_records(out)[0]["setting"]["sampling"])
    assert used == SamplingSettings(temperature=1.0, top_k=8, top_p=1.0, min_p=0.05, chain="llama.cpp")


def test_a_pick_at_the_edge_of_the_grid_is_said_so():
    """The recommended setting at the largest m tried, or the most relaxed of its family: the line says what to try."""
    from cactus_theory.plan import Frontier

    rows = [
        {**_row("sps", 2, 1.1, 0.0, 0.0), "family": "sps"},
        {**_row("sps", 4, 1.2, 0.0, 0.0), "family": "sps"},
        {**_row("cactus(delta=0.5)", 2, 1.3, -0.1, -0.3), "family": "cactus"},
        {**_row("cactus(delta=1)", 2, 1.4, -0.1, -0.3), "family": "cactus"},
        {**_row("cactus(delta=1)", 4, 1.5, -0.2, -0.4), "family": "cactus"},
        {**_row(ALONE, 0, 1.0, 0.0, 0.0), "family": ALONE},
    ]
    for r in rows:
        r.update(speedup_lo=r["speedup"] - 0.1, speedup_hi=r["speedup"] + 0.1, high=r["difference"] + 0.2, kl=0.01)
    chosen = decide(rows, 0.5)
    frontier = Frontier(rows, chosen, 0.5, SamplingSettings(), "per step")
    assert chosen["rule"] == "cactus(delta=1)" and chosen["m"] == 4
    assert frontier.edges() == [
        "the largest m tried: try larger --m",
        "the most relaxed cactus tried: add more relaxed settings with --rules",
    ]
    assert "(at the edge of the grid: the largest m tried" in frontier.recommendation_line()
    inside = decide(rows[:4] + rows[5:], 0.5)  # cactus(delta=1) at m = 2: the m grid goes further, delta not
    assert Frontier(rows[:4] + rows[5:], inside, 0.5, SamplingSettings(), "per step").edges() == [
        "the most relaxed cactus tried: add more relaxed settings with --rules"
    ]


def test_an_infinite_kl_is_written_as_infinity_in_json_as_in_the_tables():
    import json

    from cactus_theory.plan import Frontier

    rows = [{**_row(ALONE, 0, 1.0, 0.0, 0.0), "family": ALONE, "kl": float("inf"), "tv": float("nan")}]
    frontier = Frontier(rows, rows[0], 0.5, SamplingSettings(), "per step")
    back = json.loads(frontier.to_json())["rows"][0]
    assert back["kl"] == float("inf") and back["tv"] is None  # inf is a value, NaN none


def test_the_frontier_on_long_answers_beside_or_instead_of_the_exact_referee(tmp_path):
    """Long answers (the sampled referee's records with rows, made in an AnswerWorld): each setting's long-answer
    difference is the pool's estimate from the world's own likelihoods (an independent path: no rows), at its own
    m; the budget holds both bounds; without exact records the long answers are the frontier's accuracy."""
    from trace_builders import long_answer_records

    from cactus_theory._analysis._pooled import pooled_accuracy
    from cactus_theory._laws._answer_worlds import AnswerWorld

    world = AnswerWorld(50, vocab=3, length=4, seed=2)
    chosen = np.arange(50)
    decoded = {ALONE: None, "cactus(delta=1)": "cactus(delta=1)"}
    long = long_answer_records(world, chosen, decoded, 2, seed=5)
    trace = random_trace(tmp_path / "t", 0, [f"q-{i}" for i in range(8)])
    rules = ["cactus(delta=1)", "lossy(alpha=0.5)"]
    both = deployment_frontier(trace, _records(1), 0.2, rules=rules, ms=(2, 3), n_boot=300, long_answers=long)
    alone = deployment_frontier(trace, None, 0.2, rules=rules, ms=(2, 3), n_boot=300, long_answers=long)
    # the same pool from the world's likelihoods: each decoded answer's log-probability under every setting
    by = [r["method"] for r in long]
    where = np.array(
        [[int(r["id"][2:]), int(np.flatnonzero((world.answers == r["token_ids"]).all(1))[0])] for r in long]
    ).T
    for row in both.rows:
        if row["rule"] == ALONE:
            assert row["long_difference"] == 0 and row["within"]
            continue
        method = "verifier alone" if row["rule"] == ALONE else row["rule"]
        log_probs = {
            ALONE: world.log_probs(None, 2, where),
            "cactus(delta=1)": world.log_probs("cactus(delta=1)", 2, where),
        }
        log_probs["asked"] = world.log_probs(method, row["m"], where)
        want = {
            r.method: r
            for r in pooled_accuracy(
                where[0], by, [float(r["correct"]) for r in long], log_probs, ["asked"], n_boot=300
            )
        }
        assert row["long_difference"] == pytest.approx(100 * want["asked"].difference, abs=1e-4), row
        bounds = [row["low"], row["long_difference_lo"]]
        assert row["within"] == (row["rule"] == "sps" or all(b >= -both.budget for b in bounds))
    lossless = [r for r in both.rows if r["rule"] == "sps"]
    assert all(abs(r["long_difference"]) < 1e-9 for r in lossless)
    # instead of the exact referee: the long answers are the accuracy, no drift at an answer token
    for a, b in zip(alone.rows, both.rows, strict=True):
        assert (a["rule"], a["m"]) == (b["rule"], b["m"])
        assert a["difference"] == b["long_difference"] and a["low"] == b["long_difference_lo"]
    assert "long answers" in both.table() and "long answers" in both.markdown()
    assert any("long answers: " in n for n in both.notes)


def test_plan_long_answers_on_the_command_line(tmp_path, capsys):
    """``plan --long-answers RECORDS`` alone (no --quality): the long answers are the frontier's accuracy, the table
    names them; an output among the inputs is refused."""
    from trace_builders import long_answer_records

    from cactus_theory._cli import main
    from cactus_theory._laws._answer_worlds import AnswerWorld
    from cactus_theory.io import write_records

    world = AnswerWorld(30, vocab=3, length=3, seed=4)
    decoded = {ALONE: None, "cactus(delta=1)": "cactus(delta=1)"}
    records = write_records(long_answer_records(world, np.arange(30), decoded, 2, seed=1), tmp_path / "long.jsonl")
    random_trace(tmp_path / "t", 0, [f"q-{i}" for i in range(8)])
    argv = ["plan", str(tmp_path / "t"), "--long-answers", records, "--cost-ratio", "0.2", "--rules", "tas"]
    argv += ["--m", "2", "--bootstrap", "100", "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "long answers: pooled, weighted by exact likelihoods" in out.splitlines()[0]
    assert "deploy " in out
    assert main([*argv, "--out", records]) == 2
