"""Shared fixtures: tiny models built in code (no files), one per test session; and each test file's
kind as a marker (`pytest -m golden`, docs/testing.md)."""

from __future__ import annotations

import pathlib

import pytest
import torch

torch.set_num_threads(1)  # two cores: leave one to the gRPC servers and the other process

KINDS = {  # marker -> the test files of that kind (every test file has one; pyproject.toml registers them)
    "unit": ("test_verification", "test_trees", "test_ngram", "test_sampling", "test_stops", "test_rpc_convert",
             "test_native", "test_cores", "test_prompts", "test_replicas", "test_ray_router", "test_packaged",
             "test_layers", "test_learned", "test_recurring", "test_settings", "test_docs", "test_recipes",
             "test_lint", "test_costmodel", "test_pipecost", "test_planner", "test_observability"),
    "contract": ("test_contract_drafter", "test_contract_generation", "test_contract_verifier", "test_cache_contract",
                 "test_drafter_methods", "test_admission", "test_tls", "test_redis_security", "test_tenancy",
                 "test_limits", "test_lifecycle", "test_openai_api", "test_cache_cluster", "test_verify_stream",
                 "test_replay", "test_tracing"),
    "golden": ("test_golden_embedded", "test_golden_grpc", "test_golden_ngram", "test_golden_smollm2", "test_compile",
               "test_batching", "test_draft_batching", "test_branch", "test_adaptive", "test_gate", "test_sampling_e2e",
               "test_sampling_schedules", "test_context_window", "test_drafter_warm_up", "test_generator_errors",
               "test_gguf_load"),
    "faults": ("test_faults", "test_failover", "test_fuzz", "test_cache_soak", "test_http_hardening"),
    "deploy": ("test_k8s_manifests", "test_k8s_ray", "test_dockerfile", "test_image", "test_up_replicas",
               "test_ray_serve", "test_ray_cli", "test_auto_prepare", "test_cache_cmd",
               "test_observability_up"),
    "bench": ("test_bench", "test_loadtest", "test_aiperf"),
}
KIND_OF = {name: kind for kind, names in KINDS.items() for name in names}


def pytest_collection_modifyitems(items):
    for item in items:
        name = pathlib.Path(str(item.fspath)).stem
        if name not in KIND_OF:
            raise pytest.UsageError(f"{name}.py has no kind: add it to tests/conftest.py's KINDS")
        item.add_marker(KIND_OF[name])


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
    from specpipe.config.presets import model_specs
    from verifier_service.verifier import ModelVerifier

    return ModelVerifier.load(model_specs("tiny")[0])


@pytest.fixture(scope="session")
def tiny_drafter():
    from drafter_service.model_drafter import ModelDrafter
    from specpipe.config.presets import model_specs

    return ModelDrafter.load(model_specs("tiny")[1])


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from specpipe.engine.models import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_generator(tiny_tokenizer, tiny_verifier, tiny_drafter):
    from orchestrator.generator import Generator
    from specpipe.core.types import SpeculationOptions

    # the small model is this generator's one drafter, so requests that name none use it
    return Generator(tiny_tokenizer, tiny_verifier, {"model": tiny_drafter}, SpeculationOptions(drafter="model"))
