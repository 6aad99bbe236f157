"""sweep: an experiment's members, made from the spec it was submitted with (spec.sweep).

Member `i` of experiment E is the job `E-i`: grid point `i // seeds` (the parameters' values,
the parameters in name order, the last changing fastest) with seed `i % seeds`. Its spec is
E's with `{name}` (`{seed}`, `{index}`) in every command and args replaced by its value, and
its sweep cut to its own values (Sweep.member set): each pod is given them in its environment
when launched (`sweep_env`). Other braces are left as they are, so a shell's `${HOME}` or a
Python literal in a command means what it did.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace

from arranger.spec import JobSpec, PodTemplate, Sweep

ENV_PREFIX = "ARRANGER_SWEEP_"
RESERVED = ("seed", "index")  # named by every member; no parameter may take these names


def member_name(experiment: str, index: int) -> str:
    """member_name: the job name of member `index`."""
    return f"{experiment}-{index}"


def member_values(sweep: Sweep, index: int) -> dict[str, str]:
    """member_values: what member `index` is given: each parameter's value, `seed`, `index`."""
    values = sweep.values_of(index)
    values["index"] = str(index)
    return values


def experiment_of(spec: JobSpec) -> str:
    """experiment_of: the name of the experiment a member's spec is of ("": not a member)."""
    sweep = spec.sweep
    if sweep is None or sweep.member is None:
        return ""
    return spec.name.removesuffix(f"-{sweep.member}")


def sweep_env(spec: JobSpec) -> dict[str, str]:
    """sweep_env: what the pods of a member are given (see the module; none for a job that is
    no member)."""
    if spec.sweep is None or spec.sweep.member is None:
        return {}
    values = spec.sweep.own_values()
    env = {ENV_PREFIX + key.upper(): value for key, value in values.items()}
    env["ARRANGER_EXPERIMENT"] = experiment_of(spec)
    return env


class Members:
    """Members makes the member specs of one experiment's spec (the pattern of `{name}` is
    built once for all of them)."""

    def __init__(self, spec: JobSpec) -> None:
        assert spec.sweep is not None
        self.spec, self.sweep = spec, spec.sweep
        names = [name for name, _ in self.sweep.parameters] + list(RESERVED)
        self._braces = re.compile(r"\{(" + "|".join(map(re.escape, names)) + r")\}")

    def spec_of(self, index: int) -> JobSpec:
        """spec_of: member `index`'s spec (see the module)."""
        values = member_values(self.sweep, index)
        sets = tuple(
            replace(ws, template=self._template(ws.template, values))
            for ws in self.spec.worker_sets
        )
        own = tuple((name, (values[name],)) for name, _ in self.sweep.parameters)
        seed = index % self.sweep.seeds
        return replace(
            self.spec,
            name=member_name(self.spec.name, index),
            leader=self._template(self.spec.leader, values),
            worker_sets=sets,
            sweep=Sweep(own, member=index, seed=seed),
        )

    def _template(self, tpl: PodTemplate, values: Mapping[str, str]) -> PodTemplate:
        def fill(text: str) -> str:
            return self._braces.sub(lambda m: values[m.group(1)], text) if "{" in text else text

        return replace(tpl, command=tuple(map(fill, tpl.command)), args=tuple(map(fill, tpl.args)))


def longest_member(spec: JobSpec, size: Callable[[str], int]) -> JobSpec:
    """longest_member: a member spec at least as large as any of the experiment's, as `size`
    measures a value (UTF-8 bytes for a command line, JSON for what is stored): each
    parameter at its largest value, index and seed at the most digits (what admission holds
    to the bounds and charges for every member)."""
    assert spec.sweep is not None
    longest = tuple((name, (max(values, key=size),)) for name, values in spec.sweep.parameters)
    wide = replace(spec, sweep=Sweep(longest, seeds=spec.sweep.size))
    return Members(wide).spec_of(spec.sweep.size - 1)
