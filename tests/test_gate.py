"""The speculation gate (orchestrator/gate.py): from what the orchestrator's generations emit, it runs
plain rounds where they give more tokens a second than drafting, keeps drafting where drafting gives
more (trying the other arm ever more rarely), leaves one generation alone, does not compare windows
at different loads, and a gated generation's output is still the verifier's own."""

import pytest

from cache_service.memory import InMemoryNgramCache
from orchestrator.gate import EXPLORE_SHARE, MAX_HOLD, Reading, SpeculationGate, other_wins
from orchestrator.generator import Generator
from specpipe.core.types import GenerationRequest, SpeculationOptions
from tests.golden import GOLDEN_PROMPTS, run
from tests.test_golden_ngram import MAX_NEW_TOKENS, generator_with, references  # noqa: F401  (fixture)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(gate: SpeculationGate, clock: Clock, seconds: float, on_rate: float, off_rate: float,
          load: int = 8) -> list[bool]:
    """Rounds of load generations, 10 ms apart, each emitting what its arm gives: the arm of every round."""
    arms = []
    for _ in range(int(seconds / 0.01)):
        drafting = gate.drafting(load)
        arms.append(drafting)
        clock.now += 0.01
        gate.record(round((on_rate if drafting else off_rate) * 0.01), load)
    return arms


def test_plain_rounds_take_over_where_they_give_more():
    clock = Clock()
    gate = SpeculationGate("ngram", clock)
    arms = drive(gate, clock, 30.0, on_rate=700, off_rate=1000)
    assert not gate.kept
    assert sum(arms[300:600]) < 0.2 * 300  # plain from about the third second
    assert 0 < sum(arms[len(arms) // 2:]) < 0.1 * len(arms) / 2  # drafting now and then, to look again


def test_drafting_stays_where_it_gives_more_and_is_questioned_ever_more_rarely():
    clock = Clock()
    gate = SpeculationGate("ngram", clock)
    arms = drive(gate, clock, 120.0, on_rate=1400, off_rate=1000)
    assert gate.kept
    plain = [i for i in range(1, len(arms)) if not arms[i] and arms[i - 1]]  # the explored windows' starts
    gaps = [b - a for a, b in zip(plain, plain[1:])]
    assert gaps[0] < gaps[-1] and gaps[-1] >= MAX_HOLD * 50  # a window: 0.5 s of 10 ms rounds
    assert arms.count(False) / len(arms) * (1 - 1000 / 1400) <= EXPLORE_SHARE  # what the plain windows cost


def test_one_generation_alone_is_never_gated():
    clock = Clock()
    gate = SpeculationGate("ngram", clock)
    assert all(drive(gate, clock, 10.0, on_rate=100, off_rate=1000, load=1))
    assert gate.kept


def test_windows_at_another_load_are_no_comparison():
    explored = Reading(2000.0, 16)
    assert other_wins(explored, Reading(1000.0, 16), Reading(1000.0, 16)) is True
    assert other_wins(explored, Reading(1000.0, 4), Reading(1000.0, 16)) is None
    assert other_wins(explored, None, Reading(1000.0, 16)) is None
    assert other_wins(Reading(1020.0, 16), Reading(1000.0, 16), Reading(1000.0, 16)) is False  # within the margin


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_a_gated_generation_drafts_nothing_and_emits_the_verifiers_tokens(tiny_tokenizer, tiny_verifier,
                                                                          tiny_drafter, references, drafter):
    spec = SpeculationOptions(drafter=drafter, adaptive="on", draft_len=4)
    drafted = {}
    for drafting in (True, False):
        generator: Generator = generator_with(InMemoryNgramCache(), tiny_tokenizer, tiny_verifier, tiny_drafter)
        generator._gates[drafter] = SpeculationGate(drafter, window_s=3600.0, drafting=drafting)
        drafted[drafting] = 0
        with generator._load:  # another generation running: the gate decides
            for prompt in GOLDEN_PROMPTS:
                prompt_ids, reference = references[prompt]
                tokens, chunks = run(generator, GenerationRequest(prompt_ids, MAX_NEW_TOKENS, speculation=spec))
                assert tokens == reference
                drafted[drafting] += sum(chunk.round.drafted for chunk in chunks)
    assert drafted[True] > 0 and drafted[False] == 0
