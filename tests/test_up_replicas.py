"""`specpipe up --verifiers 2 --drafters 3`: one process per replica on loopback. Golden output
through the orchestrator, then the verifier replica holding a session SIGKILLed and a drafter
drained (SIGTERM) mid-generation: the client's stream still equals verifier-only greedy output."""

import os
import signal

import pytest

from specpipe.core.types import SpeculationOptions
from specpipe.engine.models import tiny_model
from specpipe.serving.clients import GenerationClient, VerifierClient
from tests.golden import GOLDEN_PROMPTS, reference_greedy
from tests.test_contract_generation import specpipe_up

MAX_NEW_TOKENS = 120
SPEC = SpeculationOptions(drafter="model", draft_len=3, width=1, adaptive="off")


def table(lines) -> dict:
    """name -> (address, pid) from `specpipe up`'s table."""
    rows = [line.split() for line in lines]
    return {r[0]: (r[1], int(r[3])) for r in rows if len(r) >= 4 and r[3].isdigit()}


def stream(client, ids):
    return client.generate(token_ids=ids, max_new_tokens=MAX_NEW_TOKENS, speculation=SPEC)


@pytest.mark.slow  # six processes: about 90 s on two shared cores
def test_up_replicas_golden_then_verifier_killed_and_drafter_drained(tmp_path):
    model = tiny_model()
    flags = ("--verifiers", "2", "--drafters", "3", "--hop-delay-ms", "5", "--drain-timeout", "2",
             "--verifier-weights", "fp32")  # the eager reference's model
    with specpipe_up(tmp_path, *flags) as (proc, lines):
        services = table(lines)
        assert {"orchestrator", "verifier-1", "verifier-2", "drafter-1", "drafter-2", "drafter-3"} <= set(services)
        verifiers = [VerifierClient(services[f"verifier-{i}"][0], timeout_s=10) for i in (1, 2)]
        with GenerationClient(services["orchestrator"][0], timeout_s=120) as client:
            for prompt in GOLDEN_PROMPTS[:2]:
                ids = tuple(prompt.encode())
                assert [t for c in stream(client, ids) for t in c.token_ids] == \
                    reference_greedy(model, ids, MAX_NEW_TOKENS), prompt

            ids = tuple(GOLDEN_PROMPTS[2].encode())
            chunks = stream(client, ids)
            tokens = list(next(chunks).token_ids)
            loads = [v.load().open_sessions for v in verifiers]
            assert sorted(loads) == [0, 1], loads
            victim = f"verifier-{loads.index(1) + 1}"
            os.kill(services[victim][1], signal.SIGKILL)
            os.kill(services["drafter-1"][1], signal.SIGTERM)
            rest = [t for c in chunks for t in c.token_ids]
            assert rest, "the generation ended before the replicas were lost"
            assert tokens + rest == reference_greedy(model, ids, MAX_NEW_TOKENS)
            survivor = verifiers[1 - loads.index(1)]
            assert survivor.health("") == "SERVING"
        for v in verifiers:
            v.close()
        assert proc.poll() is None  # replicas may go; up goes on while each role has one
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
