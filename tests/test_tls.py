"""TLS, mutual TLS and the bearer token (specpipe.serving.security) on real servers over loopback, with
certificates from specpipe.serving.pki (what `specpipe up --tls` uses); reflection off unless asked for."""

from __future__ import annotations

import contextlib

import grpc
import pytest

from specpipe.core.errors import SpecpipeError, Unauthenticated, Unavailable
from specpipe.core.types import GREEDY, Draft
from specpipe.serving.pki import make_pki
from specpipe.serving.security import Tls, read_token
from specpipe.serving.server import ServerConfig, serve

PROMPT = (10, 20, 30)


def tls(pki, name: str | None, ca: bool = True) -> Tls:
    cert, key = (pki.issued[name].cert, pki.issued[name].key) if name else (None, None)
    return Tls.from_files(cert, key, pki.ca if ca else None)


@pytest.fixture(scope="module")
def pkis(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    return make_pki(root / "ours", ["verifier", "orchestrator", "client"]), make_pki(root / "theirs", ["stranger"])


def test_mutual_tls_between_services(pkis, tiny_verifier):
    from specpipe.serving.clients import VerifierClient
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
    from specpipe.serving.clients import GenerationClient

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

    from specpipe.serving.clients import channel
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
    from specpipe.core.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="together"):
        Tls.from_files(str(tmp_path / "a.pem"), None, None)
    with pytest.raises(InvalidArgument, match="cannot read"):
        Tls.from_files(None, None, str(tmp_path / "missing.pem"))
    assert Tls.from_files(None, None, None) is None


@pytest.mark.slow
def test_specpipe_up_tls_serves_only_over_tls(tmp_path):
    """`specpipe up --tls --cache redis`: mutual TLS between the services, rediss:// with a password,
    and the public port answers a TLS client with the generated client certificate, not plaintext."""
    from specpipe.serving.clients import GenerationClient
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


@pytest.fixture
def secured_orchestrator(pkis, tmp_path, tiny_generator):
    """The public API with mutual TLS and a bearer token; yields (address, CLI flags of a good client)."""
    from orchestrator import servicer

    ours, _ = pkis
    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    config = ServerConfig(port=0, grace_s=0.5, tls=tls(ours, "orchestrator"), auth_token=read_token(str(token_file)))
    client = ours.issued["client"]
    flags = ["--tls-ca", ours.ca, "--tls-cert", client.cert, "--tls-key", client.key,
             "--auth-token-file", str(token_file)]
    with serve([servicer.service(tiny_generator)], config) as handle:
        yield handle.address, [str(f) for f in flags]


