"""ignore decides which files of a working directory are left out of its package.

The rules are those of `.gitignore` and `.arrangerignore` files, read in every directory as it
is walked (the rules of a directory's own files apply below it, `.arrangerignore`'s after
`.gitignore`'s): blank lines and `#` comments are skipped; `!` re-includes what an earlier rule
left out (but nothing inside a directory left out, as with git); a pattern ending in `/`
matches directories only; a pattern with a `/` before its end is anchored to the directory of
its file, one without matches a name at any depth below it; `*` and `?` match within one path
component, `**` across components, `[...]` a set. `.git` (a directory, or a worktree's file)
is always left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IGNORE_FILES = (".gitignore", ".arrangerignore")
ALWAYS_LEFT_OUT = frozenset({".git"})
MAX_IGNORE_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Rule:
    """Rule: one pattern of an ignore file in directory `base` (a path relative to the working
    directory, "" for its top, always ending in '/' otherwise)."""

    base: str
    regex: re.Pattern[str]
    negated: bool
    dirs_only: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        """matches: whether the rule applies to `rel` (relative to the working directory)."""
        if self.dirs_only and not is_dir:
            return False
        if not rel.startswith(self.base):
            return False
        return self.regex.fullmatch(rel[len(self.base) :]) is not None


def parse_rules(text: str, base: str) -> list[Rule]:
    """parse_rules: the rules of one ignore file in directory `base`, in their order."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line.endswith("\\ "):
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated or line.startswith("\\"):
            line = line[1:]
        dirs_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        body = _translate(line)
        regex = re.compile(body if anchored else f"(?:.*/)?{body}")
        rules.append(Rule(base, regex, negated, dirs_only))
    return rules


def _translate(pattern: str) -> str:
    """_translate: a gitignore glob as a regular expression over '/'-separated paths."""
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape("["))
                i += 1
                continue
            inner = pattern[i + 1 : end].replace("\\", "\\\\")
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            out.append(f"[{inner}]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


class IgnoreRules:
    """IgnoreRules: the rules in force while walking a working directory, top down."""

    def __init__(self) -> None:
        self.rules: list[Rule] = []

    def read_dir(self, directory: Path, rel: str) -> None:
        """read_dir adds the rules of the ignore files in `directory` (at `rel`, "" for the
        top or a path ending in '/'); a file too large or unreadable is an OSError."""
        for name in IGNORE_FILES:
            path = directory / name
            if not path.is_file():
                continue
            if path.stat().st_size > MAX_IGNORE_FILE_BYTES:
                raise OSError(f"{path}: larger than {MAX_IGNORE_FILE_BYTES} bytes")
            self.rules += parse_rules(path.read_text(encoding="utf-8", errors="replace"), rel)

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """ignored: whether `rel` is left out (the last rule that matches decides)."""
        if rel.rsplit("/", 1)[-1] in ALWAYS_LEFT_OUT:  # a worktree's .git is a file
            return True
        left_out = False
        for rule in self.rules:
            if rule.negated == left_out and rule.matches(rel, is_dir):
                left_out = not rule.negated
        return left_out
