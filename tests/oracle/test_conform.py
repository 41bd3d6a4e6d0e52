"""The engine oracle against fakes with a known law (``spec_fakes``): its false alarms at the nominal rate over
200 seeded runs of a correct fake, each planted defect detected (p < 0.01) at the samples the oracle says the
defect's total variation needs, the same verdicts over HTTP through the llama-server engine, and what it refuses
or flags: a server that reports no probabilities, probabilities that do not sum to 1, rows that move between two
asks, a stalled stream, a closed port; then a real llama-server with a draft model (tiny GGUF pair) through the
command line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from local_servers import FakeServer, free_port, llama_server
from scipy import stats
from spec_fakes import DEFECTS, FakeEngine, World, fake_llama_server, speculative_sample

from cactus_theory import SamplingSettings, make_rule
from cactus_theory._math._multinomial import draws_for_tv
from cactus_theory._oracle._law import exact_tested_law
from cactus_theory._oracle._study import conform

pytestmark = pytest.mark.servers
WORLD = World(seed=0)
#: A world where the chain's order matters: temperature 0.5 and top-p 0.7.
ORDERED = World(seed=0, settings=SamplingSettings(temperature=0.5, top_k=0, top_p=0.7))
CONTEXTS = [(f"c{c}", WORLD.context(c)) for c in range(4)]


def _setup(defect):
    world = ORDERED if defect == "temperature-after-top-p" else WORLD
    claimed = "block" if defect == "block-tokenwise" else "sps"
    return world, claimed, (1 if defect == "bonus-from-draft" else 2)


def test_false_alarms_of_a_correct_engine_are_at_the_nominal_rate():
    """200 seeded runs of the oracle on a correct fake (150 samples, two positions): the rejections at alpha =
    0.05 within the binomial 99% interval of 200 x 0.05, the p-values uniform."""
    p_values = []
    for run in range(200):
        engine = FakeEngine(WORLD, "none", m=2)
        result = conform(engine, "sps", CONTEXTS[:1], samples=150, tokens=2, seed=run)
        p_values.append(result.overall["p_value"])
    low, high = stats.binom.interval(0.99, 200, 0.05)
    assert low <= sum(p < 0.05 for p in p_values) <= high
    assert stats.kstest(p_values, "uniform").pvalue > 0.001


def _defect_tv(world, defect, claimed, m, context):
    """The defect's total variation from the claimed law at one context (tested positions after the forced first
    token), by a Monte Carlo of 20,000 samples of the fake itself."""
    engine = FakeEngine(world, defect, m)
    prefix = [*world.context(context), 0]
    law = exact_tested_law(engine, make_rule(claimed), prefix, 2, m)
    counts = {}
    for s in range(20_000):
        out, _ = speculative_sample(world, context, 4, 10_000 + s, defect, m)
        if out[0] == 0:
            counts[tuple(out[1:3])] = counts.get(tuple(out[1:3]), 0) + 1
    total = sum(counts.values())
    keys = set(law) | set(counts)
    return 0.5 * sum(abs(law.get(k, 0.0) - counts.get(k, 0) / total) for k in keys), law


@pytest.mark.parametrize("defect", [d for d in DEFECTS if d != "none"])
def test_each_planted_defect_is_found_at_the_samples_the_oracle_says_it_needs(defect):
    world, claimed, m = _setup(defect)
    tv, law = _defect_tv(world, defect, claimed, m, 0)
    assert tv > 0.03, (defect, tv)
    kept = int(draws_for_tv(list(law.values()), tv, alpha=0.01))  # the least favourable direction's N
    forced = float(world.q(0, 0)[0])  # the first token's probability: the others are set aside
    needed = int(np.ceil(kept / forced))
    result = conform(FakeEngine(world, defect, m), claimed, CONTEXTS[:1], samples=needed, tokens=2)
    assert result.overall["p_value"] < 0.01, (defect, tv, needed, result.overall)
    correct = conform(FakeEngine(world, "none", m), claimed, CONTEXTS[:1], samples=needed, tokens=2)
    assert correct.overall["p_value"] > 0.01


@pytest.mark.parametrize("defect", ["none", "residual-q", "bonus-from-draft"])
def test_over_http_the_llama_server_engine_gives_the_same_verdicts(defect):
    from cactus_theory._oracle._llama_server import LlamaServerEngine

    world, claimed, m = _setup(defect)
    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, chain="llama.cpp")
    with (
        FakeServer(fake_llama_server(world, defect, m)) as server,
        FakeServer(fake_llama_server(world, draft=True)) as draft,
    ):
        engine = LlamaServerEngine(server.url, settings=settings, draft_url=draft.url, n_probs=20, m=m)
        result = conform(engine, claimed, CONTEXTS[:2], samples=600, tokens=2)
    local = conform(FakeEngine(world, defect, m), claimed, CONTEXTS[:2], samples=600, tokens=2)
    assert [r["p_value"] for r in result.rows] == [r["p_value"] for r in local.rows]  # the same samples
    assert (result.overall["p_value"] < 0.01) == (defect != "none")
    assert "consistent" not in result.rows[0]  # two positions tested: several drafts a request, no counters
    if defect == "none":  # one position: one draft a request; SpS's acceptance fits, sampler-match's does not
        with (
            FakeServer(fake_llama_server(world, defect, m)) as server,
            FakeServer(fake_llama_server(world, draft=True)) as draft,
        ):
            engine = LlamaServerEngine(server.url, settings=settings, draft_url=draft.url, n_probs=20, m=m)
            one = conform(engine, claimed, CONTEXTS[:2], samples=1500, tokens=1)
        assert one.rows[0]["drafted"] == one.rows[0]["kept"]  # one draft each
        assert "SpS (sampled draft)" in one.overall["consistent"]
        assert "sampler-match (sampled draft)" not in one.overall["consistent"]


def _engine(handler, **kw):
    from cactus_theory._oracle._llama_server import LlamaServerEngine

    settings = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, chain="llama.cpp")
    return FakeServer(handler), lambda url: LlamaServerEngine(url, settings=settings, n_probs=20, **kw)


def test_a_server_without_probabilities_is_refused():
    server, make = _engine(fake_llama_server(WORLD, no_probs=True))
    with server, pytest.raises(Exception, match="no post-sampling probabilities"):
        conform(make(server.url), "sps", CONTEXTS[:1], samples=10)


def test_probabilities_that_do_not_sum_to_one_are_refused():
    def short(method, path, body, headers):
        status, answer = fake_llama_server(WORLD)(method, path, body, headers)
        if "completion_probabilities" in answer:
            answer["completion_probabilities"][0]["top_probs"] = answer["completion_probabilities"][0]["top_probs"][:2]
        return status, answer

    server, make = _engine(short)
    with server, pytest.raises(ValueError, match=r"leaves .* of the law out"):
        conform(make(server.url), "sps", CONTEXTS[:1], samples=10)


def test_rows_that_move_between_two_asks_are_flagged():
    server, make = _engine(fake_llama_server(WORLD, drift=0.2))
    with server:
        result = conform(make(server.url), "sps", CONTEXTS[:1], samples=50, tokens=1)
    assert result.rows[0]["row_drift"] > 0.01
    assert any("other rows for the same context" in n and "not to be trusted" in n for n in result.notes)


def test_a_stalled_stream_and_a_closed_port_are_errors_naming_the_server():
    server, make = _engine(fake_llama_server(WORLD, stall=3.0), timeout=0.5)
    with server, pytest.raises(Exception, match=r"no answer within 0\.5 s|timed out"):
        conform(make(server.url), "sps", CONTEXTS[:1], samples=5)
    _, make = _engine(None)
    with pytest.raises(Exception, match=r"127\.0\.0\.1"):
        conform(make(f"http://127.0.0.1:{free_port()}"), "sps", CONTEXTS[:1], samples=5)


@pytest.mark.llamacpp
def test_a_real_llama_server_with_a_draft_model_emits_its_own_law(server_binary, tiny_ggufs, tmp_path):
    """llama-server's speculative sampling (sampler-match verification, greedy drafts) on the tiny pair, through
    the command line: not rejected, its counts consistent with the greedy draft's acceptance."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ab cd\nef gh ab\ncd ef\ngh ab\n")
    spec_args = ("-np", "1", "-c", "512", "--spec-type", "draft-simple", "--model-draft", str(tiny_ggufs[1]))
    with (
        llama_server(server_binary, tiny_ggufs[0], *spec_args, log_dir=tmp_path) as spec,
        llama_server(server_binary, tiny_ggufs[1], "-np", "1", "-c", "512", log_dir=tmp_path) as draft,
    ):
        argv = ["conform", "--server", spec.url, "--draft-server", draft.url, "--prompts", str(prompts)]
        argv += ["--contexts", "2", "--samples", "300", "--forced", "0.05", "--chain", "llama.cpp"]
        argv += ["--temperature", "1.0", "--top-k", "8", "--top-p", "1", "--quiet", "--report", str(tmp_path / "r")]
        done = subprocess.run([sys.executable, "-m", "cactus_theory", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "r" / "conform.json").read_text())
    assert len(report["rows"]) == 2 and all(r["p_value"] > 0.001 for r in report["rows"])
    assert "sampler-match (greedy draft)" in done.stdout
    assert np.isfinite(report["rows"][0]["detectable_tv"])


def test_choosing_contexts_reads_each_row_as_a_law_first():
    """A server whose rows sum to 0.6 is refused for that, not for contexts "not nearly forced"."""
    from cactus_theory.oracle import choose_contexts

    class Leaky(FakeEngine):
        def rows(self, prefix):
            q, p = super().rows(prefix)
            return {t: 0.6 * v for t, v in q.items()}, p

    with pytest.raises(ValueError, match=r"the reported probabilities sum to 0\.600000"):
        choose_contexts(Leaky(WORLD), CONTEXTS, 2)


def test_conform_checks_its_report_before_drawing_a_sample(tmp_path, capsys):
    from cactus_theory._cli import main

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    taken = tmp_path / "report"
    taken.write_text("a file, not a directory")
    # a closed port: the refusal must come first, before any request
    assert main(["conform", "--server", "http://127.0.0.1:9", "--prompts", str(prompts), "--report", str(taken)]) == 2
    assert "--report" in capsys.readouterr().err
