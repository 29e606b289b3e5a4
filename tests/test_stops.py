import pytest

from orchestrator.stops import find_stop, first_finish, streamable


def test_find_stop_earliest_and_from_start():
    assert find_stop("abc END def STOP", ["STOP", "END"]) == 4
    assert find_stop("abcEND", ["END"], start=5) == 3  # a stop string that ends after start counts
    assert find_stop("abc", ["x"]) == -1


@pytest.mark.parametrize("text,stop,expected", [
    ("hello wor", ["world"], "hello "),
    ("hello", [], "hello"),
    ("caf\ufffd", [], "caf"),
    ("a\n\n", ["\n\n\n"], "a"),
])
def test_streamable_holds_back_partial_stops_and_bytes(text, stop, expected):
    assert streamable(text, stop) == expected


def test_first_finish():
    assert first_finish([1, 2, 3], produced=0, max_new_tokens=10, eos_token_ids=[2]) == (2, "eos")
    assert first_finish([1, 2, 3], produced=8, max_new_tokens=10, eos_token_ids=[]) == (2, "length")
    assert first_finish([1, 2, 3], produced=0, max_new_tokens=10, eos_token_ids=[9]) == (3, "")
    # an EOS among the first min_new_tokens outputs is a token like any other; from there on it ends
    assert first_finish([1, 2, 3], produced=0, max_new_tokens=10, eos_token_ids=[2], min_new_tokens=2) == (3, "")
    assert first_finish([1, 2, 3], produced=0, max_new_tokens=10, eos_token_ids=[2], min_new_tokens=1) == (2, "eos")
