"""The drafter service: proposes drafts that the verifier checks."""
