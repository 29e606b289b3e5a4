"""The verifier service: the large model, the single source of truth for every emitted token."""
