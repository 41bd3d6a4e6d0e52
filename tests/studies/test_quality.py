"""The quality referee: decoding, grading and the paired summary end to end. A fake pair whose rule flips a
known share of answers (the interval covers it, the drift is the one it spent), resume after kill -9 to
the same records and summary, the real engine on tiny models (an answer is the same at any batch size and
is the engine's own decoding with the answer's seed), the command line."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
from fake_referee import FLIP, STATE, TOKEN_KL, FakeModel, choice_file, install, verifier
from locations import FIXTURES, HANG_GUARD, ROOT, TESTS

from cactus_theory._analysis._referee_summary import ALONE, read_records, summarize_records
from cactus_theory._data._graders import load_problems
from cactus_theory._data._prompts import prompt_seed
from cactus_theory._studies._quality import evaluate_rules
from cactus_theory._util._study import RUN_SECONDS

RULES = ["sps", "lossy(alpha=0.5)"]


@pytest.fixture(scope="module")
def float32_pair(gguf_pair):
    """The tiny pair on the Hugging Face engine in float32 (verifier triple, draft triple)."""
    from cactus_theory._models._hf import load_model

    return tuple(load_model(path, dtype="float32", cache=False) for path in gguf_pair)


def _two_rules(pair, **options):
    """The referee on the fixture's GSM8K problems with SpS and Cactus delta = 1 at m = 3 (``options``: the rest)."""
    problems = load_problems("gsm8k", FIXTURES / "benchmarks")
    return evaluate_rules(*pair, problems, ["sps", "cactus(delta=1)"], m=3, **options)


@pytest.fixture
def fake(monkeypatch):
    install(monkeypatch.setattr)
    monkeypatch.setitem(STATE, "calls", 0)
    monkeypatch.setitem(STATE, "block_after", None)


def test_a_known_flip_share_is_covered_and_the_drift_is_the_one_spent(tmp_path, fake):
    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 160))
    records = evaluate_rules(verifier(), object(), problems, RULES, m=4, batch=8)
    assert len(records) == 3 * 160 and [r["method"] for r in records[:1]] == [ALONE]
    # each answer's verdict is the fake's draw from the answer's own seed
    seeds = {(r["id"], r["method"]): r["seed"] for r in records}
    for r in records:
        assert r["seed"] == prompt_seed(0, f"{r['id']}|{r['method']}|0")
        expected = r["method"] == ALONE or not np.random.default_rng(seeds[(r["id"], r["method"])]).random() < FLIP
        assert r["correct"] == expected and r["extracted"] == ("A" if expected else "B")
    summary = summarize_records(records, n_boot=2000)
    rows = {r["method"]: r for r in summary.rows}
    assert rows[ALONE]["accuracy"] == 1.0 and summary.problems == {"choice": 160}
    for rule in ("sps", "lossy(alpha=0.5)"):
        row = rows[rule]
        assert row["low"] <= -FLIP <= row["high"], row  # the interval covers the true loss
        assert row["high"] < 0 and row["verdict"] == "worse"  # and the loss is detected
        assert row["mcnemar_p"] < 1e-6 and row["discordant"][0] == 0
        assert row["kl_per_token"] == pytest.approx(np.mean(TOKEN_KL), abs=1e-12)
        assert row["answer_kl"] == pytest.approx(sum(TOKEN_KL), abs=1e-12)
        assert row["answer_kl_lo"] == pytest.approx(sum(TOKEN_KL), abs=1e-12)
    table = summary.table()
    assert "| choice | verifier alone | 160 | 100.0 | - | reference |" in table
    assert f"| {TOKEN_KL[0] / 2 + TOKEN_KL[1] / 2:.4f} |" in table


