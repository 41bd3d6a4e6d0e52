"""A rule is one module: a rule written in a user's own module, outside the package, is
registered, built by ``make_rule``, listed and analysed by the CLI (``--plugin`` or the entry
point group ``cactus_theory.rules``) and checked by ``check_rule`` like ours; a wrong one fails
with the check named. Each case runs in its own interpreter, so the registry of the test process
never sees these rules."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from children import run_with_module
from locations import HANG_GUARD, TESTS

import cactus_theory
from cactus_theory.testing import CHECKS, check_rule

GOOD = '''
from dataclasses import dataclass
from typing import ClassVar

from cactus_theory.rules import GeneralizedRule


@dataclass(frozen=True)
class Halfway(GeneralizedRule):
    """Generalised speculative sampling towards the midpoint h = (p + q) / 2."""

    weight: float = 0.5
    name: ClassVar[str] = "halfway"
    reference: ClassVar[str] = "a test of the plugin mechanism"
    comparison: ClassVar[tuple] = (("", {"weight": 0.5}, "verifier"),)

    def __post_init__(self):
        if not 0 <= self.weight <= 1:
            raise ValueError(f"weight must be in [0, 1]; got {self.weight!r}")

    def _surrogate(self, b, p, q, n, lg):
        return self.weight * p + (1 - self.weight) * q
'''

WRONG_LAW = '''
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cactus_theory import SpS


@dataclass(frozen=True)
class Boasting(SpS):
    """SpS whose emitted law claims to be p: wrong unless p = q."""

    name: ClassVar[str] = "boasting"
    lossless: ClassVar[bool] = False

    def emitted(self, draft_probs, target_probs, *, logits=None):
        return np.asarray(draft_probs, dtype=float)
'''

TYPICAL_AGAIN = '''
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cactus_theory import Rule


@dataclass(frozen=True)
class Typical(Rule):
    """Medusa's typical acceptance, written again."""

    epsilon: float = 0.09
    alpha: float = 0.3
    deterministic: ClassVar[bool] = True
    name: ClassVar[str] = "typical"

    def _acceptance(self, b, p, q, n, lg):
        entropy = -b.sum_last(q * b.log(q + 1e-5))
        threshold = b.minimum(self.alpha * b.exp(-entropy), self.epsilon)
        return b.where(b.take_last(q, n) > threshold, 1.0, 0.0) + 0.0 * entropy

    def _correction(self, b, p, q, n, lg):
        return b.put_last(q * 0.0, b.argmax_last(q), 1.0)
'''


def _run(tmp_path, code, *cli, env=None):
    """Run Python code (or, with ``cli``, the CLI) in a fresh interpreter in ``tmp_path``."""
    argv = [sys.executable, "-m", "cactus_theory", *cli] if cli else [sys.executable, "-c", textwrap.dedent(code)]
    environ = {**os.environ, **(env or {})}
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=environ, timeout=HANG_GUARD)


def test_a_users_rule_is_registered_built_and_passes_every_check(tmp_path):
    (tmp_path / "my_rules.py").write_text(GOOD)
    done = _run(
        tmp_path,
        """
        import json
        import my_rules
        from cactus_theory import available_rules, make_rule
        from cactus_theory.compare import comparison_entries
        from cactus_theory.testing import check_rule
        rule = make_rule("halfway(weight=0.25)")
        info = available_rules()["halfway"]
        report = check_rule(rule)
        print(json.dumps({"rule": rule.describe(), "builtin": info.builtin, "report": report,
                          "compared": [e for e in comparison_entries() if e[1].startswith("halfway")]}))
        """,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rule"] == "halfway(weight=0.25)" and out["builtin"] is False
    assert set(out["report"]) == set(CHECKS)
    no_torch = importlib.util.find_spec("torch") is None
    allowed = {"passed", "skipped: not lossless", "skipped: not a block rule", "skipped: not a multi-draft rule"}
    allowed |= {"skipped: torch is not installed"} if no_torch else set()
    assert set(out["report"].values()) <= allowed, out
    assert out["compared"] == [["", "halfway(weight=0.5)", "verifier"]]


def test_the_cli_lists_and_analyses_a_plugin_rule(tmp_path):
    (tmp_path / "my_rules.py").write_text(GOOD)
    listed = _run(tmp_path, None, "--plugin", "my_rules", "rules")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("halfway"))
    assert "midpoint" in line and "[plugin my_rules]" in line
    analysed = _run(
        tmp_path,
        None,
        "analyze",
        "--plugin",
        "my_rules",
        "--rules",
        "sps,halfway",
        "--m",
        "4",
        "--bootstrap",
        "100",
        "--processes",
        "2",
        "--quiet",
    )
    assert analysed.returncode == 0, analysed.stderr
    assert any(x.startswith("halfway") for x in analysed.stdout.splitlines())
    missing = _run(tmp_path, None, "--plugin", "nowhere_rules", "rules")
    assert missing.returncode == 2 and "no module named 'nowhere_rules'" in missing.stderr


def test_an_entry_point_registers_rules_without_a_flag(tmp_path):
    site = tmp_path / "site"
    (site / "halfway_pkg").mkdir(parents=True)
    (site / "halfway_pkg" / "__init__.py").write_text("")
    (site / "halfway_pkg" / "rules.py").write_text(GOOD)
    dist = site / "halfway_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: halfway-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cactus_theory.rules]\nhalfway = halfway_pkg.rules\n")
    pythonpath = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    done = _run(tmp_path, None, "rules", env={"PYTHONPATH": pythonpath})
    assert done.returncode == 0, done.stderr
    assert "[plugin halfway_pkg.rules]" in done.stdout


def test_a_rule_whose_emitted_law_is_wrong_fails_with_the_check_named(tmp_path):
    (tmp_path / "wrong.py").write_text(WRONG_LAW)
    done = _run(
        tmp_path,
        """
        import wrong
        from cactus_theory.testing import check_rule
        try:
            check_rule("boasting")
        except AssertionError as exc:
            print("FAILED:", exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "FAILED: check_rule('boasting'): emitted_matches_bruteforce failed" in done.stdout
    assert "the emitted law differs from the brute force" in done.stdout and "p = array(" in done.stdout


def test_a_rule_written_again_under_a_new_name_is_caught(tmp_path):
    (tmp_path / "typical.py").write_text(TYPICAL_AGAIN)
    done = _run(
        tmp_path,
        """
        import typical
        from cactus_theory.testing import check_rule, conformance_rules, same_rules
        check_rule("typical", checks=["probabilities", "emitted_matches_bruteforce"])
        print(same_rules(conformance_rules()))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "[('tas', 'typical(epsilon=0.09)')]" in done.stdout


def test_check_rule_names_unknown_checks():
    with pytest.raises(ValueError, match="unknown check"):
        check_rule("sps", checks=["nonsense"])


def test_the_rules_namespace_needs_no_list():
    from cactus_theory import rules

    assert rules.Cactus is cactus_theory.Cactus and "SpS" in dir(rules)
    with pytest.raises(AttributeError, match="no registered rule class"):
        rules.Nonsense  # noqa: B018


HERE = str(TESTS)  # the tests' helper modules, for the PYTHONPATH of a child process


def test_a_plugin_cannot_take_a_built_in_name_whatever_its_module_claims(tmp_path):
    out = run_with_module(
        tmp_path,
        "",
        """
        from dataclasses import dataclass
        from typing import ClassVar
        from cactus_theory import Rule, available_rules, make_rule
        try:
            @dataclass(frozen=True)
            class Fake(Rule):
                name: ClassVar[str] = "sps"
            Fake.__module__ = "cactus_theory._rules.sps"
        except ValueError as exc:
            print("refused:", exc)
        body = {"name": "sps", "__module__": "cactus_theory._rules.sps", "__qualname__": "SpS"}
        try:
            type("SpS", (Rule,), body)
        except ValueError as exc:
            print("refused:", exc)
        print(type(make_rule("sps")).__module__, available_rules()["sps"].builtin)
        """,
    )
    assert out.count("refused: rule name 'sps' is taken by a built-in rule") == 2
    assert out.strip().splitlines()[-1] == "cactus_theory._rules.sps True"


BROKEN_PLUGIN = "raise RuntimeError('this plugin is broken')\n"


NO_DEFAULT = '''
from dataclasses import dataclass
from typing import ClassVar
from cactus_theory.rules import GeneralizedRule


