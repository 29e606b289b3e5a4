"""A model drafter kept warm while its session drafts nothing (orchestrator.schedules.Warmer): a
proposal of draft_len 0 feeds the context and drafts nothing, so the next draft feeds only what
came after it; a generation at k = 0 sends one for its prompt and then every WARM_LAG tokens, under
both schedules, and its output stays the verifier's greedy output."""

from __future__ import annotations

import threading

import pytest

from orchestrator.generator import Generator
from orchestrator.schedules import WARM_LAG
from specpipe.core.types import GREEDY, GenerationRequest, ProposeRequest, SpeculationOptions
from specpipe.runtime import metrics
from tests.golden import GOLDEN_PROMPTS, reference_greedy, run

NEW_TOKENS = 2 * WARM_LAG + 16


def fed_tokens() -> float:
    """Tokens the (batched) drafters have fed so far, from the drafter's batch histogram."""
    samples = {s.name: s.value for s in metrics.DRAFT_BATCH_TOKENS.collect()[0].samples}
    return samples["specpipe_draft_batch_tokens_sum"]


def test_a_warm_up_feeds_the_context_and_the_next_draft_only_the_new_tokens(tiny_drafter):
    context = tuple(range(40, 140))
    before = fed_tokens()
    warm = tiny_drafter.propose(ProposeRequest("warm", context, 0, 1, GREEDY))
    assert len(warm.draft) == 0 and fed_tokens() - before == len(context)

    before = fed_tokens()
    draft = tiny_drafter.propose(ProposeRequest("warm", context + (7, 8), 3, 1, GREEDY)).draft
    assert fed_tokens() - before == 2 + 2  # the two new tokens, then one per draft depth after the first
    cold = tiny_drafter.propose(ProposeRequest("cold", context + (7, 8), 3, 1, GREEDY)).draft
    # the same draft; its confidences may differ in the last bits (the context was fed in other pieces)
    assert draft.tokens == cold.tokens and draft.confidence == pytest.approx(cold.confidence, rel=1e-5)
    assert tiny_drafter.release("warm") and tiny_drafter.release("cold")


class Recording:
    """The real drafter, with every proposal's (context length, draft_len) and the release recorded."""

    def __init__(self, drafter):
        self._drafter = drafter
        self.calls: list[tuple[int, int]] = []
        self.released_after: list[int] = []  # calls finished when release came
        self._done = 0
        self._lock = threading.Lock()

    def info(self):
        return self._drafter.info()

    def propose(self, request):
        try:
            return self._drafter.propose(request)
        finally:
            with self._lock:
                self.calls.append((len(request.context), request.draft_len))
                self._done += 1

    def reset(self) -> None:
        self.calls.clear()
        self._done = 0

    def release(self, session_id):
        self.released_after.append(self._done)
        return self._drafter.release(session_id)


@pytest.mark.parametrize("schedule", ["sequential", "branch"])
def test_a_session_that_drafts_nothing_keeps_its_drafter_warm(tiny_tokenizer, tiny_verifier, tiny_drafter, schedule):
    drafter = Recording(tiny_drafter)
    generator = Generator(tiny_tokenizer, tiny_verifier, {"model": drafter})
    speculation = SpeculationOptions(drafter="model", draft_len=0, adaptive="off", schedule=schedule)  # k = 0
    for prompt in GOLDEN_PROMPTS[:2]:
        ids = tuple(tiny_tokenizer(prompt)["input_ids"])
        drafter.reset()
        tokens, _ = run(generator, GenerationRequest(ids, NEW_TOKENS, speculation=speculation))
        assert tokens == reference_greedy(tiny_verifier.model, ids, NEW_TOKENS)
        expected = [(n, 0) for n in range(len(ids), len(ids) + len(tokens), WARM_LAG)]
        assert sorted(drafter.calls) == expected  # the prompt, then every WARM_LAG tokens
        assert drafter.released_after[-1] == len(expected)  # released after the last warm-up ended


def test_a_drafter_without_a_cache_is_not_warmed(tiny_tokenizer, tiny_verifier):
    from drafter_service.ngram_drafter import NgramDrafter

    drafter = Recording(NgramDrafter(None, tiny_verifier.info()))
    generator = Generator(tiny_tokenizer, tiny_verifier, {"ngram": drafter})
    ids = tuple(tiny_tokenizer(GOLDEN_PROMPTS[0])["input_ids"])
    run(generator, GenerationRequest(ids, NEW_TOKENS, speculation=SpeculationOptions(
        drafter="ngram", draft_len=0, adaptive="off")))
    assert drafter.calls == []


class Ordered:
    """Wraps a verifier or drafter: appends (name, call) to a shared log as each prefill ends and each
    proposal starts."""

    def __init__(self, inner, name: str, log: list):
        self._inner, self._name, self._log = inner, name, log

    def __getattr__(self, attr):
        return getattr(self._inner, attr)

    def prefill(self, *args, **kwargs):
        result = self._inner.prefill(*args, **kwargs)
        self._log.append((self._name, "prefilled"))
        return result

    def propose(self, request):
        self._log.append((self._name, f"propose {request.draft_len}"))
        return self._inner.propose(request)


@pytest.mark.parametrize("schedule", ["sequential", "branch"])
def test_a_first_round_that_drafts_nothing_warms_the_drafter_after_the_prefill(
        tiny_tokenizer, tiny_verifier, tiny_drafter, schedule):
    """On shared cores a warm-up beside the prefill would delay the first token; it waits for it."""
    log: list = []
    generator = Generator(tiny_tokenizer, Ordered(tiny_verifier, "verifier", log),
                          {"model": Ordered(tiny_drafter, "drafter", log)})
    ids = tuple(tiny_tokenizer(GOLDEN_PROMPTS[0])["input_ids"])
    speculation = SpeculationOptions(drafter="model", draft_len=0, adaptive="off", schedule=schedule)
    tokens, _ = run(generator, GenerationRequest(ids, 8, speculation=speculation))
    assert tokens == reference_greedy(tiny_verifier.model, ids, 8)
    assert log[:2] == [("verifier", "prefilled"), ("drafter", "propose 0")]
