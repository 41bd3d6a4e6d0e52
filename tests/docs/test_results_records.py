"""Every figure of the quality referee's and the deployment decision's pages comes from the records committed
beside them: ``cactus-theory evaluate --summarize`` on the committed records prints the pages' tables line for
line, the exact page's sampled check is recomputed from its two record files, and ``plan --quality`` on the
deployment page's records and calibration prints its recommendations."""

import gzip
import json
import sys
from pathlib import Path

from cactus_theory._cli import main

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
DEPLOY = "deployment_decision.md"


def _rows(page, first_cell):
    return [line for line in (RESULTS / page).read_text().splitlines() if line.startswith(f"| {first_cell} |")]


def test_the_exact_page_is_its_records_summarized(capsys):
    assert main(["evaluate", "--summarize", str(RESULTS / "quality_exact_records.jsonl.gz")]) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = _rows("quality_exact.md", "arc_challenge")
    assert len(rows) == 6 and all(row in printed for row in rows)


def test_the_exact_page_s_sampled_check_is_its_records():
    sys.path.insert(0, str(RESULTS.parents[1] / "experiments"))
    import quality_exact

    def read(name):
        with gzip.open(RESULTS / name, "rt", encoding="utf-8") as fh:
            return [r for r in map(json.loads, fh) if "method" in r]

    exact, sampled = read("quality_exact_records.jsonl.gz"), read("quality_exact_sampled_records.jsonl.gz")
    page = json.loads((RESULTS / "quality_exact.json").read_text())
    methods = [r["method"] for r in page["sampled"]]
    again = quality_exact.sampled_rows(sampled, exact, methods)
    assert again == page["sampled"] and len(again) == 6
    assert all(r["problems"] == 40 and r["inside"] for r in again)


def test_the_sampled_page_is_its_records_summarized(capsys):
    assert main(["evaluate", "--summarize", str(RESULTS / "quality_records.jsonl.gz")]) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = _rows("quality.md", "pooled") + _rows("quality.md", "gsm8k") + _rows("quality.md", "humaneval")
    assert len(rows) >= 10 and all(row in printed for row in rows)


def test_the_deployment_page_is_its_records_summarized(capsys):
    assert main(["evaluate", "--summarize", str(RESULTS / "deployment_records.jsonl.gz")]) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = [r for b in ("arc_challenge", "arc_easy", "commonsense_qa", "openbook_qa", "all") for r in _rows(DEPLOY, b)]
    assert len(rows) == 5 * 6 and all(row in printed for row in rows)


def test_the_deployment_recommendations_are_plan_quality_on_the_committed_files(capsys):
    """The page's recommendation for each chain, from its committed records and calibration alone (no model)."""
    page = json.loads((RESULTS / "deployment_decision.json").read_text())
    again = ["plan", "--quality", str(RESULTS / page["records"]), "--cost", str(RESULTS / page["cost"]), "--quiet"]
    again += ["--m", "2,4,6,8,10", "--max-loss", str(page["max_loss"]), "--bootstrap", str(page["bootstrap"])]
    for chain, flags in (("package", []), ("llama.cpp", ["--chain", "llama.cpp", "--min-p", "0.05"])):
        assert main([*again, *flags]) == 0
        assert page["chains"][chain]["line"] in capsys.readouterr().out, chain


def test_the_arc_challenge_records_with_rows_are_the_exact_page_s_own():
    """The deployment records' ARC-Challenge part (with answer rows) holds the exact page's values: accuracy, TV
    and q's mass on the correct letter to the bit, KL to 1e-15 (the page's older records keep rounding's -1e-16
    where the newer clamp it at 0)."""

    def values(name):
        with gzip.open(RESULTS / name, "rt", encoding="utf-8") as fh:
            rows = [r for r in map(json.loads, fh) if r.get("benchmark") == "arc_challenge"]
        return {(r["id"], r["method"]): r for r in rows}, rows

    page, _ = values("quality_exact_records.jsonl.gz")
    deploy, rows = values("deployment_records.jsonl.gz")
    assert len(page) == 1172 * 6 and set(deploy) == set(page)
    for key, mine in page.items():
        assert [mine[k] for k in ("accuracy", "tv", "q_correct")] == [
            deploy[key][k] for k in ("accuracy", "tv", "q_correct")
        ]
        kl = (mine["kl"], deploy[key]["kl"])  # always-accept's is infinite in both
        assert (kl[0] == kl[1] or abs(kl[0] - kl[1]) <= 1e-15) and kl[1] >= 0, key
    assert all("rows" in r for r in rows if r["method"] == "verifier alone")


def test_the_deployment_pages_range_of_speedups_is_the_records():
    """ "every setting's predicted request speedup lies between A and B" on the page: the least and the most of
    the committed frontiers' rows on this CPU (both chains), to the digits printed."""
    import re

    data = json.loads((RESULTS / "deployment_decision.json").read_text())
    speeds = [r["speedup"] for name in ("package", "llama.cpp") for r in data["chains"][name]["rows"] if r["m"] > 0]
    page = (RESULTS / "which-rule-should-i-deploy.md").read_text()
    low, high = re.search(r"lies between (\d\.\d\d)x .*? and (\d\.\d\d)x", page, flags=re.S).groups()
    assert (float(low), float(high)) == (round(min(speeds), 2), round(max(speeds), 2))
