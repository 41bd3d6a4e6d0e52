"""The house's page (docs/contributing/house.md) names what exists: every wing of the table is a
subpackage, every wing of the layers contract is in the table, every file and module it names is
there, and the test folders it lists mirror the wings."""

import re

import pytest
from locations import ROOT

PAGE = (ROOT / "docs" / "contributing" / "house.md").read_text(encoding="utf-8")


def _table_wings():
    return re.findall(r"^\| `(_[a-z]+)` \|", PAGE, flags=re.M)


def test_every_wing_of_the_table_exists_and_every_layer_is_in_it():
    import tomllib

    wings = _table_wings()
    assert len(wings) >= 10
    for wing in wings:
        assert (ROOT / "cactus_theory" / wing / "__init__.py").is_file(), f"the page names a wing {wing} that is gone"
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    named = {w.split(".")[-1] for layer in layers for w in layer.split(" | ")}
    assert named == set(wings), f"the contract's wings {sorted(named)} against the page's {sorted(wings)}"
    packages = {
        p.name for p in (ROOT / "cactus_theory").iterdir() if (p / "__init__.py").is_file() and p.name != "data"
    }
    assert packages == set(wings), f"subpackages {sorted(packages)} against the page's {sorted(wings)}"


def test_every_file_and_module_the_page_names_exists():
    paths = set(re.findall(r"`((?:cactus_theory|tests|experiments|docs)/[A-Za-z0-9_/<>.-]+)`", PAGE))
    assert paths
    for path in paths:
        if "<" in path:  # a pattern such as cactus_theory/_rules/<family>.py: its folder exists
            path = path.split("<")[0]
        assert (ROOT / path).exists(), f"the page names {path}, which does not exist"
    # what a wing's row names as `_name` is one of its modules, or a function or class defined in it
    for wing, text in re.findall(r"^\| `(_[a-z]+)` \| (.*) \|[^|]*\|$", PAGE, flags=re.M):
        here = ROOT / "cactus_theory" / wing
        sources = "\n".join(f.read_text(encoding="utf-8") for f in here.glob("*.py"))
        for name in set(re.findall(r"`(_[a-z_]+)`", text)):
            found = (
                (here / f"{name}.py").is_file()
                or (here / name / "__init__.py").is_file()
                or re.search(rf"^(def|class) {name}\b", sources, flags=re.M)
            )
            assert found, f"the page names {wing}.{name}: neither a module nor a definition of that wing"


def test_the_test_folders_mirror_the_wings():
    folders = set(re.findall(r"`tests/([a-z]+)/`", PAGE)) - {"fixtures"}
    actual = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert folders == actual, f"the page lists {sorted(folders)}, tests/ holds {sorted(actual)}"
    assert not list((ROOT / "tests").glob("test_*.py")), "every test file sits in a wing's folder"


# --- the page's "One place for each fact", each checked ------------------------------------------------

PACKAGE = ROOT / "cactus_theory"


def _sources():
    """{path relative to the package: its text} of every module of the package."""
    return {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}


def test_no_module_is_over_700_lines():
    scripts = {f"experiments/{p.name}": p.read_text(encoding="utf-8") for p in (ROOT / "experiments").glob("*.py")}
    long = {name: text.count("\n") for name, text in {**_sources(), **scripts}.items() if text.count("\n") > 700}
    assert not long, f"modules or experiment scripts over 700 lines: {long}"
    assert "over 700 lines" in PAGE


#: ``x.slot_dependent`` read anywhere but on a judgement (``judgement.slot_dependent``,
#: ``judgement_of(rule).slot_dependent``, ``spec.judgement.slot_dependent``).
_SLOT_READ = r"(?<!judgement)(?<!judgement_of\(rule\))(?<!judgement_of\(cls\))\.slot_dependent\b"


