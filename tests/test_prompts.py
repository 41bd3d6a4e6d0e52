"""Prompts from any file: JSON Lines, JSON, CSV / TSV and plain text, with a field and a task label."""

import gzip
import json

import pytest

from cactus_theory import load_prompts


def test_json_lines_with_each_default_field(tmp_path):
    path = tmp_path / "my_prompts.jsonl"
    records = [{"prompt": "a"}, {"text": "b"}, {"question": "c"}, {"turns": ["d", "e"]}, "f"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["a", "b", "c", "d", "f"]
    assert [p.id for p in prompts] == [f"my_prompts-{i}" for i in range(5)]
    assert {p.task for p in prompts} == {"my_prompts"}
    assert [p.text for p in load_prompts(path, limit=2, start=1)] == ["b", "c"]
    assert load_prompts(path, task="instructions")[0].id == "instructions-0"


def test_a_named_field_and_gzip(tmp_path):
    path = tmp_path / "science.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps({"stem": "Which gas?", "prompt": "ignored"}) + "\n")
    (prompt,) = load_prompts(path, field="stem")
    assert prompt.text == "Which gas?" and prompt.task == "science"


def test_csv_tsv_json_and_text(tmp_path):
    (tmp_path / "a.csv").write_text('id,question\n1,"What is 2, plus 2?"\n2,Why?\n')
    assert [p.text for p in load_prompts(tmp_path / "a.csv")] == ["What is 2, plus 2?", "Why?"]
    (tmp_path / "b.tsv").write_text("instruction\tx\nDo it\t1\n")
    assert load_prompts(tmp_path / "b.tsv", field="instruction")[0].text == "Do it"
    (tmp_path / "c.json").write_text(json.dumps([{"text": "one"}, "two"]))
    assert [p.text for p in load_prompts(tmp_path / "c.json")] == ["one", "two"]
    (tmp_path / "d.txt").write_text("first line\n\nsecond line\n")
    assert [p.text for p in load_prompts(tmp_path / "d.txt")] == ["first line", "second line"]


@pytest.mark.parametrize(
    ("name", "content", "kwargs", "match"),
    [
        ("x.jsonl", '{"turns": ["a"]}\n{"body": "b"}\n', {}, r"x.jsonl, line 2: no any of the fields prompt, text"),
        ("x.jsonl", '{"prompt": "a"}\n', {"field": "stem"}, r"no field 'stem'.*pass --field NAME"),
        ("x.jsonl", '{"prompt": "a"\n', {}, r"line 1: not valid JSON"),
        ("x.jsonl", '{"prompt": ""}\n', {}, r"the prompt text is empty"),
        ("x.csv", "a,b\n1,2\n", {}, r"x.csv, row 2: no any of the fields"),
        ("x.json", '{"prompt": "a"}', {}, r"must hold a list"),
        ("x.txt", "a\n", {"field": "prompt"}, r"plain text file has one prompt per line"),
        ("x.jsonl", '{"prompt": "a"}\n', {"dataset": "gsm9k"}, r"dataset must be one of"),
        ("x.jsonl", '{"prompt": "a"}\n', {"limit": -1}, r"limit must be an integer >= 0"),
    ],
)
def test_bad_files_say_what_to_fix(tmp_path, name, content, kwargs, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match):
        load_prompts(tmp_path / name, **kwargs)
