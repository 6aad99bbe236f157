"""settings reads the YAML files the daemons are configured with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_settings(path: Path | None, error: type[ValueError]) -> dict[str, Any]:
    """read_settings returns the file's mapping of settings ({} without a file); an unreadable
    file, bad YAML or anything but a mapping raises `error` naming the file."""
    if path is None:
        return {}
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise error(f"{path}: expected a mapping of settings")
    return loaded