def kind_violations(sources) -> list:
    """Where a module reads a rule's kind other than through ``judgement_of``: ``kind_of``, a kind compared by
    name, ``Rule.judges``, ``getattr(x, "kind" ...)`` or a rule's ``slot_dependent`` read outside the protocol,
    the registry read by its private table."""
    found = []
    for name, text in sources.items():
        if name == "_rules/_protocol.py":
            continue
        checks = {
            "calls kind_of: ask judgement_of(rule)": r"\bkind_of\(",
            "compares a rule's kind by name": r"""\.kind\s*(?:==|!=)\s*["'](?:token|block|multi-draft)["']""",
            "reads Rule.judges: ask judgement_of(rule)": r"\.judges\s*(?:==|!=)",
            "reads a kind by getattr: ask judgement_of(rule)": (
                r"""getattr\(\s*[\w.]+\s*,\s*["'](?:kind|judges|slot_dependent)["']"""
            ),
            "reads slot_dependent: ask judgement_of(rule).slot_dependent": _SLOT_READ,
            "reads the registry's private table: use rule_classes()": r"_registry\._REGISTRY|import _REGISTRY\b",
        }
        for why, pattern in checks.items():
            if name == "_rules/_registry.py" and "registry" in why:
                continue
            if re.search(pattern, text):
                found.append(f"{name} {why}")
    return found


def test_a_rules_kind_is_read_in_the_protocol_alone():
    sources = _sources()
    assert "def judgement_of(" in sources["_rules/_protocol.py"] and "def kind_of(" in sources["_rules/_protocol.py"]
    assert not kind_violations(sources)


@pytest.mark.parametrize(
    "planted",
    [
        'if getattr(rule, "kind", "token") != "token":\n    pass\n',
        "if rule.slot_dependent:\n    pass\n",
        'if rule.kind == "block":\n    pass\n',
        "from .._rules._registry import _REGISTRY\n",
        'x = getattr(cls, "slot_dependent", False)\n',
    ],
)
def test_the_kind_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_laws/_gate.py"] += "\n" + planted
    assert any(v.startswith("_laws/_gate.py") for v in kind_violations(sources)), planted


def test_a_rules_optional_laws_are_looked_up_in_the_laws_alone():
    from cactus_theory._laws._lengths import OPTIONAL_LAWS

    for name, text in _sources().items():
        if name == "_laws/_lengths.py":
            continue
        for law in OPTIONAL_LAWS:
            asked = re.findall(rf"""(?:hasattr|getattr)\([^)]*["']{law}["']""", text)
            assert not asked, f"{name} asks hasattr / getattr of {law}: use stated_law(rule, {law!r})"


def test_server_protocols_are_known_to_their_registry_alone():
    from cactus_theory.servers import ServerProtocol, protocol_class, protocol_names

    sources = _sources()
    defined = {}
    for name, text in sources.items():
        if name.startswith("_servers/_") and name.endswith("_protocol.py") and name != "_servers/_protocol.py":
            found = re.findall(r"""^    name = ["']([^"']+)["']""", text, flags=re.M)
            assert len(found) == 1, f"{name} defines {len(found)} protocols: one file, one protocol"
            defined[found[0]] = name
    assert set(defined) == set(protocol_names()), (defined, protocol_names())
    assert all(issubclass(protocol_class(n), ServerProtocol) for n in protocol_names())
    for name, text in sources.items():  # no module lists the protocols' names itself
        listed = re.findall(r"""["']llama\.cpp["'],\s*["']openai["']|["']openai["'],\s*["']sglang["']""", text)
        assert not listed, f"{name} lists protocol names: read them from protocol_names()"
        if not name.startswith("_servers/"):
            assert "def detects(" not in text, f"{name} detects a server outside the servers wing"


#: An integer check written out: ``isinstance(x, int)``, ``isinstance(self.k, (int, np.integer))`` (any subject,
#: attributes included), with or without ``isinstance(x, bool) or`` before it.
_INTEGER_CHECK = re.compile(
    r"(?<![\w.])isinstance\(\s*[\w.\[\]\"'()]+?\s*,\s*(?:int|\(\s*int\s*,\s*np\.integer\s*,?\s*\)|\(\s*np\.integer\s*,\s*int\s*\))\s*\)"
)
#: Where the integer check may be written: ``is_integer`` itself, and the array namespace below it, whose scalar
#: conversion (``_scalar``) is a dispatch, not a check.
_INTEGER_HOMES = ("_math/_validation.py", "_math/_backend.py")


def integer_violations(sources) -> list:
    """Modules that write an integer check out instead of calling ``check_int`` / ``is_integer`` (which refuse
    booleans)."""
    return [
        f"{name}: {m.group(0)}"
        for name, text in sources.items()
        if name not in _INTEGER_HOMES
        for m in _INTEGER_CHECK.finditer(text)
    ]


