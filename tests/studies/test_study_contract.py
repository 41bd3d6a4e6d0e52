"""Every long run of the package is a study that keeps the runner's contract (``check_study``): the exact
referee, the sampled referee, decoding many prompts and the engine oracle, on the tiny GGUF pair given by path
(so that two Dask worker processes load it too): a resumed run gives the uninterrupted run's records, two
workers give one process's, records of another setting are refused, and the summary is a function of the records
alone."""

import json

import pytest
from optional import torch  # noqa: F401  (the models extra)

from cactus_theory import SamplingSettings
from cactus_theory._data._graders import load_problems
from cactus_theory.decode import DecodeSpec, DecodeStudy
from cactus_theory.quality import ExactReferee, SampledReferee
from cactus_theory.testing import check_study
from cactus_theory.traces import Prompt

pytestmark = [pytest.mark.models, pytest.mark.distributed]


def passed(report, skipped=()):
    """Every check passed but those named in ``skipped``, which said why they could not run."""
    assert {k for k, v in report.items() if v.startswith("skipped")} == set(skipped), report
    assert all(v.startswith("passed") for k, v in report.items() if k not in skipped), report


OPTIONS = {"dtype": "float32", "cache": False}
SETTINGS = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0)


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    path = tmp_path_factory.mktemp("choices") / "choices.jsonl"
    rows = [{"question": f"ab cd {i}", "choices": ["ab", "cd", "ef", "gh"], "answer": "ABCD"[i % 4]} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_problems("choice", path=str(path))


def test_the_exact_referee_keeps_the_study_contract(gguf_pair, problems):
    rules = ["sps", "cactus(delta=1)"]
    passed(check_study(lambda: ExactReferee(*gguf_pair, problems, rules, settings=SETTINGS, load_options=OPTIONS)))


def test_the_sampled_referee_keeps_the_study_contract(gguf_pair, problems):
    def make():
        return SampledReferee(
            *gguf_pair,
            problems,
            ["sps"],
            m=2,
            settings=SETTINGS,
            max_new_tokens=2,
            samples=2,
            batch=2,
            load_options=OPTIONS,
        )

    passed(check_study(make))


def test_decoding_keeps_the_study_contract(gguf_pair):
    prompts = [Prompt(id=f"p{i}", task="t", text=f"ab cd {i}", index=i) for i in range(3)]
    spec = DecodeSpec(m=2, settings=SETTINGS, max_new_tokens=4, baseline=True, chunk_seconds=0.0)
    passed(
        check_study(lambda: DecodeStudy(*gguf_pair, ["sps", "cactus(delta=1)"], prompts, spec, load_options=OPTIONS))
    )


def test_the_engine_oracle_keeps_the_study_contract(gguf_pair):
    from cactus_theory import make_rule
    from cactus_theory._oracle._decoder_engine import DecoderEngine
    from cactus_theory._oracle._study import ConformanceStudy

    rule = make_rule("sps")
    spec = DecodeSpec(rule=rule, m=2, settings=SETTINGS, batch=2)
    contexts = [("a", [3, 4, 5]), ("b", [5, 6]), ("c", [7, 3, 2, 1])]
    report = check_study(
        lambda: ConformanceStudy(DecoderEngine(*gguf_pair, spec, load_options=OPTIONS), rule, contexts, samples=12)
    )
    passed(report, skipped=["study_partly_held"])  # one record a context
