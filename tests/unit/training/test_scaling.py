"""The overlap timing of bucket all-reduces with backward, on hand-computed cases."""

from __future__ import annotations

import pytest

from rdurack.errors import InvalidRequest
from rdurack.workloads.training.scaling import overlap, split_by_bytes


def test_all_reduce_hidden_except_the_last_bucket() -> None:
    t = overlap([1.0, 1.0, 1.0], [0.5, 0.5, 0.5])
    assert t.ready_s == (1.0, 2.0, 3.0)
    assert t.start_s == (1.0, 2.0, 3.0)
    assert t.done_s == (1.5, 2.5, 3.5)
    assert t.end_s == 3.5 and t.exposed_s == 0.5 and t.hidden_s == 1.0


def test_communication_bound_all_reduces_queue_on_one_stream() -> None:
    t = overlap([1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    # Bucket 1 is ready at 2 but starts when bucket 0's all-reduce is done, at 3.
    assert t.start_s == (1.0, 3.0, 5.0)
    assert t.end_s == 7.0 and t.exposed_s == 4.0 and t.hidden_s == 2.0


def test_uneven_buckets_and_a_start_offset() -> None:
    # A small first bucket starts communication early (torch's 1 MiB first bucket).
    t = overlap([0.1, 2.0, 0.5], [0.2, 1.0, 0.4], start_s=10.0)
    assert t.ready_s == pytest.approx((10.1, 12.1, 12.6))
    assert t.start_s == pytest.approx((10.1, 12.1, 13.1))
    assert t.end_s == pytest.approx(13.5)
    assert t.exposed_s == pytest.approx(0.9)
    assert overlap([], []).end_s == 0.0


def test_bad_input_is_refused_and_split_is_proportional() -> None:
    with pytest.raises(InvalidRequest, match="one of each per bucket"):
        overlap([1.0], [1.0, 2.0])
    with pytest.raises(InvalidRequest):
        overlap([-1.0], [1.0])
    assert split_by_bytes(3.0, [1, 2]) == pytest.approx([1.0, 2.0])
    assert split_by_bytes(1.0, []) == []
