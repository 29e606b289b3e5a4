"""The replay verifier (verifier_service/replay.py) against the live model it was recorded from: a
verification accepts exactly the draft tokens the model's greedy decoding would and emits its next
token, so generations and their rounds are the live verifier's, chains and trees alike; what it
cannot answer it refuses. The transcript is recorded by the same code as `specpipe transcript record`."""

from __future__ import annotations

import pytest

from specpipe.bench.transcript import record, suite_prompts
from specpipe.config.services import GeneratorConfig, ModelConfig, VerifierConfig
from specpipe.core.errors import FailedPrecondition
from specpipe.core.types import GREEDY, Draft, GenerationRequest, SamplingParams, SpeculationOptions
from verifier_service import replay

MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def transcript(tmp_path_factory):
    config = GeneratorConfig(VerifierConfig(ModelConfig(preset="tiny")))
    recorded = record(config, suite_prompts("mix", 2), MAX_NEW_TOKENS, "test", progress=False)
    path = tmp_path_factory.mktemp("replay") / "tiny.json.gz"
    replay.save(recorded.transcript, path)
    assert recorded.disagreements == 0  # the teacher-forced forward agrees with the greedy continuation
    return replay.load(path)


def generate(verifier, tokenizer, prompt_ids, spec: SpeculationOptions):
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters

    generator = Generator(tokenizer, verifier, build_drafters(("ngram",), None, None, verifier.info()), spec, None)
    chunks = list(generator.generate(GenerationRequest(prompt_ids, MAX_NEW_TOKENS, speculation=spec)))
    return [t for c in chunks for t in c.token_ids], [(c.round.drafted, c.round.accepted) for c in chunks]


@pytest.mark.parametrize("spec", [SpeculationOptions("ngram", 4, 1, adaptive="off"),
                                  SpeculationOptions("ngram", 5, 3, adaptive="off"),  # trees
                                  SpeculationOptions("none", 0, 1, adaptive="off")], ids=["chain", "tree", "plain"])
def test_replay_verifies_as_the_live_model_does(transcript, tiny_verifier, tiny_tokenizer, spec):
    replayed = replay.TranscriptVerifier(transcript)
    for entry in transcript.entries:
        live = generate(tiny_verifier, tiny_tokenizer, entry.prompt_ids, spec)
        assert generate(replayed, tiny_tokenizer, entry.prompt_ids, spec) == live
        assert live[0] == list(entry.output_ids)[:MAX_NEW_TOKENS]


def test_replay_answers_the_recorded_entropy_and_refuses_what_it_cannot_answer(transcript):
    verifier = replay.TranscriptVerifier(transcript)
    entry = transcript.entries[0]
    verifier.prefill("s", entry.prompt_ids)
    first = entry.output_ids[0]
    result = verifier.verify("s", len(entry.prompt_ids), Draft((first, first + 1), (-1, 0)), GREEDY)
    assert result.accepted_tokens == (first,) and result.correction_token == entry.output_ids[1]
    assert result.entropy == pytest.approx(entry.entropy[1], abs=1e-5)
    assert result.node_argmax[2] == replay.UNKNOWN  # after a rejected node: off the transcript
    with pytest.raises(FailedPrecondition, match="greedy rounds only"):
        verifier.verify("s", len(entry.prompt_ids) + 2, Draft(), SamplingParams(temperature=0.7, seed=1))
    with pytest.raises(FailedPrecondition, match="not in the replay transcript"):
        verifier.prefill("other", (1, 2, 3))
    cut = next(e for e in transcript.entries if e.finish == "length")
    verifier.prefill("long", cut.prompt_ids)
    context = len(cut.prompt_ids)
    for _ in cut.output_ids:  # every recorded token, then none left
        context = verifier.verify("long", context, Draft(), GREEDY).context_len
    with pytest.raises(FailedPrecondition, match="transcript ends"):
        verifier.verify("long", context, Draft(), GREEDY)
