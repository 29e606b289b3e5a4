"""Serving infrastructure: gRPC servers and the clients of every role (the protocols of specpipe.core
over the stubs of specpipe.v1), TLS and a private CA, replica routing and failover.

Imports the layers below it and specpipe.v1; never a role (orchestrator, drafter_service,
verifier_service, cache_service), which import it."""