def protocol_import_violations(sources) -> list:
    """Modules that import a built-in protocol module by name (the registry finds them by listing the wing:
    a new protocol is one file; a protocol that speaks through another asks the registry for it)."""
    found = []
    protocols = {n[len("_servers/") : -3] for n in sources if re.fullmatch(r"_servers/_\w+_protocol\.py", n)}
    protocols.discard("_protocol")
    for name, text in sources.items():
        for match in re.finditer(
            r"^\s*(?:from\s+[.\w]*\s+import\s+[^\n]*\b(_\w+_protocol)\b|from\s+[.\w]*\.(_\w+_protocol)\s+import)",
            text,
            flags=re.M,
        ):
            if (match.group(1) or match.group(2)) in protocols:
                found.append(f"{name} imports {match.group(1) or match.group(2)}")
    return found


def test_no_module_imports_a_protocol_by_name():
    from cactus_theory._servers._protocols import BUILTIN_PROTOCOL_MODULES

    assert not protocol_import_violations(_sources())
    assert {m.__name__.rsplit(".", 1)[1] for m in BUILTIN_PROTOCOL_MODULES} == {
        n[len("_servers/") : -3] for n in _sources() if re.fullmatch(r"_servers/_\w+_protocol\.py", n)
    } - {"_protocol"}


@pytest.mark.parametrize(
    "planted",
    [
        "from . import _llamacpp_protocol, _openai_protocol  # noqa: F401\n",
        "from ._sglang_protocol import SGLang  # noqa: F401\n",
        "from cactus_theory._servers._openai_protocol import OpenAICompletions  # noqa: F401\n",
    ],
)
def test_the_protocol_import_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_servers/_protocols.py"] += "\n" + planted
    assert any(v.startswith("_servers/_protocols.py") for v in protocol_import_violations(sources)), planted


def benchmark_violations(sources) -> list:
    """Modules outside the benchmarks' folder that decide by a benchmark's name (an if-chain, a list or a
    table of them): every such fact belongs to the benchmark's own module, read through the registry."""
    from cactus_theory._data._benchmarks import benchmark_names

    names = "|".join(re.escape(n) for n in benchmark_names(plugins=False))
    decided = re.compile(
        rf"""(?:==|!=|\bin)\s*\(?\s*["'](?:{names})["']|["'](?:{names})["']\s*(?:,\s*["'](?:{names})["']|:\s*\()"""
    )
    return [
        f"{name}: {m.group(0)}"
        for name, text in sources.items()
        if not name.startswith("_data/_benchmarks/")
        for m in decided.finditer(text)
    ]


def test_a_benchmark_is_known_to_its_module_alone():
    assert not benchmark_violations(_sources())


@pytest.mark.parametrize(
    "planted",
    [
        'if problem.benchmark == "gsm8k":\n    pass\n',
        'GRADED = ("gsm8k", "humaneval", "mbpp", "choice")\n',
        'if benchmark in ("humaneval", "mbpp"):\n    pass\n',
        'BENCHMARKS = {"gsm8k": ("gsm8k/test.jsonl", "source")}\n',
    ],
)
def test_the_benchmark_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_data/_graders.py"] += "\n" + planted
    assert any(v.startswith("_data/_graders.py") for v in benchmark_violations(sources)), planted


def test_the_integer_check_is_written_once():
    assert not integer_violations(_sources())
    assert "def check_int(" in (PACKAGE / "_math" / "_validation.py").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "planted",
    [
        "if not (isinstance(self.k, int) and self.k >= 1):\n    raise ValueError\n",
        "if isinstance(n, bool) or not isinstance(n, (int, np.integer)):\n    raise ValueError\n",
        "ok = isinstance(value.size, (np.integer, int))\n",
    ],
)
def test_the_integer_check_test_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_rules/topk.py"] += "\n" + planted
    assert any(v.startswith("_rules/topk.py") for v in integer_violations(sources)), planted


def test_the_command_line_builds_each_options_record_in_one_place():
    sources = _sources()
    common = sources["_cli/_common.py"]
    assert "def analysis_options(" in common and "def decoding_spec(" in common
    for name, text in sources.items():
        if name.startswith("_cli/") and name != "_cli/_common.py":
            for call, record in (("analyze_trace(", "options="), ("decode_prompts(", " spec,")):
                for match in re.finditer(re.escape(call), text):
                    body = text[match.end() : match.end() + 400].split("\n)\n")[0]
                    assert record in body, f"{name}: {call} without the settings record"