def test_samples_are_averaged_within_a_problem(tmp_path, fake):
    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 30))
    records = evaluate_rules(verifier(), object(), problems, ["sps"], samples=3, batch=5, drift=False)
    assert len(records) == 2 * 30 * 3 and len({r["seed"] for r in records}) == 180
    rows = {r["method"]: r for r in summarize_records(records, n_boot=500).rows}
    per_problem = {}
    for r in records:
        if r["method"] == "sps":
            per_problem.setdefault(r["id"], []).append(r["correct"])
    assert rows["sps"]["accuracy"] == pytest.approx(np.mean([np.mean(v) for v in per_problem.values()]), abs=1e-12)
    assert rows["sps"]["mcnemar_p"] is None and "kl_per_token" not in rows["sps"]
    assert summarize_records(records, n_boot=500).samples == 3


def test_a_rerun_skips_what_is_done_and_refuses_other_settings(tmp_path, fake):
    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 12))
    out = tmp_path / "runs" / "records.jsonl"
    first = evaluate_rules(verifier(), object(), problems[:6], RULES, batch=4, out=out)
    calls = STATE["calls"]
    again = evaluate_rules(verifier(), object(), problems[:6], RULES, batch=4, out=out)
    assert STATE["calls"] == calls and again == first  # nothing decoded again
    more = evaluate_rules(verifier(), object(), problems, RULES, batch=4, out=out)
    assert len(more) == 36 and len(read_records(out)) == 36
    whole, calls = out.read_text(), STATE["calls"]
    draft = (FakeModel(), None, {"name": "another draft", "source": "x", "files": {}})
    other_problems = load_problems("choice", path=choice_file(tmp_path / "other.jsonl", 12, text="other question"))
    for kwargs, names in (
        ({"m": 3}, "m: 8 -> 3"),
        ({"verifier": (verifier()[0], verifier()[1], {"name": "another verifier"})}, "models.verifier.name"),
        ({"draft": draft}, "models.draft"),  # the draft's identity is recorded, never null
        ({"max_new_tokens": 64}, "max_new_tokens: 512 -> 64"),
        ({"seed": 1}, "seed: 0 -> 1"),
        ({"batch": 3}, "batch: 4 -> 3"),  # answers can change with the batch's shape: never appended together
        ({"drift": False}, "drift: true -> false"),
    ):
        args = {"verifier": verifier(), "draft": object(), "batch": 4, **kwargs}
        with pytest.raises(ValueError, match=f"holds records of another setting.*{re.escape(names)}"):
            evaluate_rules(args.pop("verifier"), args.pop("draft"), problems, RULES, out=out, **args)
    # another file of the same benchmark: the same ids, other questions (a problem is its content)
    with pytest.raises(ValueError, match="another problem under the id 'choice-0'"):
        evaluate_rules(verifier(), object(), other_problems, RULES, batch=4, out=out)
    assert out.read_text() == whole and STATE["calls"] == calls  # refused before anything was decoded
    # a torn last line (a run killed mid-write) is cut off and decoded again
    out.write_text(whole + whole.splitlines()[0][:40])
    assert evaluate_rules(verifier(), object(), problems, RULES, batch=4, out=out) == more
    assert out.read_text() == whole
    assert not [f for f in os.listdir(out.parent) if f.endswith(".lock")]
    first_record = read_records(out)[0]
    assert next(iter(first_record)) == "record" and first_record["setting"]["models"]["draft"] is None
    assert first_record["problem"] == problems[0].digest


def test_a_file_that_is_not_records_is_never_changed(tmp_path, fake):
    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 3))
    trace = tmp_path / "trace"
    trace.mkdir()
    files = {
        trace / "manifest.json": '{\n  "format": "cactus-trace",\n  "prompts": 3\n}',  # no final newline
        tmp_path / "mine.jsonl": '{"question": "q1"}\n{"question": "q2"}',  # a user's JSON Lines, unterminated
        tmp_path / "notes.jsonl": "some notes\n",
        tmp_path / "other.jsonl": '{"record": "cactus-theory decode", "id": "x"}\n',  # another command's records
    }
    for path, text in files.items():
        path.write_text(text)
        with pytest.raises(ValueError, match="is not a records file of cactus-theory evaluate"):
            evaluate_rules(verifier(), object(), problems, RULES, out=path)
        assert path.read_text() == text
    link = tmp_path / "link.jsonl"
    link.symlink_to(tmp_path / "mine.jsonl")
    with pytest.raises(ValueError, match="symbolic link"):
        evaluate_rules(verifier(), object(), problems, RULES, out=link)
    assert STATE["calls"] == 0


