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
