"""The context-window edge: a draft (chain or tree, fresh or pre-drafted) is cut to the positions the
verifier has left (specpipe.core.trees.fit_nodes), so a generation runs right up to the window and never
fails there; likewise to the step a verifier's captured shapes hold (ModelInfo.max_step_tokens). Tiny
preset with a 64-token window; every output equals the verifier's own greedy one."""

from __future__ import annotations

import pytest

from specpipe.core.trees import first_path_nodes, fit_nodes
from specpipe.core.types import ROOT, Draft, GenerationRequest, SpeculationOptions
from tests.golden import reference_greedy

WINDOW = 64
PROMPT = (100, 101, 102) * 9  # 27 tokens, repetitive: n-gram continuations make trees
TREE = Draft((1, 2, 3, 4, 5, 6), (ROOT, 0, 1, ROOT, 0, 3))  # first path 1-2-3; alternatives 4-6, 5


@pytest.mark.parametrize("max_nodes,kept", [
    (6, [0, 1, 2, 3, 4, 5]),  # fits: unchanged
    (4, [0, 1, 2, 3]),        # the first path, then the other nodes in order
    (2, [0, 1]),              # only part of the first path fits
    (0, []),
])
def test_fit_nodes(max_nodes, kept):
    fitted = fit_nodes(TREE, max_nodes)
    assert fitted == TREE.select(kept)
    assert all(p < i for i, p in enumerate(fitted.parents))  # still a tree


def test_fit_nodes_keeps_a_late_first_path():
    draft = Draft((7, 8, 9), (ROOT, ROOT, 0))  # first path 0 -> 2; node 1 an alternative at depth 1
    assert first_path_nodes(draft) == [0, 2]
    assert fit_nodes(draft, 2) == draft.select([0, 2])


@pytest.fixture(scope="module")
def small_window():
    """A tiny verifier and drafter whose context window is WINDOW tokens."""
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.config.presets import ModelSpec
    from specpipe.engine.models import model_info, tiny_model
    from verifier_service.verifier import ModelVerifier

    models = tiny_model(), tiny_model(2)
    for model in models:
        model.config.max_position_embeddings = WINDOW
    verifier = ModelVerifier(models[0], model_info(ModelSpec("tiny"), models[0]))
    drafter = ModelDrafter(models[1], model_info(ModelSpec("tiny", 2), models[1]))
    assert verifier.info().max_context == WINDOW
    return verifier, drafter


@pytest.mark.parametrize("schedule", ["sequential", "branch"])
def test_tree_drafts_run_up_to_the_window(small_window, tiny_tokenizer, schedule):
    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import Generator
    from specpipe.app.wiring import build_drafters

    verifier, drafter = small_window
    max_new = WINDOW - len(PROMPT)  # the whole window
    reference = reference_greedy(verifier.model, PROMPT, max_new)
    assert len(reference) == max_new  # no EOS before the window's end
    store = InMemoryNgramCache()
    generator = Generator(tiny_tokenizer, verifier, build_drafters(("hybrid",), store, drafter, verifier.info()),
                          cache=store)
    for adaptive in ("off", "on"):
        spec = SpeculationOptions(drafter="hybrid", draft_len=6, width=3, adaptive=adaptive, schedule=schedule)
        chunks = list(generator.generate(GenerationRequest(PROMPT, max_new, speculation=spec)))
        assert [t for c in chunks for t in c.token_ids] == reference, adaptive
        assert max(c.round.drafted for c in chunks) > 6  # trees: more nodes than the draft length


def test_drafts_fit_the_verifiers_captured_step_where_sessions_share_it(tiny_tokenizer):
    """A verifier whose forwards run groups of captured shapes (here a cost model's curve) says how long
    a step fits one. While more than CROWDED_SESSIONS generations run, a free n-gram draft (up to 4x the
    cap) is cut to it; alone, a longer step costs only its own forward and is kept. The outputs are
    unchanged."""
    from cache_service.memory import InMemoryNgramCache
    from orchestrator.generator import CROWDED_SESSIONS, Generator
    from specpipe.app.wiring import build_drafters
    from specpipe.config.presets import ModelSpec
    from specpipe.engine.batched import TOKEN_BUCKETS
    from specpipe.engine.costmodel import load_curve
    from specpipe.engine.models import model_info, tiny_model
    from verifier_service.verifier import ModelVerifier

    model = tiny_model()
    info = model_info(ModelSpec("tiny"), model)
    assert ModelVerifier(model, info).info().max_step_tokens == 0  # a CPU's batched forward: any step
    verifier = ModelVerifier(model, info, cost_model=load_curve("nvidia-h200-qwen-coder", "verifier"))
    assert verifier.info().max_step_tokens == TOKEN_BUCKETS[-1]
    prompt, max_new = (100, 101, 102, 103, 104, 105, 106) * 6, 48
    reference = reference_greedy(model, prompt, max_new)
    store = InMemoryNgramCache()
    generator = Generator(tiny_tokenizer, verifier, build_drafters(("ngram",), store, None, verifier.info()),
                          cache=store)
    request = GenerationRequest(prompt, max_new, speculation=SpeculationOptions(drafter="ngram", draft_len=24,
                                                                               adaptive="off"))
    alone = list(generator.generate(request))
    assert [t for c in alone for t in c.token_ids] == reference
    assert max(c.round.drafted for c in alone) == 24  # the repeat drafts long

    crowd = [generator.generate(request) for _ in range(CROWDED_SESSIONS + 1)]
    streams = [[next(g)] for g in crowd]  # from here on they all run
    live = list(range(len(crowd)))
    while live:  # a round of each in turn
        for i in list(live):
            chunk = next(crowd[i], None)
            if chunk is None:
                live.remove(i)
            else:
                streams[i].append(chunk)
    assert all([t for c in stream for t in c.token_ids] == reference for stream in streams)
    assert max(c.round.drafted for stream in streams[-1:] for c in stream) == TOKEN_BUCKETS[-1] - 1  # cut
