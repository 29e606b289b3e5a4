"""Builds generators from CLI flags: which implementation each role gets is decided here only."""

from __future__ import annotations

import argparse

from specpipe.cli.options import set_threads, speculation_options
from specpipe.models import load_tokenizer
from specpipe.presets import model_specs


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


def remote_generator(tokenizer_spec, verifier_addr: str, drafter_addr: str | None, defaults,
                     rpc_timeout_s: float | None = 60.0, connect_timeout_s: float = 60.0):
    """The orchestrator of a distributed deployment: verifier and drafter are gRPC clients.
    Waits up to connect_timeout_s for the verifier (it may still be loading its model)."""
    from orchestrator.generator import Generator
    from specpipe.rpc.clients import DrafterClient, VerifierClient

    verifier = VerifierClient(verifier_addr, timeout_s=rpc_timeout_s)
    verifier.wait_ready(connect_timeout_s)
    drafters = {} if drafter_addr is None else {"model": DrafterClient(drafter_addr, timeout_s=rpc_timeout_s)}
    return Generator(load_tokenizer(tokenizer_spec), verifier, drafters, defaults)
