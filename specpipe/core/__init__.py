"""The decoding core: the vocabulary of the system (types, protocols, errors) and the pure algorithms
every role shares (verification, sampling, token trees, n-gram semantics, cost fits, tenants).

Imports nothing of specpipe's above it: no models, no services, no configuration (docs/design.md,
"Layers")."""
