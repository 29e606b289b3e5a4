"""Bad requests get a clear error of the right kind, before any work is done."""

import pytest

from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import GenerationRequest, SamplingParams, SpeculationOptions

PROMPT = (10, 20, 30)
BAD = {
    "empty prompt": (GenerationRequest((), 8), InvalidArgument, "prompt is empty"),
    "token id >= vocab": (GenerationRequest((1, 257), 8), InvalidArgument, "outside the vocabulary"),
    "max_new_tokens 0": (GenerationRequest(PROMPT, 0), InvalidArgument, "max_new_tokens"),
    "beyond context window": (GenerationRequest(PROMPT, 4096), InvalidArgument, "context window"),
    "temperature < 0": (
        GenerationRequest(PROMPT, 8, sampling=SamplingParams(temperature=-1)),
        InvalidArgument,
        "temperature",
    ),
    "top_p 0": (
        GenerationRequest(PROMPT, 8, sampling=SamplingParams(temperature=1, top_p=0)),
        InvalidArgument,
        "top_p",
    ),
    "top_p > 1": (
        GenerationRequest(PROMPT, 8, sampling=SamplingParams(temperature=1, top_p=2)),
        InvalidArgument,
        "top_p",
    ),
    "unknown drafter": (
        GenerationRequest(PROMPT, 8, speculation=SpeculationOptions(drafter="magic")),
        InvalidArgument,
        "unknown drafter",
    ),
    "width 0": (
        GenerationRequest(
            PROMPT, 8, speculation=SpeculationOptions(drafter="model", width=0, adaptive="off", draft_len=4)
        ),
        InvalidArgument,
        "width",
    ),
}


@pytest.mark.parametrize("request_,error,message", BAD.values(), ids=BAD.keys())
def test_bad_request(tiny_generator, request_, error, message):
    with pytest.raises(error, match=message):
        tiny_generator.generate(request_)


def test_encode_needs_exactly_one_input(tiny_generator):
    with pytest.raises(InvalidArgument, match="exactly one"):
        tiny_generator.encode(prompt="a", token_ids=[1])
    with pytest.raises(InvalidArgument, match="empty"):
        tiny_generator.encode(messages=[])


def test_verifier_rejects_unknown_session_and_stale_context(tiny_verifier):
    from specpipe.core.types import GREEDY, Draft

    with pytest.raises(FailedPrecondition, match="unknown session"):
        tiny_verifier.verify("nope", 3, Draft(), GREEDY)
    tiny_verifier.prefill("stale", [1, 2, 3])
    with pytest.raises(FailedPrecondition, match="assumes 5"):
        tiny_verifier.verify("stale", 5, Draft(), GREEDY)
    with pytest.raises(InvalidArgument, match="malformed"):
        tiny_verifier.verify("stale", 3, Draft((1, 2), (-1, 5)), GREEDY)
    assert len(tiny_verifier.verify("stale", 3, Draft.chain([4]), GREEDY).emitted) >= 1  # still usable
    assert tiny_verifier.release("stale")


def test_drafter_not_wired_is_failed_precondition(tiny_tokenizer, tiny_verifier):
    from orchestrator.generator import Generator

    verifier_only = Generator(tiny_tokenizer, tiny_verifier, {})
    with pytest.raises(FailedPrecondition, match="not available"):
        verifier_only.generate(GenerationRequest(PROMPT, 8))


def test_prefill_refuses_an_open_session(tiny_verifier):
    tiny_verifier.prefill("twice", [1, 2])
    with pytest.raises(FailedPrecondition, match="already open"):
        tiny_verifier.prefill("twice", [3, 4])
    assert tiny_verifier.release("twice")
