"""Prompt suites from their packages (installed privately on first use) and user prompt files."""

from __future__ import annotations

import json

import pytest

from specpipe.bench.prompts import Prompt, load_prompts_file, load_suite
from specpipe.core.errors import InvalidArgument


@pytest.mark.parametrize("suite, size, first_id", [
    ("humaneval", 164, "HumanEval/0"),
    ("mtbench", 80, "mtbench/81"),
    ("gsm8k", 100, "gsm8k-test-0013"),
    ("random", 100, "random/0"),
    ("noise", 100, "noise/0"),
])
def test_suites_load_with_and_without_limit(suite, size, first_id):
    prompts = load_suite(suite)
    assert len(prompts) == size
    assert len({p.id for p in prompts}) == size
    assert prompts[0].id == first_id
    assert all(p.messages and p.messages[0][0] == "user" and p.messages[0][1].strip() for p in prompts)
    assert load_suite(suite, limit=3) == prompts[:3]


def test_humaneval_asks_to_complete_the_function():
    (role, content), = load_suite("humaneval", limit=1)[0].messages
    assert role == "user"
    assert content.startswith("Complete the following Python function:\n```python\n")
    assert "def has_close_elements(" in content and content.endswith("```")


def test_mtbench_keeps_the_first_turn_and_category():
    prompts = load_suite("mtbench")
    assert {p.category for p in prompts} == {"writing", "roleplay", "reasoning", "math", "coding",
                                             "extraction", "stem", "humanities"}
    assert all(len(p.messages) == 1 for p in prompts)
    assert prompts[0].messages[0][1].startswith("Compose an engaging travel blog post")


def test_mtbench_takes_its_categories_in_turn_and_has_second_turns():
    from specpipe.bench.prompts import second_turn

    prompts = load_suite("mtbench", limit=16)
    assert [p.category for p in prompts[:8]] == ["writing", "roleplay", "reasoning", "math", "coding", "extraction",
                                                 "stem", "humanities"]
    assert [p.category for p in prompts[8:]] == [p.category for p in prompts[:8]]
    follow = second_turn(prompts[0], "Aloha!")
    assert follow.id == "mtbench/81/turn2" and follow.category == "writing"
    assert follow.messages == (*prompts[0].messages, ("assistant", "Aloha!"), ("user", prompts[0].followup))
    assert follow.messages[-1][1].startswith("Rewrite your previous response")
    with pytest.raises(InvalidArgument, match="has no second turn"):
        second_turn(follow, "x")


def test_random_suite_is_fixed_and_made_up():
    first, second = load_suite("random", limit=2)
    assert load_suite("random", limit=2) == [first, second] and first != second  # the same prompts every run
    words = first.messages[0][1].split(": ", 1)[1].split("\n")[0].split()
    assert len(words) == 30 and all(w.isalpha() and w.islower() for w in words)


def test_noise_suite_is_fixed_and_takes_its_kinds_in_turn():
    prompts = load_suite("noise", limit=6)
    assert load_suite("noise", limit=6) == prompts
    texts = [p.messages[0][1] for p in prompts]
    assert [t.split()[0] for t in texts] == ["Here", "Continue", "Write"] * 2
    assert texts[0] != texts[3] and texts[1] != texts[4]  # new random strings for each prompt
    base64 = texts[0].split("\n")[1]
    assert len(base64) == 200 and set(base64) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    assert len(texts[2].split(": ", 1)[1].split()) == 60


@pytest.mark.parametrize("name, limit", [("squad", None), ("gsm8k", 0), ("random", 0), ("noise", 0)])
def test_bad_suite_arguments(name, limit):
    with pytest.raises(InvalidArgument):
        load_suite(name, limit=limit)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prompts_file_accepts_both_shapes(tmp_path):
    path = write_lines(tmp_path / "mine.jsonl", [
        json.dumps({"id": "q1", "prompt": "Hello"}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
    ])
    assert load_prompts_file(path) == [
        Prompt("q1", (("user", "Hello"),)),
        Prompt("mine/3", (("system", "Be brief."), ("user", "Hi"))),
    ]
    assert load_prompts_file(path, limit=1) == [Prompt("q1", (("user", "Hello"),))]


@pytest.mark.parametrize("bad_line, message", [
    ('{"prompt": "unterminated', "not valid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"id": "x"}', 'needs a string "prompt"'),
    ('{"prompt": 3}', 'needs a string "prompt"'),
    ('{"messages": []}', "non-empty list"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "role"),
])
def test_malformed_line_names_its_line_number(tmp_path, bad_line, message):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok"}), "", bad_line])
    with pytest.raises(InvalidArgument, match=message) as err:
        load_prompts_file(path)
    assert f"{path}:3:" in str(err.value)


def test_missing_or_empty_prompt_file(tmp_path):
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_prompts_file(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidArgument, match="no prompts"):
        load_prompts_file(write_lines(tmp_path / "empty.jsonl", [""]))