@dataclass(frozen=True)
class NoDefault(GeneralizedRule):
    """A parameter without a default."""

    weight: float
    name: ClassVar[str] = "no-default"

    def _surrogate(self, b, p, q, n, lg):
        return q
'''


def _site_with_plugin(tmp_path, text):
    site = tmp_path / "site"
    (site / "bad_pkg").mkdir(parents=True)
    (site / "bad_pkg" / "__init__.py").write_text("")
    (site / "bad_pkg" / "rules.py").write_text(text)
    dist = site / "bad_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[cactus_theory.rules]\nbad = bad_pkg.rules\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), HERE, os.environ.get("PYTHONPATH", "")])}


def _cli(tmp_path, env, *argv):
    return subprocess.run(
        [sys.executable, "-m", "cactus_theory", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD,
    )


def test_a_broken_entry_point_plugin_is_named_in_one_line_and_the_rest_works(tmp_path):
    env = _site_with_plugin(tmp_path, BROKEN_PLUGIN)
    line = "the rule plugin 'bad' (bad_pkg.rules, entry point group 'cactus_theory.rules') failed to import"
    commands = (
        ["rules"],
        ["analyze", "--help"],
        ["gamma", "--target-prob", "0.3", "--delta", "1"],
        ["analyze", "--rules", "sps", "--m", "2", "--bootstrap", "0", "--quiet"],
    )
    for argv, code in ((a, 0) for a in commands):
        done = _cli(tmp_path, env, *argv)
        assert done.returncode == code, done.stderr
        assert "Traceback" not in done.stderr
        if argv[0] != "gamma":
            warnings = [x for x in done.stderr.splitlines() if line in x]
            assert len(warnings) == 1 and warnings[0].startswith("cactus-theory: warning:"), done.stderr
    # in Python: every listing says the same, and the built-ins stay listed
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import warnings
            from cactus_theory import available_rules, make_rule
            from cactus_theory._rules import RulePluginWarning, plugin_errors
            for _ in range(2):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    rules = available_rules()
                print(len(rules) > 20, [str(w.message)[:40] for w in seen if w.category is RulePluginWarning])
            try:
                make_rule("bad-rule")
            except ValueError as exc:
                print("failed to import" in str(exc))
        """),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD,
    )
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0] == lines[1] == "True [\"the rule plugin 'bad' (bad_pkg.rules, en\"]" and lines[2] == "True"


def test_a_plugin_rule_without_a_default_is_one_clear_line(tmp_path):
    (tmp_path / "nodefault.py").write_text(NO_DEFAULT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    for argv in (["rules"], ["analyze", "--rules", "sps", "--m", "2"]):
        done = _cli(tmp_path, env, "--plugin", "nodefault", *argv)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert done.stderr.strip().splitlines() == [
            "cactus-theory: error: --plugin nodefault: rule 'no-default' (nodefault.NoDefault) cannot be used: its "
            "parameter 'weight' has no default: give every rule parameter a default"
        ]
