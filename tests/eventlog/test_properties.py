"""Properties of appends and reads under concurrency, checked with generated workloads.

For any set of producers appending batches concurrently:
- the offsets handed out are exactly ``head+1 .. head+N``: gap-free, no duplicates;
- one ``append`` call gets consecutive offsets, and a producer's later call gets later offsets;
- reading the range back returns exactly the appended records, in offset order.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from foldplane.eventlog import KINDS, Log, NewRecord

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
new_records = st.builds(
    NewRecord,
    kind=st.sampled_from(sorted(KINDS)),
    group=st.none() | st.sampled_from(["train", "eval", "g-2"]),
    rank=st.none() | st.integers(min_value=0, max_value=1023),
    payload=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    ts=st.none() | st.integers(min_value=0, max_value=2**62),
)
# producers -> their batches, appended one after another -> the records of one append call
workloads = st.lists(
    st.lists(st.lists(new_records, min_size=1, max_size=6), min_size=1, max_size=5),
    min_size=1,
    max_size=8,
)


def same(rec: Any, new: NewRecord) -> bool:
    return (rec.kind, rec.group, rec.rank, rec.payload) == (
        new.kind,
        new.group,
        new.rank,
        new.payload,
    ) and (new.ts is None or rec.ts == new.ts)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(workload=workloads)
async def test_concurrent_appends_are_gap_free_and_read_back_exactly(
    log: Log, workload: list[list[list[NewRecord]]]
) -> None:
    start = await log.head()  # the log is shared by the examples; each starts at the head

    async def produce(batches: list[list[NewRecord]]) -> list[list[int]]:
        return [await log.append(batch) for batch in batches]

    results = await asyncio.gather(*(produce(b) for b in workload))

    total = sum(len(batch) for batches in workload for batch in batches)
    appended: dict[int, NewRecord] = {}
    for batches, offsets_per_call in zip(workload, results, strict=True):
        previous = start
        for batch, offsets in zip(batches, offsets_per_call, strict=True):
            assert offsets == list(range(offsets[0], offsets[0] + len(batch)))
            assert offsets[0] > previous
            previous = offsets[-1]
            appended.update(zip(offsets, batch, strict=True))
    assert sorted(appended) == list(range(start + 1, start + total + 1))
    assert await log.head() == start + total

    got = await log.read(start, limit=total + 10)
    assert [r.offset for r in got] == list(range(start + 1, start + total + 1))
    for rec in got:
        assert same(rec, appended[rec.offset]), (rec, appended[rec.offset])