def test_two_runs_in_one_folder_writing_different_files_do_not_refuse_each_other(tmp_path, fake):
    from cactus_theory._util._records import RecordLog

    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 2))
    busy = RecordLog(tmp_path / "a.jsonl", "cactus-theory evaluate", {"any": 1})
    busy.open()
    try:
        assert len(evaluate_rules(verifier(), object(), problems, RULES, out=tmp_path / "b.jsonl")) == 6
        with pytest.raises(ValueError, match="is being written by another run"):
            evaluate_rules(verifier(), object(), problems, RULES, out=tmp_path / "a.jsonl")
    finally:
        busy.close()


def test_model_written_code_runs_only_when_asked(tmp_path, fake, monkeypatch):
    monkeypatch.delenv("CACTUS_ALLOW_CODE_EXECUTION", raising=False)
    problems = load_problems("humaneval", FIXTURES / "benchmarks", limit=1)
    with pytest.raises(ValueError, match="allow_code_execution=True or CACTUS_ALLOW_CODE_EXECUTION=1"):
        evaluate_rules(verifier(), object(), problems, RULES)
    assert STATE["calls"] == 0  # refused before decoding


@pytest.mark.parametrize(
    "name, value",
    [("m", 10**6), ("max_new_tokens", 10**9), ("batch", 10**6), ("samples", 10**7), ("m", True), ("batch", 2.5)],
)
def test_counts_no_machine_can_run_are_refused_before_decoding(tmp_path, fake, name, value):
    problems = load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 2))
    with pytest.raises(ValueError, match=f"{name} must be an integer between 1 and"):
        evaluate_rules(verifier(), object(), problems, RULES, **{name: value})
    assert STATE["calls"] == 0


def test_summaries_refuse_records_of_the_wrong_types(tmp_path):
    good = {"id": "x", "benchmark": "choice", "method": ALONE, "sample": 0, "correct": True, "tokens": 3}
    for field, value, message in (
        ("correct", float("nan"), "'correct' must be true or false; got NaN"),
        ("correct", "false", "'correct' must be true or false"),
        ("correct", 1, "'correct' must be true or false; got 1"),
        ("sample", float("nan"), "'sample' must be an integer >= 0; got NaN"),
        ("sample", -1, "'sample' must be an integer >= 0"),
        ("tokens", True, "'tokens' must be an integer >= 0"),
    ):
        path = tmp_path / "records.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
        with pytest.raises(ValueError, match=f"records.jsonl, line 2: {re.escape(message)}"):
            read_records(path)
    for name, data, message in (
        ("bad.jsonl.gz", b"not gzip at all", "not a valid gzip file"),
        ("cut.jsonl.gz", gzip.compress(json.dumps(good).encode() * 50)[:40], "truncated"),
        (
            "latin.jsonl",
            json.dumps({**good, "id": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"),
            "not UTF-8",
        ),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"{name}.*{message}"):
            read_records(tmp_path / name)
    one = summarize_records(
        [good, {**good, "id": "y"}, {**good, "method": "sps"}, {**good, "id": "y", "method": "sps"}], n_boot=0
    )
    assert {r["method"]: r["verdict"] for r in one.rows}["sps"] == "no interval (no resamples)"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"m": 0}, "m must be an integer between 1 and 256"),
        ({"samples": 1.5}, "samples must be an integer"),
        ({"rules": ["sps", "sps"]}, "must be distinct"),
        ({"rules": ["block"]}, "judges whole blocks"),
        ({"problems": []}, "at least one problem"),
        ({"rows": 8}, "rows: 8 logits a position cannot hold the law of the sampling"),
        ({"rows": -1}, "rows must be an integer >= 0"),
    ],
)
def test_bad_arguments_are_named(tmp_path, fake, kwargs, message):
    args = {"problems": load_problems("choice", path=choice_file(tmp_path / "c.jsonl", 2)), "rules": ["sps"]}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        evaluate_rules(verifier(), object(), **args)


