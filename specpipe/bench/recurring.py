"""The recurring workload (shared/DESIGN.md section 4, "Learning from the fleet"; docs/load.md):
deployments are full of recurring text (agents' tool calls, one repository's code, templates,
retries), so the requests are drawn from a base prompt set with repetition and near-repetition.
About 30% repeat an earlier request exactly; 40% take an earlier request's template with other
values (a question with other numbers and names, a Python function with another name and other
parameter names), so the expected answer changes too; 30% are prompts not seen before. A pure
function of the base prompts and a seed: no model, no file."""

from __future__ import annotations

import builtins
import keyword
import random
import re
from collections.abc import Sequence

from specpipe.bench.prompts import RECURRING, Messages, Prompt
from specpipe.core.errors import InvalidArgument

KINDS = ("repeat", "template", "unique")
SHARES = (0.3, 0.4, 0.3)  # of KINDS, in order
TEMPLATE_TRIES = 8        # draws of other values before a variant equal to an earlier request is kept

FUNCTION = re.compile(r"^def (\w+)\(([^)]*)\)", re.MULTILINE)
PARAMETER = re.compile(r"(?:^|,)\s*\*{0,2}(\w+)\s*(?=[:=,]|$)")  # a name at the top level of a parameter list
NUMBER = re.compile(r"\b[1-9]\d*\b")
# A name that is a plain word (intersection, string) is also a word of the prose: renamed only where
# it is code, a function where it is called, a parameter in the parameter list.
CODE_ONLY = {"function": r"(?=\()", "parameter": r"(?=\s*[:,)=])"}
RESERVED = frozenset(dir(builtins)) | frozenset(keyword.kwlist) | {"List", "Dict", "Tuple", "Optional", "Any", "Union"}
VERBS = ("find", "count", "check", "collect", "compute", "merge", "select", "rank", "filter", "group", "pick", "scan")
NOUNS = ("items", "values", "entries", "records", "tokens", "pairs", "digits", "words", "cells", "chunks", "spans")
PARAMETERS = ("data", "items", "values", "seq", "elements", "entries", "payload", "source", "target", "limit",
              "bound", "key", "word", "text", "count", "size", "total", "step", "first", "second", "other")
FIRST_NAMES = (  # one list per grammatical gender, so that a name's pronouns still fit
    ("Melanie", "Emma", "Olivia", "Sophia", "Mia", "Janet", "Carla", "Julie", "Maria", "Anna", "Sarah", "Lisa",
     "Nancy", "Grace", "Lucy", "Rachel", "Alice", "Betty", "Wendy", "Nora"),
    ("Tom", "James", "John", "Mark", "Paul", "Jack", "Henry", "Sam", "Peter", "David", "Tony", "Carl", "Brian",
     "Kevin", "Eric", "Frank", "George", "Luke", "Adam", "Ben"),
)


def kind_counts(count: int, shares: Sequence[float] = SHARES) -> dict[str, int]:
    """Requests of each kind among count: the shares, rounded by largest remainder (ties to the
    earlier kind), with at least one unique request (the first has nothing earlier to recur)."""
    exact = [count * share / sum(shares) for share in shares]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(KINDS)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[:count - sum(counts)]:
        counts[i] += 1
    if count and not counts[-1]:
        counts[max(range(len(KINDS) - 1), key=lambda i: counts[i])] -= 1
        counts[-1] = 1
    return dict(zip(KINDS, counts))


