"""experiment_rows: experiments as rows (see rows), and back."""

from __future__ import annotations

from typing import Any

from arranger.server.model import ExperimentRecord
from arranger.spec import JobSpec

EXPERIMENT_COLUMNS = ("id", "name", "owner", "queue", "spec", "submit_time", "members")


def experiment_row(exp: ExperimentRecord) -> dict[str, Any]:
    return {
        "id": exp.id,
        "name": exp.name,
        "owner": exp.owner,
        "queue": exp.spec.queue,
        "spec": exp.spec_json,
        "submit_time": exp.submit_time,
        "members": len(exp.members),
    }


def experiment_from(row: Any, spec: JobSpec) -> ExperimentRecord:
    """experiment_from: an experiment as stored, without its members (its jobs name it)."""
    return ExperimentRecord(
        id=row["id"],
        spec=spec,
        spec_json=row["spec"],
        submit_time=row["submit_time"],
        owner=row["owner"],
    )
