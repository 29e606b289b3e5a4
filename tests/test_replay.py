"""The replay verifier (verifier_service/replay.py) against the live model it was recorded from: a
verification accepts exactly the draft tokens the model's greedy decoding would and emits its next
token, so generations and their rounds are the live verifier's, chains and trees alike; what it
cannot answer it refuses. The replayed drafter (drafter_service/replay.py) drafts the live small
model's chain up to its first token off the continuation, so behind the replayed verifier every
round accepts what the live pair's does. The transcript is recorded by the same code as
`specpipe transcript record`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from drafter_service.replay import TranscriptDrafter
from specpipe.bench.transcript import record, suite_prompts
from specpipe.config.services import GeneratorConfig, ModelConfig, VerifierConfig
from specpipe.core import transcript as transcripts
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.core.types import GREEDY, Draft, GenerationRequest, ProposeRequest, SamplingParams, SpeculationOptions
from verifier_service import replay

MAX_NEW_TOKENS = 48


@pytest.fixture(scope="module")
def transcript_path(tmp_path_factory):
    config = GeneratorConfig(VerifierConfig(ModelConfig(preset="tiny", compile="off")))  # the fixtures' eager models
    recorded = record(config, suite_prompts("mix", 2), MAX_NEW_TOKENS, "test", progress=False)
    path = tmp_path_factory.mktemp("replay") / "tiny.json.gz"
    transcripts.save(recorded.transcript, path)
    assert recorded.disagreements == 0  # the teacher-forced forward agrees with the greedy continuation
    return path


@pytest.fixture(scope="module")
def transcript(transcript_path):
    return transcripts.load(transcript_path)


def generate(verifier, tokenizer, prompt_ids, spec: SpeculationOptions, drafter=None):
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters

    kinds = ("ngram",) if drafter is None else ("model", "hybrid")
    generator = Generator(tokenizer, verifier, build_drafters(kinds, None, drafter, verifier.info()), spec, None)
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


def chain_until_off(draft, output, emitted):
    """The main chain's tokens up to and including its first one off the recorded continuation (and
    not past it)."""
    chain = []
    for depth, token in enumerate(draft.tokens[n] for n in range(len(draft)) if draft.parents[n] == n - 1):
        if emitted + depth >= len(output):
            break
        chain.append(token)
        if token != output[emitted + depth]:
            break
    return chain


@pytest.mark.parametrize("stop", [0.0, 0.4])
def test_replayed_drafter_drafts_the_live_chain_until_it_leaves_the_continuation(transcript, tiny_drafter, stop):
    replayed = TranscriptDrafter(transcript)
    for e, entry in enumerate(transcript.entries):
        for emitted in range(0, len(entry.output_ids) - 1, 5):
            context = entry.prompt_ids + entry.output_ids[:emitted]
            request = ProposeRequest(f"s{e}-{emitted}", context, 6, stop_confidence=stop)
            live, table = tiny_drafter.propose(request).draft, replayed.propose(request).draft
            same = chain_until_off(live, entry.output_ids, emitted)
            assert list(table.tokens[:len(same)]) == same
            assert table.confidence[:len(same)] == pytest.approx(live.confidence[:len(same)], abs=1e-4)
            assert table.runner_up[:len(same)] == live.runner_up[:len(same)]
            if not stop:  # as long as the live chain (the recorded continuation allowing)
                assert len(table) == min(len(live), len(entry.output_ids) - emitted)


@pytest.mark.parametrize("spec", [SpeculationOptions("model", 4, 1, adaptive="off"),
                                  SpeculationOptions("hybrid", 4, 1, adaptive="off"),
                                  SpeculationOptions("model", 4, 1, schedule="branch", hypotheses=2, adaptive="off")],
                         ids=["model", "hybrid", "branch"])
def test_behind_the_replayed_verifier_the_replayed_drafter_lands_what_the_live_pair_does(
        transcript, tiny_verifier, tiny_drafter, tiny_tokenizer, spec):
    for entry in transcript.entries:
        live_tokens, live_rounds = generate(tiny_verifier, tiny_tokenizer, entry.prompt_ids, spec, tiny_drafter)
        tokens, rounds = generate(replay.TranscriptVerifier(transcript), tiny_tokenizer, entry.prompt_ids, spec,
                                  TranscriptDrafter(transcript))
        assert tokens == live_tokens
        if spec.drafter == "model":  # every round as the live pair's
            assert rounds == live_rounds
        else:  # the store's continuation after a chain's unknown tail may differ, and what the node budget keeps
            accepted, live = sum(a for _, a in rounds), sum(a for _, a in live_rounds)
            assert abs(accepted - live) <= 0.1 * live + 1


def test_replayed_drafter_refuses_what_its_table_cannot_answer(transcript):
    drafter = TranscriptDrafter(transcript)
    entry = transcript.entries[0]
    with pytest.raises(FailedPrecondition, match="greedy requests only"):
        drafter.propose(ProposeRequest("s", entry.prompt_ids, 4, sampling=SamplingParams(temperature=0.7, seed=1)))
    with pytest.raises(FailedPrecondition, match="width <= 2"):
        drafter.propose(ProposeRequest("s", entry.prompt_ids, 4, width=3))
    off = entry.output_ids[0] + 1  # a pre-draft after a predicted outcome: drafted, though no table holds it
    assert len(drafter.propose(ProposeRequest("h", (*entry.prompt_ids, off), 4)).draft) == 4
    with pytest.raises(FailedPrecondition, match="starts with no recorded prompt"):
        drafter.propose(ProposeRequest("other", (1, 2, 3), 4))
    without = transcripts.Transcript(transcript.info, transcript.attention,
                                     tuple(replace(e, draft_top=(), draft_p=()) for e in transcript.entries))
    with pytest.raises(InvalidArgument, match="no drafter table"):
        TranscriptDrafter(without)


def test_served_replay_pair_emits_the_recorded_continuations(transcript_path, transcript):
    """`specpipe serve verifier|drafter --replay FILE` as the services build them, an orchestrator over gRPC
    drafting with the default hybrid (the replayed small model's chain, the store's continuations)."""
    from drafter_service import servicer as drafter_servicer
    from specpipe.app.wiring import drafter_methods, load_verifier, remote_generator
    from specpipe.config.services import DrafterConfig, OrchestratorConfig
    from specpipe.serving.server import ServerConfig, serve
    from verifier_service import servicer as verifier_servicer

    tiny = ModelConfig(preset="tiny")
    drafters = drafter_methods(DrafterConfig(tiny, replay=str(transcript_path)))
    assert isinstance(drafters["model"], TranscriptDrafter)  # no weights loaded
    verifier = load_verifier(VerifierConfig(tiny, replay=str(transcript_path)))
    config = ServerConfig(host="127.0.0.1", port=0, grace_s=1.0)
    spec = SpeculationOptions(drafter="hybrid", draft_len=4)
    with serve([verifier_servicer.service(verifier)], config) as verifier_server, \
            serve([drafter_servicer.service(drafters)], config) as drafter_server:
        generator = remote_generator(OrchestratorConfig(verifier_addr=verifier_server.address,
                                                        drafter_addr=drafter_server.address, model=tiny,
                                                        speculation=spec, cache="memory"))
        accepted = 0
        for entry in transcript.entries:
            chunks = list(generator.generate(GenerationRequest(entry.prompt_ids, MAX_NEW_TOKENS, speculation=spec)))
            assert [t for c in chunks for t in c.token_ids] == list(entry.output_ids[:MAX_NEW_TOKENS])
            accepted += sum(c.round.accepted for c in chunks)
    assert accepted > 0