def test_summaries_need_the_reference():
    with pytest.raises(ValueError, match="none to summarise"):
        summarize_records([])
    rec = {"id": "x", "benchmark": "gsm8k", "method": "SpS", "sample": 0, "correct": True, "tokens": 3}
    with pytest.raises(ValueError, match="none of the verifier alone"):
        summarize_records([rec])


_CHILD = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
from fake_referee import STATE, install, verifier
from cactus_theory._data._graders import load_problems
from cactus_theory._studies._quality import evaluate_rules
install()
STATE["block_after"] = {block_after}
problems = load_problems("choice", path={problems!r})
evaluate_rules(verifier(), object(), problems, {rules!r}, batch=3, samples=2, out={out!r})
"""


def _child(tmp_path, out, block_after):
    code = _CHILD.format(
        tests=str(TESTS),
        root=str(ROOT),
        block_after=block_after,
        rules=RULES,
        problems=str(tmp_path / "c.jsonl"),
        out=str(out),
    )
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)


def _wait_blocked(child):
    seen = b""
    while b"BLOCKED" not in seen:
        chunk = os.read(child.stderr.fileno(), 4096)
        assert chunk, seen.decode()[-2000:]
        seen += chunk


def test_kill_9_then_resume_gives_the_same_records_and_summary(tmp_path):
    choice_file(tmp_path / "c.jsonl", 10)
    out = tmp_path / "killed" / "records.jsonl"
    for block_after in (0, 2, 7):  # killed before any answer, then twice mid-run
        child = _child(tmp_path, out, block_after)
        _wait_blocked(child)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=HANG_GUARD)
    assert 0 < len(out.read_text().splitlines()) < 60
    assert _child(tmp_path, out, None).wait(timeout=HANG_GUARD) == 0
    clean = tmp_path / "clean" / "records.jsonl"
    assert _child(tmp_path, clean, None).wait(timeout=HANG_GUARD) == 0
    killed, straight = read_records(out), read_records(clean)
    key = lambda r: (r["id"], r["method"], r["sample"])  # noqa: E731
    timeless = lambda recs: [{k: v for k, v in r.items() if k != RUN_SECONDS} for r in sorted(recs, key=key)]  # noqa: E731
    assert timeless(killed) == timeless(straight) and len(killed) == 60
    assert summarize_records(killed).rows == summarize_records(straight).rows
    assert not [f for f in os.listdir(out.parent) if f.endswith(".lock")]


# --- the real engine on tiny models ------------------------------------------------------------------


@pytest.mark.llamacpp
@pytest.mark.models
def test_an_answer_is_the_engines_own_decoding_at_any_batch_size(gguf_pair, tmp_path):
    from cactus_theory._math._sampling import SamplingSettings
    from cactus_theory._models._decoding import autoregressive_generate, speculative_generate
    from cactus_theory._models._hf import encode_chat, eos_ids, load_model

    v_path, d_path = gguf_pair
    settings = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)
    problems = load_problems("gsm8k", FIXTURES / "benchmarks")
    runs = {}
    for batch in (1, 3):
        ver = load_model(v_path, engine="llama.cpp", sequences=batch)
        drf = load_model(d_path, engine="llama.cpp", sequences=batch)
        runs[batch] = evaluate_rules(
            ver, drf, problems, ["sps", "cactus(delta=1)"], m=3, settings=settings, max_new_tokens=10, batch=batch
        )
    # the answers are the same; the batch is the setting's (and the time each took its own)
    assert runs[1][0]["setting"]["batch"] == 1 and runs[3][0]["setting"]["batch"] == 3
    apart = ("token_kl", "answer_kl", "setting", RUN_SECONDS)
    strip = lambda recs: [{k: v for k, v in r.items() if k not in apart} for r in recs]  # noqa: E731
    assert strip(runs[1]) == strip(runs[3])
    ver = load_model(v_path, engine="llama.cpp")
    drf = load_model(d_path, engine="llama.cpp")[0]
    eos = eos_ids(ver[0], ver[1])
    for r in runs[1]:
        problem = next(p for p in problems if p.id == r["id"])
        ids = encode_chat(ver[1], problem.prompt.text)
        if r["method"] == ALONE:
            own = autoregressive_generate(ver[0], ids, settings, 10, r["seed"], eos)
        else:
            own = speculative_generate(ver[0], drf, r["method"], 3, settings, 10, r["seed"], ids, eos, drift=True)
            assert r["accepted"] == own.accepted
            assert r["answer_kl"] == pytest.approx(own.answer_kl, rel=1e-6, abs=1e-12)
        assert r["token_ids"] == own.tokens
        assert r["text"] == ver[1].decode(own.tokens, skip_special_tokens=True)
        assert r["correct"] is False  # a random tiny model does not do arithmetic


@pytest.mark.llamacpp
@pytest.mark.models
def test_the_command_line_runs_resumes_and_summarises(gguf_pair, tmp_path, capsys):
    from cactus_theory._cli import main

    v_path, d_path = gguf_pair
    out = tmp_path / "records.jsonl"
    argv = [
        "evaluate",
        "--verifier",
        v_path,
        "--draft",
        d_path,
        "--engine",
        "llama.cpp",
        "--rule",
        "sps",
        "--rule",
        "cactus(delta=4),lossy(alpha=0.5)",
        "--benchmark",
        "humaneval",
        "--data",
        str(FIXTURES / "benchmarks"),
        "--limit",
        "2",
        "--max-new-tokens",
        "6",
        "-m",
        "2",
        "--quiet",
        "--out",
        str(out),
        "--bootstrap",
        "200",
    ]
    assert main(argv) == 2  # HumanEval runs the models' code: asked for first
    assert "--allow-code-execution or CACTUS_ALLOW_CODE_EXECUTION=1" in capsys.readouterr().err
    assert not out.exists()
    argv.append("--allow-code-execution")
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "| humaneval | verifier alone | 2 |" in first and "lossy(alpha=0.5)" in first
    assert len(out.read_text().splitlines()) == 8
    assert main(argv) == 0 and len(out.read_text().splitlines()) == 8  # nothing decoded again
    capsys.readouterr()
    assert main(["evaluate", "--summarize", str(out), "--bootstrap", "200"]) == 0
    table = capsys.readouterr().out
    assert table.strip() == first.split("records in")[0].strip()
    # --rows: each answer keeps its rows (a new file: another setting), and --rescore pools them, no model; rows
    # too few for the sampling's top-k are refused before decoding
    assert main([*argv[:-5], "--out", str(tmp_path / "few.jsonl"), "--allow-code-execution", "--rows", "8"]) == 2
    assert "--rows 8: that many logits a position cannot hold the law of the sampling" in capsys.readouterr().err
    assert not (tmp_path / "few.jsonl").exists()
    rows_out = tmp_path / "rows.jsonl"
    assert (
        main([*argv[:-5], "--out", str(rows_out), "--bootstrap", "200", "--allow-code-execution", "--rows", "20"]) == 0
    )
    capsys.readouterr()
    held = [json.loads(line) for line in rows_out.read_text().splitlines()]
    assert all(len(r["rows"]["target"]["ids"]) == r["tokens"] for r in held if r["tokens"])
    assert main(["evaluate", "--rescore", str(rows_out), "--rule", "tas", "--bootstrap", "200"]) == 0
    pooled = capsys.readouterr().out
    assert "| humaneval | tas | 2 | no |" in pooled and "| humaneval | lossy(alpha=0.5) | 2 | yes |" in pooled
    # bad input: one line, exit 2
    for bad, message in (
        (["evaluate", "--summarize", str(out), "--rule", "sps"], "--summarize reads a records file alone"),
        (["evaluate", "--verifier", v_path], "give --verifier, --draft and at least one --rule"),
        (["evaluate", "--summarize", str(tmp_path / "none.jsonl")], "none.jsonl"),
        ([*argv[:-5], "--out", v_path, "--allow-code-execution"], "--out"),
        ([*argv, "--device", "nonsense"], "--device must be cpu, cuda, cuda:N or mps; got 'nonsense'"),
        ([*argv, "--device", "cuda:7"], "--device 'cuda:7'"),
    ):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    for bad, message in (  # refused by the parser, before anything else
        ([*argv, "-m", "1000000"], "argument -m: must be an integer from 1 to 256"),
        ([*argv, "--max-new-tokens", "1000000000"], "must be an integer from 1 to 131,072"),
        ([*argv, "--batch", "1000000"], "must be an integer from 1 to 1,024"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(bad)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_several_benchmarks_are_also_pooled():
    def rec(bench, pid, method, correct):
        return {"id": pid, "benchmark": bench, "method": method, "sample": 0, "correct": correct, "tokens": 1}

    records = [
        rec("gsm8k", "p0", ALONE, True),
        rec("gsm8k", "p0", "sps", False),
        rec("gsm8k", "p1", ALONE, True),
        rec("gsm8k", "p1", "sps", True),
        rec("humaneval", "p0", ALONE, False),
        rec("humaneval", "p0", "sps", False),
    ]
    summary = summarize_records(records, n_boot=100)
    rows = {(r["benchmark"], r["method"]): r for r in summary.rows}
    assert summary.problems == {"gsm8k": 2, "humaneval": 1, "all": 3}  # the same id in two benchmarks: two problems
    assert rows[("all", "sps")]["accuracy"] == pytest.approx(1 / 3, abs=1e-15)
    assert rows[("all", "sps")]["difference"] == pytest.approx(-1 / 3, abs=1e-15)
    assert rows[("all", "sps")]["discordant"] == [0, 1]


@pytest.mark.models
def test_on_the_hugging_face_engine_in_float32_an_answer_does_not_depend_on_the_batch(float32_pair):
    """What the docstring promises, checked: float32 on the Hugging Face engine gives each answer the same
    tokens at batch 1 and batch 3 (bfloat16 need not: its kernels round with the batch's shape)."""
    from cactus_theory._math._sampling import SamplingSettings

    settings = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)
    runs = {
        batch: _two_rules(float32_pair, settings=settings, max_new_tokens=8, batch=batch, drift=False)
        for batch in (1, 3)
    }
    assert [r["token_ids"] for r in runs[1]] == [r["token_ids"] for r in runs[3]]
    assert runs[1][0]["setting"]["arithmetic"] == {
        "verifier": {"engine": "hf", "dtype": "float32"},
        "draft": {"engine": "hf", "dtype": "float32"},
    }


