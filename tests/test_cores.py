"""specpipe.engine.cores: a forward alone takes every core of the process, overlapping forwards of the
verifier and the drafter leave a core to each, counted again at every kernel call (the packed
kernel's output does not depend on its threads: tests/test_native.py)."""

import contextlib
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


@contextlib.contextmanager
def drafter_forward(seen: dict):
    """A drafter's forward in flight on another thread for the block; it records its kernel threads as
    it starts ("drafter") and as it ends ("drafter at its end")."""
    started, release = threading.Event(), threading.Event()

    def drafter():
        with cores.forward("drafter"):
            seen["drafter"] = cores.threads()
            started.set()
            release.wait(5)
            seen["drafter at its end"] = cores.threads()

    thread = threading.Thread(target=drafter)
    thread.start()
    started.wait(5)
    try:
        yield
    finally:
        release.set()
        thread.join(5)


def test_overlapping_roles_leave_a_core_to_each(four_threads):
    seen = {}
    with drafter_forward(seen):
        with cores.forward("verifier"):
            seen["verifier"] = cores.threads()
        with cores.forward("drafter"):  # the same role does not count against itself
            seen["second drafter"] = cores.threads()
    with cores.forward("verifier"):
        seen["verifier after"] = cores.threads()
    assert seen == {"drafter": 4, "verifier": 3, "second drafter": 4, "drafter at its end": 4, "verifier after": 4}


def test_a_long_forward_gives_a_core_up_and_takes_it_back(four_threads):
    """The count is taken at every kernel call: a verification that a drafter's forward joins for a while
    leaves it a core, and runs on every core again once it has ended."""
    seen = {}
    with cores.forward("verifier"):
        seen["verifier alone"] = cores.threads()
        with drafter_forward(seen):
            seen["verifier beside the drafter"] = cores.threads()
        seen["verifier after the drafter"] = cores.threads()
    assert seen == {"verifier alone": 4, "drafter": 3, "verifier beside the drafter": 3, "drafter at its end": 3,
                    "verifier after the drafter": 4}
