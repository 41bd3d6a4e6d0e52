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


def test_a_records_own_id_names_it_so_reordering_the_file_keeps_ids_and_seeds(tmp_path):
    from cactus_theory._data._prompts import prompt_seed

    records = [{"id": "q7", "prompt": "a"}, {"id": 12, "prompt": "b"}, {"prompt": "c"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [p.id for p in load_prompts(path)] == ["mine-q7", "mine-12", "mine-2"]
    shuffled = tmp_path / "shuffled" / "mine.jsonl"
    shuffled.parent.mkdir()
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in (records[1], records[0])))
    first = {p.text: (p.id, prompt_seed(0, p.id)) for p in load_prompts(path)}
    again = {p.text: (p.id, prompt_seed(0, p.id)) for p in load_prompts(shuffled)}
    assert again["a"] == first["a"] and again["b"] == first["b"]
    assert [p.id for p in load_prompts(path, id_field=None)] == ["mine-0", "mine-1", "mine-2"]
    assert [p.id for p in load_prompts(path, id_field="key")] == ["mine-0", "mine-1", "mine-2"]
    (tmp_path / "a.csv").write_text("name,question\nx1,What?\nx2,Why?\n")
    assert [p.id for p in load_prompts(tmp_path / "a.csv", id_field="name")] == ["a-x1", "a-x2"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n', r"two records have the id 'a'.*--id-field none"),
        ('{"id": "a/b", "prompt": "x"}\n', r"line 1: the id 'a/b' is not a label"),
        ('{"id": "", "prompt": "x"}\n', r"line 1: the id field 'id' must be a non-empty"),
        ('{"id": [1], "prompt": "x"}\n', r"line 1: the id field 'id' must be a non-empty"),
    ],
)
def test_bad_record_ids_say_what_to_fix(tmp_path, content, match):
    (tmp_path / "x.jsonl").write_text(content)
    with pytest.raises(ValueError, match=match):
        load_prompts(tmp_path / "x.jsonl")