# --- long answers: each answer's rows, and the exact probability of an answer against the engine ----------


@pytest.mark.models
def test_an_answers_exact_probability_is_the_engines_frequency(float32_pair):
    """The engine decodes one prompt 4,000 times (seeds 0..3999) with a rule whose law is far from the verifier's
    (always-accept: its drafts from p, its bonus from q, which a check against the verifier alone's law, or at
    another m, fails by orders of magnitude); each 3-token answer's
    frequency agrees with its exact probability from the answer's own teacher-forced rows (``sequence_rows`` ->
    ``sequence_log_probs``), and the probabilities of every answer seen sum to at most 1."""
    from cactus_theory._analysis._answer_rows import sequence_log_probs, sequence_rows
    from cactus_theory._math._sampling import SamplingSettings
    from cactus_theory._models._decoding import speculative_generate_batch
    from cactus_theory._models._dump import _forced_rows

    verifier, (draft, _, _) = float32_pair
    settings = SamplingSettings(temperature=1.0, top_k=3, top_p=1.0)
    prompt = [1, 2, 3, 4]
    runs, rule, m = 4000, "always-accept", 2
    seen = {}
    for start in range(0, runs, 500):
        results = speculative_generate_batch(
            verifier[0], draft, rule, m, [prompt] * 500, list(range(start, start + 500)), settings, 3
        )
        for res in results:
            seen[tuple(res.tokens)] = seen.get(tuple(res.tokens), 0) + 1
    total = 0.0
    worst = 0.0
    for tokens, count in seen.items():
        target = _forced_rows(verifier[0], prompt, list(tokens)).float().numpy()
        drafter = _forced_rows(draft, prompt, list(tokens)).float().numpy()
        rows = sequence_rows(target, drafter, tokens, 8)
        prob = float(np.exp(sequence_log_probs(rows, tokens, [rule], [m], settings)[rule][0]))
        total += prob
        se = np.sqrt(max(prob * (1 - prob), 1e-12) / runs)
        worst = max(worst, abs(count / runs - prob) / se)
    assert len(seen) >= 8 and total <= 1 + 1e-9
    # 27 answers at most: each within 4.5 standard errors (a Bonferroni bound over them at about 1e-4)
    assert worst < 4.5, worst


