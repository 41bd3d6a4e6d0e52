"""The README is a front page: under 900 words, two sentences before its first section, the three decisions the
toolkit makes with one Python entry, the two commands
(the test command the one CI runs), a table of the commands, and links that lead to pages that exist."""

import re

from locations import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page():
    assert len(README.split()) < 900
    lead = README.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    assert len(re.findall(r"[.!?](?:\s|$)", lead)) == 2, lead
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings == ["The decisions it makes", "Two commands (fresh machine)", "The commands", "Read next"]
    decisions = README.split("## The decisions it makes", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^- ", decisions, flags=re.M)) == 3


def test_the_two_commands_are_the_ones_that_run():
    blocks = re.findall(r"```bash\n(.+?)\n```", README, flags=re.S)
    assert blocks[0].startswith("python3 -m venv .venv && .venv/bin/pip install -e")
    assert "cactus-theory report --out" in blocks[0]
    assert blocks[1] == "bash scripts/check.sh"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert [line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd "))] == [blocks[1]]


def test_every_command_of_the_cli_is_in_the_table_and_every_link_leads_somewhere():
    from cactus_theory._cli._main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    table = README.split("## The commands", 1)[1].split("\n## ", 1)[0]
    for command in sub.choices:
        assert f"cactus-theory {command}" in table or f"`{command}`" in table or f"/ `{command}" in table, command
    for target in re.findall(r"\]\(([^)]+)\)", README):
        assert (ROOT / target).is_file(), target


def test_the_two_referees_are_named_apart():
    """ "Referee" alone names two things: the planner's (llama-server) and the quality referee."""
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    for page in pages:
        if (
            "_build" in page.parts
            or "_generated" in page.parts
            or (page.parent.name == "results" and "-" not in page.name)
        ):
            continue  # the experiments' generated pages name their own referee in their title
        for line in page.read_text(encoding="utf-8").splitlines():
            for match in re.finditer(r"\breferee\b", line, flags=re.I):
                before = line[: match.start()].lower()
                in_a_name = before.endswith("-") or line[match.end() : match.end() + 1] in ("-", "_")
                assert in_a_name or before.endswith(("quality ", "planner's ", "planner’s ")), (
                    f"{page.relative_to(ROOT)}: 'referee' without saying which: {line.strip()[:120]}"
                )
