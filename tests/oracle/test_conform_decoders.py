"""This package's own decoders through the engine oracle: every registered token rule (each name at its defaults),
decoded three at a time by the host loop (``HostBatch``) and by the device loop (``OnDevice``, where it takes the
rule), and one family of each kind (lossless, the bonus, slot-dependent, raw logits, deterministic) one at a time
by both (``HostChain``, ``OnDevice`` at batch 1), on a tiny model pair, emits the law of its first two tokens
that the rule's exact law says (the drafts' slots and the verifier's bonus included): a test of the decoding
loops that the law tests, which never run a decoder, cannot see. Each case at level 1e-4 (about 80 cases: a
false alarm among them at most once in 125 runs of the suite, and the seeds are fixed)."""

import pytest
from optional import torch  # noqa: F401  (the models extra)

from cactus_theory import SamplingSettings
from cactus_theory._models._device_loop import OnDevice
from cactus_theory._oracle._decoder_engine import DecoderEngine
from cactus_theory._oracle._study import conform
from cactus_theory._rules._protocol import judgement_of
from cactus_theory._rules._registry import as_rule, rule_classes
from cactus_theory.decode import DecodeSpec

pytestmark = pytest.mark.models
SETTINGS = SamplingSettings(temperature=1.0, top_k=5, top_p=1.0)
RULES = [r for r in (as_rule(name) for name in rule_classes(plugins=False)) if judgement_of(r).per_token]
ONE_AT_A_TIME = ["sps", "cactus", "lossy", "synthetic", "mars", "relaxed-topk"]
CASES = (
    [(rule, "batch", 3) for rule in RULES]
    + [(rule, "auto", 3) for rule in RULES if not rule.needs_logits]  # the device loop takes no raw logits
    + [
        (as_rule(name), path, 1)
        for name in ONE_AT_A_TIME
        for path in ("chain", "auto")
        if path == "chain" or name not in ("mars", "relaxed-topk")
    ]
)


@pytest.fixture(scope="module")
def pair(gguf_pair):
    from cactus_theory._models._hf import load_model

    return load_model(gguf_pair[0], dtype="float32", cache=False), load_model(
        gguf_pair[1], dtype="float32", cache=False
    )


@pytest.mark.parametrize(("rule", "path", "batch"), CASES, ids=[f"{r.describe()}-{p}-{b}" for r, p, b in CASES])
def test_every_token_rule_decodes_its_own_law(pair, rule, path, batch):
    spec = DecodeSpec(rule=rule, m=2, settings=SETTINGS, batch=batch)
    assert path != "auto" or OnDevice.ready(spec, pair[0][0], pair[1][0])
    engine = DecoderEngine(*pair, spec, path=path)
    assert engine.setting()["decoder"] == {"chain": "HostChain", "batch": "HostBatch", "auto": "OnDevice"}[path]
    result = conform(engine, rule, [("ctx", [3, 4, 5])], samples=120, tokens=2, seed=1)
    assert result.overall["p_value"] > 1e-4, (rule.describe(), path, batch, result.rows)