@pytest.mark.models
def test_records_with_rows_rescore_any_rule_from_the_pool(float32_pair, tmp_path):
    """``rows``: each answer keeps both models' kept logits at every position; the verifier alone's exact
    log-probability from them is the model's own (a forward of prompt and answer), SpS's equals it, and the
    pool gives every decoded and rescored method a row."""
    from cactus_theory._analysis._answer_rows import sequence_log_probs
    from cactus_theory._analysis._pooled import pooled_from_records, pooled_table
    from cactus_theory._math._sampling import SamplingSettings, processed_probs
    from cactus_theory._models._dump import _forced_rows
    from cactus_theory._models._hf import encode_chat

    verifier, _ = float32_pair
    problems = load_problems("gsm8k", FIXTURES / "benchmarks")
    settings = SamplingSettings(temperature=1.0, top_k=8, top_p=0.9)
    out = tmp_path / "long.jsonl"
    records = _two_rules(float32_pair, settings=settings, max_new_tokens=12, rows=8, drift=False, out=str(out))
    assert all(len(r["rows"]["target"]["ids"]) == r["tokens"] and r["rows_seconds"] >= 0 for r in records)
    assert records[0]["setting"]["answer_rows"] == 8
    for r in records[:3]:
        problem = next(p for p in problems if p.id == r["id"])
        ids = encode_chat(verifier[1], problem.prompt.text)
        q = processed_probs(_forced_rows(verifier[0], ids, r["token_ids"]).double().numpy(), settings)
        want = float(np.sum(np.log(q[np.arange(r["tokens"]), r["token_ids"]])))
        lp = sequence_log_probs(r["rows"], r["token_ids"], ["sps"], [3], settings)
        assert lp[ALONE][0] == pytest.approx(want, abs=1e-9)
        assert lp["sps"][0] == pytest.approx(want, abs=1e-9)
    rows = pooled_from_records(read_records(str(out)), ["cactus(delta=4)"], ms=[3, 5], n_boot=200)
    labels = [r["method"] for r in rows]
    assert labels == [ALONE, "cactus(delta=1)", "sps", "cactus(delta=4)", "cactus(delta=4) @ m=5"]
    assert all(r["answers"] == 3 * len(problems) and r["dropped"] == 0 for r in rows)
    sps = next(r for r in rows if r["method"] == "sps")
    assert sps["estimate"] == "pooled" and abs(sps["difference"]) < 1e-12  # the same law as the verifier alone
    assert "cactus(delta=4) @ m=5" in pooled_table(rows)
    with pytest.raises(ValueError, match="no answer keeps its rows"):
        pooled_from_records([{k: v for k, v in r.items() if k != "rows"} for r in records])
    # the command line: every decoded method and each --rule at the written -m, from the records alone
    from cactus_theory._cli import main

    pooled = tmp_path / "pooled.jsonl"
    argv = ["evaluate", "--rescore", str(out), "--rule", "cactus(delta=4)", "-m", "5", "--bootstrap", "200"]
    assert main([*argv, "--out", str(pooled)]) == 0
    written = [json.loads(line) for line in pooled.read_text().splitlines()]
    assert [(r["method"], r["m"]) for r in written] == [
        (ALONE, 3),
        ("cactus(delta=1)", 3),
        ("sps", 3),
        ("cactus(delta=4) @ m=5", 5),
    ]
    assert main(["evaluate", "--rescore", str(out), "--top-k", "9"]) == 2  # beyond the 8 logits kept