def test_specpipe_generate_addr_with_tls_and_a_token(secured_orchestrator, capsys):
    import json

    from specpipe.cli.main import main

    address, flags = secured_orchestrator
    generate = ["generate", "--addr", address, "--prompt", "hi", "--raw", "--max-new-tokens", "4", "--json",
                "--drafter", "model"]
    assert main([*generate, *flags]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 4
    assert main([*generate, *flags, "--tenant", "team-a"]) == 0
    capsys.readouterr()
    assert main([*generate, *flags, "--tenant", "not a tenant"]) == 2  # sent, and checked by the server
    assert "tenant id 'not a tenant' is not valid" in capsys.readouterr().err
    refused = {"no client certificate": (flags[:2] + flags[6:], "UNAVAILABLE"), "no token": (flags[:6], "bearer token"),
               "plaintext": (flags[6:], "UNAVAILABLE")}
    for what, (partial, message) in refused.items():
        assert main([*generate, *partial]) == 2, what
        assert message in capsys.readouterr().err, what


def test_specpipe_loadtest_addr_with_tls_and_a_token(secured_orchestrator, tmp_path):
    """Locust users (deploy/locust/locustfile.py) with the CA, the client certificate and the token."""
    from specpipe.bench.loadstats import read_records
    from specpipe.bench.loadtest import locust_flags
    from specpipe.config.services import TlsFiles
    from tests.test_loadtest import assert_rounds_counted, loadtest

    address, flags = secured_orchestrator
    proc, summary = loadtest(tmp_path / "out", "--addr", address, "--shape", "constant", "--users", "1",
                             "--run-time", "2", "--suite", "random", "--prompt-limit", "2", "--max-new-tokens", "4",
                             *flags)
    assert proc.returncode == 0, proc.stderr
    (level,) = summary["runs"]["default"]
    assert level["requests"] > 0 and level["errors"] == {}
    assert_rounds_counted(read_records(tmp_path / "out" / "requests.jsonl"))
    assert locust_flags(TlsFiles(ca="ca.pem"), "t") == (
        "--grpc-tls-ca", "ca.pem", "--grpc-auth-token-file", "t")


def test_a_plaintext_health_port_beside_a_tls_server(pkis, tiny_verifier):
    """--health-port: Kubernetes' gRPC probes speak no TLS, so the health service alone is served in
    plaintext on its own port, with the same statuses (drain included); nothing else is reachable there."""
    from specpipe.serving.clients import VerifierClient
    from verifier_service import servicer

    ours, _ = pkis
    config = ServerConfig(port=0, grace_s=0.5, tls=tls(ours, "verifier"), health_port=0)
    with serve([servicer.service(tiny_verifier)], config) as handle:
        probe_address = f"127.0.0.1:{handle.health_port}"
        with VerifierClient(probe_address, timeout_s=5.0) as probe:
            assert probe.health() == "SERVING" and probe.health("specpipe.v1.Verifier") == "SERVING"
            with pytest.raises(SpecpipeError) as refused:
                probe.info()  # the Verifier service is not on the health port
            assert refused.value.code == "UNIMPLEMENTED"
            handle.drain(timeout_s=0)
            assert probe.health() == "NOT_SERVING"
        with VerifierClient(handle.address, timeout_s=5.0) as plaintext, pytest.raises(Unavailable):
            plaintext.health()  # the service port stays TLS only


def test_replicas_of_a_dns_name_are_checked_against_the_name(pkis, tiny_verifier):
    """The orchestrator dials the replicas of dns:///name:port by IP; their certificates must carry
    the name (specpipe.app.wiring.peer_tls), here "localhost" for a server dialled as 127.0.0.1."""
    from specpipe.app.wiring import peer_tls
    from specpipe.serving.clients import VerifierClient
    from verifier_service import servicer

    ours, _ = pkis
    client_tls = tls(ours, "orchestrator")
    assert peer_tls(client_tls, "dns:///localhost:50052").server_name == "localhost"
    assert peer_tls(client_tls, "127.0.0.1:50052") is client_tls and peer_tls(None, "dns:///x:1") is None
    with serve([servicer.service(tiny_verifier)], ServerConfig(port=0, grace_s=0.5, tls=tls(ours, "verifier"))) as h:
        with VerifierClient(h.address, 5.0, tls=peer_tls(client_tls, f"dns:///localhost:{h.port}")) as client:
            assert client.health() == "SERVING"
        wrong = peer_tls(client_tls, f"dns:///specpipe-verifier-headless:{h.port}")
        with VerifierClient(h.address, 5.0, tls=wrong) as client, pytest.raises(Unavailable):
            client.health()  # the certificate does not name that Service


@pytest.mark.slow  # `specpipe up --tls` (three services) and a Locust run: 30-90 s
def test_specpipe_loadtest_of_its_own_up_tls(tmp_path):
    """Without --addr and with --up-args --tls, the Locust users take the client certificate that
    `specpipe up` issued (in its log dir)."""
    from tests.test_loadtest import loadtest

    proc, summary = loadtest(tmp_path, "--preset", "tiny", "--up-args=--tls", "--shape", "constant",
                             "--users", "1", "--run-time", "2", "--suite", "random", "--prompt-limit", "2",
                             "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    (level,) = summary["runs"]["default"]
    assert level["requests"] > 0 and level["errors"] == {}
    assert (tmp_path / "up" / "tls" / "client.pem").is_file()
