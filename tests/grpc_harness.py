"""Start the verifier, drafter and orchestrator servers in this process on free loopback ports over
the tiny preset, next to the in-process objects they serve (for contract tests: same calls, both
implementations).

    with tiny_cluster() as cluster:
        cluster.verifier_client.prefill("s", [1, 2, 3])

    @pytest.fixture(scope="module")
    def cluster():
        return shared_tiny_cluster()  # one per test process, stopped at exit
"""

from __future__ import annotations

import atexit
import contextlib
import time
from dataclasses import dataclass
from typing import Iterator

from specpipe.config.presets import ModelSpec
from specpipe.core.errors import SpecpipeError
from specpipe.core.types import SpeculationOptions
from specpipe.engine.models import model_info, tiny_model, tiny_tokenizer
from specpipe.serving.clients import DrafterClient, GenerationClient, VerifierClient
from specpipe.serving.server import ServerConfig, ServerHandle, serve

DEFAULTS = SpeculationOptions(drafter="model", draft_len=4, width=1, adaptive="off")


@dataclass
class Cluster:
    verifier: object              # in-process ModelVerifier (the one the verifier server serves)
    drafter: object               # in-process ModelDrafter
    generator: object             # embedded Generator over the in-process verifier and drafter
    remote_generator: object      # the orchestrator server's Generator, over the gRPC clients
    verifier_server: ServerHandle
    drafter_server: ServerHandle
    generation_server: ServerHandle
    verifier_client: VerifierClient
    drafter_client: DrafterClient
    generation_client: GenerationClient

    @property
    def servers(self) -> dict[str, ServerHandle]:
        return {"verifier": self.verifier_server, "drafter": self.drafter_server, "generation": self.generation_server}


@contextlib.contextmanager
def tiny_cluster(timeout_s: float = 30.0) -> Iterator[Cluster]:
    from drafter_service import servicer as drafter_servicer
    from drafter_service.model_drafter import ModelDrafter
    from orchestrator import servicer as generation_servicer
    from orchestrator.generator import Generator
    from verifier_service import servicer as verifier_servicer
    from verifier_service.verifier import ModelVerifier

    verifier_model, drafter_model = tiny_model(), tiny_model(2)
    verifier = ModelVerifier(verifier_model, model_info(ModelSpec("tiny"), verifier_model))
    drafter = ModelDrafter(drafter_model, model_info(ModelSpec("tiny", 2), drafter_model))
    tokenizer = tiny_tokenizer()
    generator = Generator(tokenizer, verifier, {"model": drafter}, DEFAULTS)

    with contextlib.ExitStack() as stack:
        config = ServerConfig(host="127.0.0.1", port=0, grace_s=1.0, reflection=True)
        verifier_server = stack.enter_context(serve([verifier_servicer.service(verifier)], config))
        drafter_server = stack.enter_context(serve([drafter_servicer.service({"model": drafter})], config))
        verifier_client = stack.enter_context(VerifierClient(verifier_server.address, timeout_s=timeout_s))
        drafter_client = stack.enter_context(DrafterClient(drafter_server.address, timeout_s=timeout_s))
        # The orchestrator server drives the verifier and drafter servers through their own clients.
        remote_verifier = stack.enter_context(VerifierClient(verifier_server.address, timeout_s=timeout_s))
        remote_drafter = stack.enter_context(DrafterClient(drafter_server.address, timeout_s=timeout_s))
        remote_generator = Generator(tokenizer, remote_verifier, {"model": remote_drafter}, DEFAULTS)
        generation_server = stack.enter_context(serve([generation_servicer.service(remote_generator)], config))
        generation_client = stack.enter_context(GenerationClient(generation_server.address, timeout_s=timeout_s))
        yield Cluster(verifier, drafter, generator, remote_generator, verifier_server, drafter_server,
                      generation_server, verifier_client, drafter_client, generation_client)


_shared: Cluster | None = None


def shared_tiny_cluster() -> Cluster:
    """One cluster per test process (starting one costs two tiny models), stopped at exit."""
    global _shared
    if _shared is None:
        stack = contextlib.ExitStack()
        _shared = stack.enter_context(tiny_cluster())
        atexit.register(stack.close)
    return _shared


def assert_serving(client, service: str = "") -> None:
    """The server still answers its health check with SERVING (after a bad request, say)."""
    status = client.health(service)
    assert status == "SERVING", f"{client.target} health({service!r}) = {status}"


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(SpecpipeError):
            if predicate():
                return True
        time.sleep(interval_s)
    return False