def recurring_requests(base: Sequence[Prompt], count: int, seed: int = 0,
                       shares: Sequence[float] = SHARES) -> list[Prompt]:
    """count requests from base, in order: the kinds in kind_counts' numbers in a seeded order, the
    first unique. A repeat copies a uniformly drawn earlier request; a template varies the base
    prompt of a uniformly drawn earlier request that has values to vary (vary), and is a unique
    prompt where none has; a unique prompt is the next of base in a seeded order. Each request's
    category is its kind, its id `recurring/<number>/<kind>/<base prompt id>`."""
    if count < 1:
        raise InvalidArgument(f"the recurring workload needs at least 1 request, got {count}")
    rng = random.Random(seed)
    counts = kind_counts(count, shares)
    later = [kind for kind, n in counts.items() for _ in range(n - (kind == "unique"))]
    rng.shuffle(later)
    fresh = list(base)
    rng.shuffle(fresh)
    fresh.reverse()  # popped from the end: the seeded order
    requests: list[Prompt] = []
    sources: list[Prompt] = []  # [len(requests)] the base prompt each request was made from
    templates: list[int] = []   # the requests whose base prompt has values to vary
    for kind in ["unique", *later]:
        messages = None
        if kind == "repeat":
            j = rng.randrange(len(requests))
            source, messages = sources[j], requests[j].messages
        elif kind == "template" and templates:
            source = sources[rng.choice(templates)]
            messages = other_values(source.messages, {r.messages for r in requests}, rng)
        if messages is None:
            if not fresh:
                raise InvalidArgument(f"the recurring workload of {count} requests needs more than the "
                                      f"{len(base)} prompts of its base set")
            kind, source = "unique", fresh.pop()
            messages = source.messages
        if variable_values(source.messages):
            templates.append(len(requests))
        requests.append(Prompt(id=f"{RECURRING}/{len(requests)}/{kind}/{source.id}", messages=messages, category=kind))
        sources.append(source)
    return requests


def other_values(messages: Messages, seen: set[Messages], rng: random.Random) -> Messages:
    """A variant of messages (vary) that no request in seen has, if one comes within TEMPLATE_TRIES draws."""
    for _ in range(TEMPLATE_TRIES):
        varied = vary(messages, rng)
        if varied not in seen:
            break
    return varied


def variable_values(messages: Messages) -> tuple[tuple[str, str], ...]:
    """(value, its kind) that a template may change: in a Python function (the last `def`: the one
    to complete), its name ("function") and its parameters of three or more letters ("parameter":
    shorter ones also stand for words in the prose); elsewhere the numbers ("number", without
    leading zeros) and the first names of FIRST_NAMES ("name")."""
    text = "\n".join(content for _, content in messages)
    functions = FUNCTION.findall(text)
    if functions:
        name, parameters = functions[-1]
        names = [p for p in PARAMETER.findall(parameters) if len(p) >= 3 and p not in RESERVED and p != name]
        return ((name, "function"), *((p, "parameter") for p in dict.fromkeys(names)))
    words = set(re.findall(r"\b\w+\b", text))
    first_names = tuple((w, "name") for group in FIRST_NAMES for w in group if w in words)
    return tuple((n, "number") for n in dict.fromkeys(NUMBER.findall(text))) + first_names


def vary(messages: Messages, rng: random.Random) -> Messages:
    """messages with each of its variable_values replaced, consistently (a value becomes the same
    other value wherever it occurs; a plain word only where CODE_ONLY says), by another of its kind
    that the text does not hold yet: a
    function and a parameter name from VERBS, NOUNS and PARAMETERS, a number of its size, a first
    name of its list. Unchanged where there is nothing to vary."""
    text = "\n".join(content for _, content in messages)
    taken = set(re.findall(r"\b\w+\b", text))
    renames: dict[str, str] = {}
    where = []  # each value's pattern
    for value, kind in variable_values(messages):
        renames[value] = other_value(value, kind, taken, rng)
        taken.add(renames[value])
        where.append(re.escape(value) + (CODE_ONLY.get(kind, "") if value.isalpha() else ""))
    if not renames:
        return messages
    pattern = re.compile(r"\b(?:" + "|".join(sorted(where, key=len, reverse=True)) + r")\b")
    return tuple((role, pattern.sub(lambda m: renames[m.group(0)], content)) for role, content in messages)


def other_value(value: str, kind: str, taken: set[str], rng: random.Random) -> str:
    """Another value of kind, not in taken (the value itself where none is left)."""
    if kind == "number":  # a small count stays small; a larger one keeps its order of magnitude
        n = int(value)
        low, high = (2, 12) if n <= 10 else (max(11, n // 2), n * 2)
        drawn = (str(rng.randint(low, high)) for _ in range(TEMPLATE_TRIES * 4))
        return next((v for v in drawn if v not in taken), value)
    if kind == "function":
        choices = [f"{verb}_{noun}" for verb in VERBS for noun in NOUNS if f"{verb}_{noun}" not in taken]
    elif kind == "parameter":
        choices = [p for p in PARAMETERS if p not in taken]
    else:  # a first name, of the same list
        choices = [n for n in next(g for g in FIRST_NAMES if value in g) if n not in taken]
    return rng.choice(choices) if choices else value
