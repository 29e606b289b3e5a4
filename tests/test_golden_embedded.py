"""Golden tests, embedded: speculative greedy output == verifier-only greedy generate() (tiny preset)."""

import pytest

from specpipe.core.types import GenerationRequest, SamplingParams, SpeculationOptions
from tests.golden import GOLDEN_PROMPTS, assert_golden, reference_greedy, run

MAX_NEW_TOKENS = 48
MODEL = SpeculationOptions(drafter="model")  # the drafter of the tiny generators here
SHAPES = {
    "verifier only": SpeculationOptions(drafter="none"),
    "chain k=1": SpeculationOptions(drafter="model", draft_len=1, adaptive="off"),
    "chain k=4": SpeculationOptions(drafter="model", draft_len=4, adaptive="off"),
    "chain k=7": SpeculationOptions(drafter="model", draft_len=7, adaptive="off"),
    "tree k=4 width=3": SpeculationOptions(drafter="model", draft_len=4, width=3, adaptive="off"),
}


@pytest.fixture(scope="module")
def references(tiny_generator, tiny_verifier):
    out = {}
    for prompt in GOLDEN_PROMPTS:
        ids = tiny_generator.encode(prompt=prompt)
        out[prompt] = (ids, reference_greedy(tiny_verifier.model, ids, MAX_NEW_TOKENS))
    return out


@pytest.mark.parametrize("speculation", SHAPES.values(), ids=SHAPES.keys())
def test_speculative_greedy_equals_verifier_greedy(tiny_generator, references, speculation):
    drafted, accepted = assert_golden(tiny_generator, references, MAX_NEW_TOKENS, speculation)
    if speculation.drafter != "none":  # the test must exercise both accepted and rejected drafts
        assert 0 < accepted < drafted


def test_text_stream_equals_decoded_tokens(tiny_generator, tiny_tokenizer, references):
    ids, expected = references[GOLDEN_PROMPTS[0]]
    tokens, chunks = run(tiny_generator, GenerationRequest(ids, MAX_NEW_TOKENS, speculation=MODEL))
    assert "".join(c.text for c in chunks) == tiny_tokenizer.decode(tokens, skip_special_tokens=True)
    assert chunks[-1].finish_reason in ("eos", "length") and all(not c.finish_reason for c in chunks[:-1])


def test_stop_string_cuts_text_and_tokens(tiny_generator, tiny_tokenizer, references):
    ids, expected = references[GOLDEN_PROMPTS[1]]
    full = tiny_tokenizer.decode(expected, skip_special_tokens=True)
    stop = full[10:12]
    tokens, chunks = run(tiny_generator, GenerationRequest(ids, MAX_NEW_TOKENS, stop=(stop,), speculation=MODEL))
    text = "".join(c.text for c in chunks)
    assert chunks[-1].finish_reason == "stop"
    assert text == full[: full.index(stop)]
    assert tokens == expected[: len(tokens)]


class FailingDrafter:
    """A drafter whose every call fails: generation must slow down, not break or change."""

    def __init__(self, info):
        self._info = info
        self.calls = 0

    def info(self):
        return self._info

    def propose(self, *args, **kwargs):
        self.calls += 1
        raise ConnectionError("drafter down")

    def release(self, session_id):
        raise ConnectionError("drafter down")


def test_failing_drafter_changes_nothing(tiny_tokenizer, tiny_verifier, references):
    from orchestrator.generator import Generator

    drafter = FailingDrafter(tiny_verifier.info())
    generator = Generator(tiny_tokenizer, tiny_verifier, {"model": drafter})
    ids, expected = references[GOLDEN_PROMPTS[2]]
    tokens, chunks = run(generator, GenerationRequest(ids, MAX_NEW_TOKENS, speculation=MODEL))
    assert tokens == expected
    assert drafter.calls >= len(chunks) - 1  # every round but a last one-token round tried to draft


@pytest.mark.parametrize(
    "speculation",
    [SpeculationOptions(drafter="none"), SpeculationOptions(drafter="model", draft_len=4, adaptive="off")],
    ids=["verifier only", "chain k=4"],
)
def test_sampling_same_seed_same_output(tiny_generator, references, speculation):
    ids, _ = references[GOLDEN_PROMPTS[3]]
    sampling = SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=42)
    first, _ = run(tiny_generator, GenerationRequest(ids, 40, sampling=sampling, speculation=speculation))
    again, _ = run(tiny_generator, GenerationRequest(ids, 40, sampling=sampling, speculation=speculation))
    other, _ = run(tiny_generator, GenerationRequest(ids, 40, sampling=SamplingParams(temperature=0.8, seed=43),
                                                     speculation=speculation))
    assert first == again and first != other


class RecordingPeer:
    """A verifier or drafter that records the sessions it opens and the releases it is asked for."""

    def __init__(self, inner):
        self._inner = inner
        self.opened: list[str] = []
        self.released: dict[str, bool] = {}  # session -> whether the peer still held it when released

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def prefill(self, session_id, *args, **kwargs):  # a verifier's session starts here
        self.opened.append(session_id)
        return self._inner.prefill(session_id, *args, **kwargs)

    def propose(self, request):  # and a drafter's here
        self.opened.append(request.session_id)
        return self._inner.propose(request)

    def release(self, session_id):
        self.released[session_id] = self._inner.release(session_id)
        return self.released[session_id]


def test_sessions_are_released(tiny_tokenizer, tiny_verifier, tiny_drafter, references):
    """A client that goes away after the first chunk: the verifier and the drafter are told to release
    the session, while they still hold it, and hold nothing of it afterwards."""
    from orchestrator.generator import Generator

    verifier, drafter = RecordingPeer(tiny_verifier), RecordingPeer(tiny_drafter)
    generator = Generator(tiny_tokenizer, verifier, {"model": drafter})
    ids, _ = references[GOLDEN_PROMPTS[4]]
    stream = generator.generate(
        GenerationRequest(
            ids,
            MAX_NEW_TOKENS,
            request_id="cancelled",
            speculation=SpeculationOptions(drafter="model", draft_len=4, adaptive="off"),
        )
    )
    next(stream)
    assert not verifier.released and not drafter.released  # still generating
    [session] = verifier.opened
    assert session.startswith("cancelled-") and set(drafter.opened) == {session}
    stream.close()  # a client that goes away
    assert verifier.released == {session: True} and drafter.released == {session: True}
    assert not tiny_verifier.release(session) and not tiny_drafter.release(session)
