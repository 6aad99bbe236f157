"""inert renders what the server sends as text and nothing more: another user's job name,
command, message, pod reason or event text reaches this user's terminal without acting on it
(kubectl's CVE-2021-25743 was a terminal driven by an event's message).

Every control character — C0, DEL and C1, which start escape sequences, ring the bell, clear
the screen, set the window's title or plant an OSC 8 link — is shown escaped, as Python writes
it (`\\x1b`, `\\n`); a backslash is left as it is. Printed through rich, a string is markup,
so `inert_markup` also escapes `[link=...]`, `[bold]` and the like, to be shown as written.

Every place the CLI prints a string the server sent passes it through one of these two;
`arranger logs` does not (it writes the user's own pod's bytes, as the pod wrote them).
"""

from __future__ import annotations

CONTROLS = (*range(0x00, 0x20), *range(0x7F, 0xA0))  # C0, DEL, C1
ESCAPED = {code: f"\\x{code:02x}" for code in CONTROLS} | {
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}


def inert(text: str) -> str:
    """inert: `text` with each control character written out (`\\x1b`), for a plain write."""
    return text.translate(ESCAPED)


FORMULA_STARTS = ("=", "+", "-", "@")  # what a spreadsheet reads a cell as a formula by


def csv_text(text: str) -> str:
    """csv_text: `inert(text)` for a CSV cell, and a text a spreadsheet would take for a
    formula (`=HYPERLINK(...)`) quoted by a leading `'`, as OWASP advises; a number (`-0.5`)
    is left as it is."""
    text = inert(text)
    if text.startswith(FORMULA_STARTS):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def inert_markup(text: str) -> str:
    """inert_markup: `inert(text)` with rich markup escaped, for a string rich prints as
    markup (a table's cell, console.print's argument): it shows as written, tags and all."""
    from rich.markup import escape  # noqa: PLC0415 (a listing into a pipe never loads rich)

    return escape(inert(text))
