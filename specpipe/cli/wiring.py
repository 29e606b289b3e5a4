"""Builds generators from CLI flags: which implementation each role gets is decided here only."""

from __future__ import annotations

import argparse

from specpipe.cli.options import set_threads, speculation_options
from specpipe.models import load_tokenizer, model_specs


def embedded_generator(args: argparse.Namespace):
    """Everything in this process: the verifier and (unless --drafter none) the model drafter."""
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator.generator import Generator
    from verifier_service.verifier import ModelVerifier

    set_threads(args.threads)
    verifier_spec, drafter_spec = model_specs(args.preset, args.verifier, args.draft_model)
    verifier = ModelVerifier.load(verifier_spec, args.device)
    drafters = {} if args.drafter == "none" else {"model": ModelDrafter.load(drafter_spec, args.device)}
    return Generator(load_tokenizer(verifier_spec), verifier, drafters, speculation_options(args))
