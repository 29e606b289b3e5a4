"""The orchestrator: the generation loop over Drafter and Verifier protocols, and the public Generation API."""
