"""The report book, alone: points kept in the order sent (a lower step rewinds), a full
history thinned with its newest point kept, and the limits on keys and notes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from arranger.server.reports import MAX_KEYS, MAX_POINTS, ReportBook, Series, problem
from arranger.v1 import arranger_pb2


def request(
    *points: tuple[int, dict[str, float]], **notes: str
) -> arranger_pb2.ReportValuesRequest:
    return arranger_pb2.ReportValuesRequest(
        job="j",
        points=[arranger_pb2.ReportPoint(step=s, values=v) for s, v in points],
        notes=notes,
    )


def test_a_lower_step_in_one_call_rewinds_the_history() -> None:
    book = ReportBook()
    new = book.updated(
        "j", request((1, {"r": 1.0}), (2, {"r": 2.0}), (5, {"r": 5.0}), (3, {"r": 3.5}))
    )
    assert not isinstance(new, str)
    assert (new.series["r"].steps, new.series["r"].values) == ([1, 2, 3], [1.0, 2.0, 3.5])
    assert new.step == 3 and book.of("j") is None  # kept only once stored: `put`
    book.put("j", new)
    again = book.updated("j", request((4, {"r": 4.0}), checkpoint="/ckpt/4"))
    assert not isinstance(again, str)
    assert again.latest() == {"r": 4.0} and again.notes == {"checkpoint": "/ckpt/4"}
    assert book.of("j") is new and new.series["r"].steps == [1, 2, 3]  # a copy was changed


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=3 * MAX_POINTS))
def test_a_series_stays_bounded_ascending_and_ends_at_the_newest(steps: list[int]) -> None:
    series = Series()
    for step in steps:
        series.add(step, float(step))
    assert 1 <= len(series.steps) <= MAX_POINTS
    assert series.steps == sorted(set(series.steps)) and series.steps[-1] == steps[-1]
    assert series.values == [float(s) for s in series.steps]


def test_keys_notes_and_values_are_bounded_naming_the_rule() -> None:
    book = ReportBook()
    many = book.updated("j", request((1, {f"k{i}": 1.0 for i in range(MAX_KEYS + 1)})))
    assert isinstance(many, str) and many.startswith("points: a job reports at most 64 keys")
    notes = book.updated("j", request(**{f"n{i}": "x" for i in range(17)}))
    assert isinstance(notes, str) and notes.startswith("notes: a job publishes at most 16")
    assert (
        problem(request((1, {"loss": float("nan")})))
        == "points[0].values.loss: must be a finite number"
    )
    assert problem(request((-1, {"loss": 1.0}))) == "points[0].step: must be >= 0"
    assert problem(request((1, {"1bad": 1.0}))).startswith("points[0].values: key '1bad'")
    assert problem(request(**{"ok": "x" * 1025})).startswith("notes.ok: at most 1024")
