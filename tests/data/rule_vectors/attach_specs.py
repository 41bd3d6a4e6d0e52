"""How vectors.json.gz was made from the published vectors: each setting gets the spec string of
the registered rule it tests ("spec"), the sampling temperature a logit case is processed with
when the setting overrides it ("temperature"), and the block slot of a slot-dependent rule
("slot"), so that the test needs no mapping of its own; the meta block's "reference" names the
code base the formulas come from. Nothing else is changed.

    python tests/data/rule_vectors/attach_specs.py VECTORS_JSON tests/data/rule_vectors/vectors.json.gz
"""

import gzip
import json
import sys


def spec(rule, params):
    join = ";".join
    specs = {
        "strict": lambda: "sps",
        "cactus": lambda: f"cactus(delta={params['delta']})",
        "ensemble": lambda: f"ensemble(verifier_weight={params['verifier_weight']})",
        "always_accept": lambda: "always-accept",
        "rfsd": lambda: f"rfsd(divergence={params['divergence']}, threshold={params['threshold']})",
        "fsd": lambda: f"fsd(divergence={params['divergence']}, threshold={params['threshold']})",
        "spec_cascade_opt": lambda: f"spec-cascade-opt(alpha={params['alpha']}, gate={params['gate']})",
        "spec_cascade_tok3": lambda: f"spec-cascade-tok3(alpha={params['alpha']}, top_set={params['top_set']})",
        "lossy_spec_decode_beta1": lambda: f"lossy(alpha={params['alpha']})",
        "scd_expert_toppk_gated": lambda: f"scd(beta={params['beta']}, temperature={params['scd_temperature']})",
        "scd_alpha": lambda: (
            f"scd(beta={params['beta']}, temperature={params['scd_temperature']}, gate=alpha, "
            f"alpha={params['scd_alpha']})"
        ),
        "synthetic": lambda: f"synthetic(rates=[{join(str(r) for r in params['unconditional_rates'])}])",
    }
    return specs[rule]()


def main(src, dst):
    with open(src) as fh:
        data = json.load(fh)
    for entry in data["rules"]:
        for setting in entry["settings"]:
            params = setting["params"]
            setting["spec"] = spec(entry["rule"], params)
            setting["temperature"] = params.get("request_temperature")
            setting["slot"] = params.get("position")
    # the formulas were written down in a private specification; name the code base instead
    data["meta"]["reference"] = (
        "a float64 NumPy reference of the formulas of graphcore-research/relaxed-spec-dec-repro @ c28353f "
        "(vllm_overlay/files/v1/sample/rejection_sampler.py), checked against that code's own torch functions and "
        "(emulated) kernels"
    )
    data["meta"]["specs_note"] = (
        "spec / temperature / slot added by tests/data/rule_vectors/attach_specs.py: the cactus_theory rule each "
        "setting tests, the sampling temperature it overrides (null: the case's own) and the block slot"
    )
    with gzip.open(dst, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump(data, fh, separators=(",", ":"))


if __name__ == "__main__":
    main(*sys.argv[1:3])