def test_the_formatter_decides_the_layout():
    skips = sum(
        p.read_text(encoding="utf-8").count("fmt: skip")
        for folder in ("cactus_theory", "tests", "experiments", "scripts")
        for p in (ROOT / folder).rglob("*.py")
    )
    assert skips < 30, f"{skips} '# fmt: skip' markers: let the formatter lay the code out"
    assert "ruff format --check" in (ROOT / "scripts" / "check.sh").read_text(encoding="utf-8")


# --- what the page says of the wings, each checked on the code and shown to fail on a planted violation --------

#: What ``_util`` may import beyond the standard library (the page's table says why each).
UTIL_IMPORTS = {"tqdm", "matplotlib", "pandas", "dask", "distributed"}


def util_import_violations(sources) -> list:
    """Imports of the ``_util`` wing beyond the standard library and ``UTIL_IMPORTS``."""
    import ast
    import sys

    found = []
    for name, text in sources.items():
        if not name.startswith("_util/"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in UTIL_IMPORTS and top != "__future__":
                    found.append(f"{name} imports {module}")
    return found


def test_the_util_wing_imports_what_the_page_says():
    assert not util_import_violations(_sources())
    row = next(line for line in PAGE.splitlines() if line.startswith("| `_util` |"))
    for module in ("the standard library", "tqdm", "matplotlib", "pandas", "distributed", "py-landlock"):
        assert module in row, module


@pytest.mark.parametrize("planted", ["import numpy as np\n", "from scipy import stats\n", "import torch\n"])
def test_the_util_import_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_util/_files.py"] += "\n" + planted
    assert any(v.startswith("_util/_files.py") for v in util_import_violations(sources)), planted


def test_a_protocol_module_imports_no_other_protocol_module_either():
    sources = _sources()
    sources["_servers/_openai_protocol.py"] += "\nfrom ._llamacpp_protocol import LlamaCppNative  # noqa: F401\n"
    assert any(v.startswith("_servers/_openai_protocol.py") for v in protocol_import_violations(sources))


#: Building a decoder: a call of one of the decoder classes.
_DECODER_BUILT = re.compile(r"(?<![\w.])(?:HostChain|HostBatch|OnDevice)\(")


def decoder_violations(sources) -> list:
    """Modules other than the chooser (``_models/_decoding.py``) that build a decoder."""
    return [
        f"{name}: {m.group(0)}"
        for name, text in sources.items()
        if name != "_models/_decoding.py"
        for m in _DECODER_BUILT.finditer(text.replace("class HostChain(", "").replace("class HostBatch(", ""))
        if not text[max(0, m.start() - 6) : m.start()].endswith("class ")
    ]


def test_the_decoder_is_chosen_in_the_chooser_alone():
    assert not decoder_violations(_sources())
    assert "chosen in `cactus_theory/_models/_decoding.py` alone" in PAGE


@pytest.mark.parametrize("planted", ["runner = HostChain(spec, model, draft)\n", "d = OnDevice(spec, model)\n"])
def test_the_decoder_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_studies/_quality.py"] += "\n" + planted
    assert any(v.startswith("_studies/_quality.py") for v in decoder_violations(sources)), planted


#: A long run's machinery: the record log and the interruption line, which the runner alone opens and writes.
_RUN_LOOP = re.compile(r"(?<![\w.])(?:open_records|RecordLog|resumable_run)\(")


def run_loop_violations(sources) -> list:
    """Modules other than the runner (``_util/_study.py``) and the record log's own that write a run loop."""
    return [
        f"{name}: {m.group(0)}"
        for name, text in sources.items()
        if name not in ("_util/_study.py", "_util/_records.py")
        for m in _RUN_LOOP.finditer(text)
    ]


def test_every_long_run_goes_through_the_one_runner():
    assert not run_loop_violations(_sources())


@pytest.mark.parametrize(
    "planted", ["log, held = open_records(out, KIND, setting)\n", "with resumable_run(out, kept) as run:\n    pass\n"]
)
def test_the_runner_check_fails_on_a_planted_violation(planted):
    sources = _sources()
    sources["_studies/_exact_choice.py"] += "\n" + planted
    assert any(v.startswith("_studies/_exact_choice.py") for v in run_loop_violations(sources)), planted


def missing_test_folders(folders) -> list:
    """The wings of the page's table without a test folder of their own among ``folders``."""
    return sorted({w.lstrip("_") for w in _table_wings()} - set(folders))


def test_every_wing_has_its_test_folder():
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert not missing_test_folders(folders)
    assert missing_test_folders(folders - {"checks"}) == ["checks"]  # planted: a wing's folder gone


#: A reference to a module of the package (and maybe a name in it) as docstrings write them: ``_wing._module.Name``.
_REFERENCE = re.compile(r"``(_[a-z]+\._[A-Za-z0-9_]+(?:\.[A-Za-z_][A-Za-z0-9_]*)*)``")


def dangling_references(sources) -> list:
    """References ``_wing._module[.Name]`` in the package's text that name no module or no name of it."""
    import importlib

    found = []
    for name, text in sources.items():
        for match in _REFERENCE.finditer(text):
            parts = match.group(1).split(".")
            for i in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module("cactus_theory." + ".".join(parts[:i]))
                    break
                except ImportError:
                    obj = None
            try:
                for part in parts[i:] if obj is not None else [None]:
                    obj = getattr(obj, part)
            except (AttributeError, TypeError):
                obj = None
            if obj is None:
                found.append(f"{name}: {match.group(1)}")
    return found


def test_every_module_a_docstring_names_exists():
    assert not dangling_references(_sources())


def test_the_reference_check_fails_on_a_planted_violation():
    sources = _sources()
    sources["_util/_options.py"] += '\n"""The records: ``_models._decode_prompts.DecodeOptions``."""\n'
    assert dangling_references(sources) == ["_util/_options.py: _models._decode_prompts.DecodeOptions"]


def test_the_public_map_each_family_in_its_module_each_name_documented_once():
    """The top level holds at most 60 public names (the families' modules among them); every name of a family's
    module is documented once in docs/api.md, in that family's section; every top-level name is documented at the
    top (the bonus γ and divergences) or is the very object of a family's (a shortcut, documented there)."""
    import importlib

    import cactus_theory

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    public = [n for n in dir(cactus_theory) if not n.startswith("_")]
    assert len(public) <= 60, len(public)
    headings = re.findall(r"^## (.+)$", api, flags=re.M)
    sections = dict(zip(headings, re.split(r"^## .+$", api, flags=re.M)[1:], strict=True))
    documented = re.findall(r"\.\. (?:auto\w+|py:\w+):: (cactus_theory\.[\w.]+)\s*$", api, flags=re.M)
    families = {}
    for face in cactus_theory._FACES:
        (heading,) = [h for h in headings if h.startswith(f"cactus_theory.{face}:")] or [None]
        families[face] = heading
    for face, heading in families.items():
        if heading is None:  # a module for scripts: documented in its own section, by name
            assert f"cactus_theory.{face}" in api, face
            continue
        module = importlib.import_module(f"cactus_theory.{face}")
        names = module._SHARED if face == "rules" else module.__all__
        here = re.findall(r"\.\. (?:auto\w+|py:\w+):: (cactus_theory\.[\w.]+)\s*$", sections[heading], flags=re.M)
        for name in names:
            full = f"cactus_theory.{face}.{name}"
            assert here.count(full) == 1 and documented.count(full) == 1, f"{full}: documented once, under {heading}"
    top = sections[headings[0]]
    faces = [importlib.import_module(f"cactus_theory.{f}") for f, h in families.items() if h is not None]
    for name in cactus_theory.__all__:
        value = getattr(cactus_theory, name)
        shortcut = [f.__name__ for f in faces if getattr(f, name, None) is value]
        at_top = re.search(rf"^\.\. (?:auto\w+|py:\w+):: cactus_theory\.{name}\s*$", top, flags=re.M)
        assert bool(shortcut) != bool(at_top), f"{name}: a family's shortcut ({shortcut}) or documented at the top"


def test_the_readme_and_the_front_page_tell_the_same_story():
    """Both lead with the decisions the toolkit makes, name the chains of commands, and show one Python entry."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for text in (readme, index):
        lead = text.split("\n## ", 2)[1].lower()
        for decision in ("which rule should i deploy", "emit its rule's law", "what does a rule buy"):
            assert decision in lead, decision
        for chain in ("dump → analyze", "calibrate → plan", "evaluate --exact → plan --quality"):
            assert chain in text, chain
