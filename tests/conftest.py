"""Shared fixtures: tiny models built in code (no files), one per test session."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)  # two cores: leave one to the gRPC servers and the other process


@pytest.fixture
def cli(capsys):
    """specpipe's command line in this process, for flags refused before any model loads (a subprocess
    costs seconds of imports): cli(*argv) -> (exit code, stderr)."""
    from specpipe.cli.main import main

    def run(*argv: str) -> tuple[int, str]:
        try:
            code = main(list(argv))
        except SystemExit as exit:  # argparse's errors
            code = exit.code
        return code, capsys.readouterr().err

    return run


@pytest.fixture(scope="session")
def tiny_verifier():
    from specpipe.presets import model_specs
    from verifier_service.verifier import ModelVerifier

    return ModelVerifier.load(model_specs("tiny")[0])


@pytest.fixture(scope="session")
def tiny_drafter():
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.presets import model_specs

    return ModelDrafter.load(model_specs("tiny")[1])


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from specpipe.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_generator(tiny_tokenizer, tiny_verifier, tiny_drafter):
    from orchestrator.generator import Generator

    from specpipe.types import SpeculationOptions

    # the small model is this generator's one drafter, so requests that name none use it
    return Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter}, SpeculationOptions(drafter="model"))
