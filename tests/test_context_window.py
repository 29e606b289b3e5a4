"""The context-window edge: a draft (chain or tree, fresh or pre-drafted) is cut to the positions the
verifier has left (specpipe.core.trees.fit_nodes), so a generation runs right up to the window and never
fails there. Tiny preset with a 64-token window; every output equals the verifier's own greedy one."""

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
