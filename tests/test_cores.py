"""specpipe.engine.cores: a forward alone takes every core of the process, overlapping forwards of the
verifier and the drafter leave a core to each (the packed kernel's output does not depend on its
threads: tests/test_native.py)."""

import threading

import pytest
import torch

from specpipe.engine import cores


@pytest.fixture
def four_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(before)


def test_a_forward_alone_takes_every_core(four_threads):
    assert cores.threads() == 4
    with cores.forward("verifier"):
        assert cores.threads() == 4
    assert cores.threads() == 4


def test_overlapping_roles_leave_a_core_to_each(four_threads):
    drafting, release, seen = threading.Event(), threading.Event(), {}

    def drafter():
        with cores.forward("drafter"):
            seen["drafter"] = cores.threads()
            drafting.set()
            release.wait(5)

    thread = threading.Thread(target=drafter)
    thread.start()
    drafting.wait(5)
    with cores.forward("verifier"):
        seen["verifier"] = cores.threads()
    with cores.forward("drafter"):  # the same role does not count against itself
        seen["second drafter"] = cores.threads()
    release.set()
    thread.join(5)
    with cores.forward("verifier"):
        seen["verifier after"] = cores.threads()
    assert seen == {"drafter": 4, "verifier": 3, "second drafter": 4, "verifier after": 4}

