"""TLS, mutual TLS and the bearer token (specpipe.rpc.security) on real servers over loopback, with
certificates from specpipe.pki (what `specpipe up --tls` uses); reflection off unless asked for."""

from __future__ import annotations

import contextlib

import grpc
import pytest

from specpipe.errors import Unauthenticated, Unavailable
from specpipe.pki import make_pki
from specpipe.rpc.security import Tls, read_token
from specpipe.rpc.server import ServerConfig, serve
from specpipe.types import GREEDY, Draft

PROMPT = (10, 20, 30)


def tls(pki, name: str | None, ca: bool = True) -> Tls:
    cert, key = (pki.issued[name].cert, pki.issued[name].key) if name else (None, None)
    return Tls.from_files(cert, key, pki.ca if ca else None)


@pytest.fixture(scope="module")
def pkis(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    return make_pki(root / "ours", ["verifier", "orchestrator", "client"]), make_pki(root / "theirs", ["stranger"])


def test_mutual_tls_between_services(pkis, tiny_verifier):
    from specpipe.rpc.clients import VerifierClient
    from verifier_service import servicer

    ours, theirs = pkis
    config = ServerConfig(port=0, grace_s=0.5, tls=tls(ours, "verifier"))  # with a CA: client certificates required
    with serve([servicer.service(tiny_verifier)], config) as handle:
        with VerifierClient(handle.address, timeout_s=10.0, tls=tls(ours, "orchestrator")) as client:
            client.prefill("mtls", PROMPT)
            assert len(client.verify("mtls", len(PROMPT), Draft.chain([1, 2]), GREEDY).emitted) >= 1
            assert client.release("mtls")
        refused = {"plaintext": None, "no client certificate": tls(ours, None),
                   "a certificate of another CA": Tls.from_files(theirs.issued["stranger"].cert,
                                                                 theirs.issued["stranger"].key, ours.ca)}
        for what, client_tls in refused.items():
            with VerifierClient(handle.address, timeout_s=5.0, tls=client_tls) as client:
                with pytest.raises(Unavailable):
                    client.info()
        with VerifierClient(handle.address, timeout_s=5.0, tls=tls(theirs, "stranger")) as client:
            with pytest.raises(Unavailable):  # nor does our client trust a server of another CA
                client.info()


def test_public_api_over_tls_with_a_bearer_token(pkis, tmp_path, tiny_generator):
    from orchestrator import servicer
    from specpipe.rpc.clients import GenerationClient

    ours, _ = pkis
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    server_tls = Tls.from_files(ours.issued["orchestrator"].cert, ours.issued["orchestrator"].key, None)  # TLS only
    config = ServerConfig(port=0, grace_s=0.5, tls=server_tls, auth_token=read_token(str(token_file)))
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(serve([servicer.service(tiny_generator)], config))

        def client(token):
            return stack.enter_context(GenerationClient(handle.address, 30.0, tls=tls(ours, None), auth_token=token))

        chunks = list(client("s3cret-token").generate(token_ids=PROMPT, max_new_tokens=4))
        assert sum(len(c.token_ids) for c in chunks) == 4
        for token in (None, "wrong", "s3cret-token "):
            with pytest.raises(Unauthenticated, match="bearer token"):
                list(client(token).generate(token_ids=PROMPT, max_new_tokens=4))
        assert client(None).health() == "SERVING"  # probes need no token


def test_reflection_is_off_unless_asked_for(tiny_verifier):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from specpipe.rpc.clients import channel
    from verifier_service import servicer

    for enabled, expected in ((False, grpc.StatusCode.UNIMPLEMENTED), (True, None)):
        with serve([servicer.service(tiny_verifier)], ServerConfig(port=0, grace_s=0.5, reflection=enabled)) as handle:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel(handle.address))
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            try:
                replies = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
                code = None
                assert any(s.name == "specpipe.v1.Verifier" for s in replies[0].list_services_response.service)
            except grpc.RpcError as err:
                code = err.code()
            assert code == expected


def test_tls_flags_must_come_in_pairs(tmp_path):
    from specpipe.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="together"):
        Tls.from_files(str(tmp_path / "a.pem"), None, None)
    with pytest.raises(InvalidArgument, match="cannot read"):
        Tls.from_files(None, None, str(tmp_path / "missing.pem"))
    assert Tls.from_files(None, None, None) is None


@pytest.mark.slow
def test_specpipe_up_tls_serves_only_over_tls(tmp_path):
    """`specpipe up --tls --cache redis`: mutual TLS between the services, rediss:// with a password,
    and the public port answers a TLS client with the generated client certificate, not plaintext."""
    from specpipe.rpc.clients import GenerationClient
    from tests.test_contract_generation import specpipe_up

    with specpipe_up(tmp_path, "--tls", "--cache", "redis") as (proc, lines):
        table = {line.split()[0]: line.split()[1] for line in lines if line.split()[:1] and
                 line.split()[0] in ("orchestrator", "verifier", "drafter")}
        tls_dir = tmp_path / "tls"
        client_tls = Tls.from_files(str(tls_dir / "client.pem"), str(tls_dir / "client.key"), str(tls_dir / "ca.pem"))
        with GenerationClient(table["orchestrator"], timeout_s=60, tls=client_tls) as client:
            chunks = list(client.generate(prompt="hello", max_new_tokens=6, speculation=None))
        assert sum(len(c.token_ids) for c in chunks) == 6
        for role, address in table.items():
            with GenerationClient(address, timeout_s=5) as plaintext, pytest.raises(Unavailable):
                plaintext.health()
