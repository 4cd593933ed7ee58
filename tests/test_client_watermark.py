"""The stored record of handled client events (`ClientWatermark`) and the
gateway's `ClientSequence` that takes it in on a resume elsewhere."""

from __future__ import annotations

import random

import pytest

from actors._client_seqs import ClientWatermark, parse_runs
from supervisor.gateway._core import ClientSequence


def _model(handled: set[int]) -> ClientWatermark:
    """The watermark of a set of handled events, computed the plain way."""
    last = 0
    while last + 1 in handled:
        last += 1
    runs: list[tuple[int, int]] = []
    for seq in sorted(s for s in handled if s > last):
        if runs and runs[-1][1] == seq - 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return ClientWatermark(last_client_seq=last, handled_above=tuple(runs))


@pytest.mark.parametrize("seed", range(20))
def test_marking_events_in_any_order_keeps_exactly_the_handled_ones(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a test's order, not a secret
    order = list(range(1, 40))
    rng.shuffle(order)
    watermark, handled = ClientWatermark(), set[int]()
    for seq in order[: rng.randrange(len(order))]:
        watermark = watermark.with_handled((seq, seq))  # marked twice: the same
        handled.add(seq)
        assert watermark == _model(handled)
        assert all(watermark.handled(n) == (n in handled) for n in range(1, 41))


def test_merged_is_the_union() -> None:
    ours = ClientWatermark(last_client_seq=3, handled_above=((6, 7),))
    theirs = ClientWatermark(last_client_seq=1, handled_above=((4, 4), (9, 12)))
    assert ours.merged(theirs) == ClientWatermark(
        last_client_seq=4, handled_above=((6, 7), (9, 12))
    )
    assert theirs.merged(ours) == ours.merged(theirs)


def test_runs_read_as_a_store_writes_them() -> None:
    assert parse_runs("") == ()
    assert parse_runs("3-4,6-6") == ((3, 4), (6, 6))


def test_events_handled_elsewhere_are_repeats_and_the_rest_accepted() -> None:
    # Another process accepted input 2, handled 3, 4 and 6, and died mid-answer.
    sequence = ClientSequence(last=0)
    sequence.catch_up(ClientWatermark(last_client_seq=1, handled_above=((3, 4), (6, 6))))
    verdicts = [sequence.accept(seq) for seq in (1, 2, 3, 4, 5, 6, 7, 7)]
    assert verdicts == [
        "repeat",
        "accepted",
        "repeat",
        "repeat",
        "accepted",
        "repeat",
        "accepted",
        "repeat",
    ]
    assert (sequence.last, sequence.handled_above, sequence.repeats) == (7, (), 5)


def test_catching_up_never_moves_back() -> None:
    sequence = ClientSequence(last=9)
    sequence.catch_up(ClientWatermark(last_client_seq=4, handled_above=((6, 6), (11, 12))))
    assert (sequence.last, sequence.handled_above) == (9, ((11, 12),))
    assert sequence.accept(10) == "accepted"
    assert sequence.accept(11) == "repeat"
    assert sequence.accept(13) == "ahead"
