"""Prompts from any file: JSON Lines, JSON, CSV / TSV and plain text, with a field and a task label."""

import gzip
import json
import os
import threading

import pytest

from cactus_theory.traces import load_prompts


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


def test_prompt_files_with_bad_bytes_name_the_file_and_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("first\nsecond caf\xe9 line\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"p.txt, line 2, column 11: byte 0xe9 is not UTF-8"):
        load_prompts(path)


def test_a_truncated_gzip_prompt_file_says_so(tmp_path):
    data = gzip.compress(b'{"prompt": "a"}\n' * 50)
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"p\.jsonl\.gz: the gzip file is truncated"):
        load_prompts(path)


def test_a_byte_order_mark_is_not_part_of_a_header_or_a_prompt(tmp_path):
    csv_path = tmp_path / "p.csv"
    csv_path.write_bytes("\ufeffprompt,other\nhello,1\n".encode())
    assert [p.text for p in load_prompts(csv_path)] == ["hello"]
    txt_path = tmp_path / "q.txt"
    txt_path.write_bytes("\ufeffhello\r\nworld\r\n".encode())
    assert [p.text for p in load_prompts(txt_path)] == ["hello", "world"]


def test_pipes_are_read_and_directories_named(tmp_path):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("one\ntwo\n"))
    writer.start()
    assert [p.text for p in load_prompts(fifo)] == ["one", "two"]
    writer.join()
    with pytest.raises(ValueError, match="is a directory"):
        load_prompts(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        load_prompts(tmp_path / "missing.txt")


def test_a_lone_surrogate_is_refused_where_it_is_read(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": "bad \\ud800 text"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl, line 2: .*unpaired surrogate"):
        load_prompts(path)


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"turns": [1]}, "'turns' must be a list of strings"),
        ({"turns": "hello world"}, "'turns' must be a list of strings"),
        ({"turns": []}, "'turns' must be a list of strings"),
        ([1, 2], "a mt_bench record is a JSON object"),
    ],
)
def test_benchmark_records_of_the_wrong_type_are_refused_naming_the_line(tmp_path, record, match):
    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps({"turns": ["fine"]}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=f"line 2: not a mt_bench record .*{match}"):
        load_prompts(path, dataset="mt_bench")


def test_an_mbpp_line_that_is_an_array_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "mbpp.jsonl"
    path.write_text(json.dumps({"text": "add", "test_list": ["assert f()"]}) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"mbpp.jsonl, line 2: not a mbpp record"):
        load_prompts(path, dataset="mbpp")


def test_a_records_own_task_field_labels_it(tmp_path, mixed_prompt_file):
    path = mixed_prompt_file
    prompts = load_prompts(path)
    assert [(p.id, p.task) for p in prompts] == [
        ("math-0", "math"),
        ("chat-1", "chat"),
        ("math-2", "math"),
        ("mine-3", "mine"),
    ]
    assert {p.task for p in load_prompts(path, task="all-mine")} == {"all-mine"}  # --task overrides
    assert {p.task for p in load_prompts(path, task_field=None)} == {"mine"}
    csv = tmp_path / "mine.csv"
    csv.write_text("text,kind\nhello,chat\nsum,math\n")
    assert [p.task for p in load_prompts(csv, task_field="kind")] == ["chat", "math"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "task": "a/b"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 1: the task 'a/b' is not a label"):
        load_prompts(bad)
    bad.write_text(json.dumps({"prompt": "x", "task": ""}) + "\n")
    with pytest.raises(ValueError, match="must be a non-empty string"):
        load_prompts(bad)
