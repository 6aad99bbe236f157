"""`--set PATH=VALUE` on a job file: applied in order, read as YAML, checked like the file;
a refusal names the --set and the rule."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from arranger.client.overrides import MAX_SETS, OverrideError, apply_sets
from arranger.client.specfile import SpecFileError, load_job_yaml
from tests.conftest import job_spec

FILE = yaml.safe_dump(job_spec("base", leader=["python", "train.py"], workers=2))


def test_fields_by_path_with_list_items_by_index() -> None:
    job = load_job_yaml(
        FILE,
        "job.yaml",
        [
            "spec.priority=7",
            "spec.workerSets[0].counts=8",
            "spec.leader.template.env.LR=0.001",
            "spec.leader.template.env.TAG='007'",
            "metadata.name=sweep-1",
            "spec.leader.template.args=[--lr, '3e-4']",
        ],
    )
    assert job.spec.priority == 7 and job.spec.worker_sets[0].counts == 8
    assert dict(job.spec.leader.template.env) == {"LR": "0.001", "TAG": "007"}
    assert job.metadata.name == "sweep-1"
    assert list(job.spec.leader.template.args) == ["--lr", "3e-4"]


def test_a_later_set_wins_and_a_list_grows_by_its_next_item() -> None:
    doc = apply_sets({"a": [1]}, ["a[1]=2", "a[1]=3", "b.c=x"])
    assert doc == {"a": [1, 3], "b": {"c": "x"}}


@pytest.mark.parametrize(
    ("given_set", "said"),
    [
        ("spec.priority", "give PATH=VALUE"),
        ("=7", "give PATH=VALUE"),
        ("spec..priority=1", "'' is not a field name"),
        ("spec.workerSets[5].counts=1", "spec.workerSets[5]: the list has 1 items"),
        ("spec.workerSets[0].counts.n=1", "spec.workerSets[0].counts is not a mapping"),
        ("spec.leader[0]=1", "spec.leader is not a list"),
        ("spec.priority=[1", "the value is not YAML"),
    ],
)
def test_a_set_that_cannot_be_applied_names_itself_and_why(given_set: str, said: str) -> None:
    with pytest.raises(SpecFileError) as refused:
        load_job_yaml(FILE, "job.yaml", [given_set])
    assert f"--set {given_set!r}" in str(refused.value) and said in str(refused.value)


def test_what_results_is_checked_like_the_file() -> None:
    with pytest.raises(SpecFileError) as refused:
        load_job_yaml(FILE, "job.yaml", ["spec.priorty=7", "spec.workerSets[0].counts=lots"])
    text = str(refused.value)
    assert "spec.priorty" in text and "spec.workerSets[0].counts" in text


def test_sets_are_bounded() -> None:
    with pytest.raises(OverrideError, match=f"at most {MAX_SETS}"):
        apply_sets({}, ["a=1"] * (MAX_SETS + 1))
    with pytest.raises(OverrideError, match="longer than"):
        apply_sets({}, ["a=" + "x" * 5000])


names = st.from_regex(r"[a-z][a-zA-Z0-9_]{0,8}", fullmatch=True)


@given(st.lists(names, min_size=1, max_size=4), st.integers(-(2**31), 2**31))
def test_a_path_of_mappings_is_made_and_holds_the_value(path: list[str], value: int) -> None:
    doc: Any = apply_sets({}, [f"{'.'.join(path)}={value}"])
    for key in path:
        doc = doc[key]
    assert doc == value


def test_a_string_stays_as_given_and_a_key_may_hold_a_dot() -> None:
    job = load_job_yaml(
        FILE,
        "job.yaml",
        [
            (True, "spec.leader.template.env.TAG=007"),
            "spec.leader.template.env.ON=on",
            "spec.leader.template.nodeSelector.gpu\\.type=a100",
        ],
    )
    assert dict(job.spec.leader.template.env) == {"TAG": "007", "ON": "true"}  # YAML's on
    assert dict(job.spec.leader.template.node_selector) == {"gpu.type": "a100"}
