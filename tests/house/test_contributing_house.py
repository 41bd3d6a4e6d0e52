"""The house's page (docs/contributing_house.md) names what exists: every wing of the table is a
subpackage, every wing of the layers contract is in the table, every file and module it names is
there, and the test folders it lists mirror the wings."""

import re

from locations import ROOT

PAGE = (ROOT / "docs" / "contributing_house.md").read_text(encoding="utf-8")


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
            found = (here / f"{name}.py").is_file() or re.search(rf"^(def|class) {name}\b", sources, flags=re.M)
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
    long = {name: text.count("\n") for name, text in _sources().items() if text.count("\n") > 700}
    assert not long, f"modules over 700 lines: {long}"
    assert "over 700 lines" in PAGE


def test_a_rules_kind_is_read_in_the_protocol_alone():
    for name, text in _sources().items():
        if name == "_rules/_protocol.py":
            assert "def judgement_of(" in text and "def kind_of(" in text
            continue
        assert "kind_of(" not in text, f"{name} calls kind_of: ask judgement_of(rule) instead"
        compared = re.findall(r"""\.kind\s*(?:==|!=)\s*["'](?:token|block|multi-draft)["']""", text)
        assert not compared, f"{name} compares a rule's kind by name: {compared}"
        judged = re.findall(r"""\.judges\s*(?:==|!=)""", text)
        assert not judged, f"{name} reads Rule.judges: ask judgement_of(rule)"


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


def test_the_integer_check_is_written_once():
    pattern = re.compile(r"isinstance\((\w+), bool\) or not isinstance\(\1, (?:\(int, np\.integer\)|int)\)")
    for name, text in _sources().items():
        assert not pattern.search(text), f"{name} writes the integer check out: use check_int / is_integer"
    assert "def check_int(" in (PACKAGE / "_math" / "_validation.py").read_text(encoding="utf-8")


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
