"""Declarative edits of vLLM files, applied to the real file text.

An ``Edit`` says *what* goes where (an entry in a named table, a member of a
tuple, a block before a line, a row of a Markdown table); ``apply_edit`` finds
the place in the text it is given. Edits are data (``to_dict``/``from_dict``) so
that ``onboard pr`` can apply the ``tests/`` and ``docs/`` ones to a checkout's
own files at apply time. An anchor that is missing raises ``EditError`` naming
the file and the anchor: the file's layout changed, which is a version change
(see :mod:`onboard.pr.versions`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


class EditError(Exception):
    """The target file does not have the layout the edit expects."""


@dataclass(frozen=True)
class Edit:
    path: str  # relative to the vLLM repository root
    op: str  # "entry" | "append" | "before" | "md_row" | "replace"
    # table name / regex of the opening line / Markdown heading regex / (replace)
    # the exact text replaced, which must occur once
    anchor: str
    key: str  # the entry's key (what makes it "already there")
    text: str  # the lines to insert (no trailing newline), indentation included
    # entry: "replace" an existing entry with the same key, or "keep" it.
    mode: str = "keep"
    within: str = ""  # regex of a line the anchor must follow (e.g. a def)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, str]) -> Edit:
        return cls(**data)

    @property
    def part(self) -> str:
        return self.path.split("/", 1)[0]


_KEY_PATTERNS = (
    re.compile(r'^    "([^"]+)"\s*:'),  # dict literal entry
    re.compile(r"^    (\w+)="),  # keyword argument (LazyConfigDict(...))
    re.compile(r'^    "([^"]+)",'),  # list member (__all__)
)


def _entry_key(line: str) -> str | None:
    for pattern in _KEY_PATTERNS:
        match = pattern.match(line)
        if match:
            return match.group(1)
    return None


def _find(lines: list[str], pattern: str, start: int, edit: Edit) -> int:
    regex = re.compile(pattern)
    for i in range(start, len(lines)):
        if regex.search(lines[i]):
            return i
    raise EditError(f"{edit.path}: no line matching {pattern!r} (for {edit.key!r})")


def _start(lines: list[str], edit: Edit) -> int:
    return _find(lines, edit.within, 0, edit) + 1 if edit.within else 0


def _table_bounds(lines: list[str], edit: Edit) -> tuple[int, int]:
    """Index of the table's opening line and of its closing line (col 0)."""
    opening = _find(
        lines, rf"^{re.escape(edit.anchor)}\b.*[\[{{(]$", _start(lines, edit), edit
    )
    for end in range(opening + 1, len(lines)):
        if lines[end][:1] in ("}", ")", "]"):
            return opening, end
    raise EditError(f"{edit.path}: table {edit.anchor} is not closed")


def _entry_end(lines: list[str], start: int, end: int) -> int:
    """First line after the entry at ``start`` (its continuation lines included)."""
    i = start + 1
    while i < end:
        line = lines[i]
        if line.startswith("     ") or line.lstrip()[:1] in (")", "]", "}"):
            i += 1
            continue
        break
    return i


def _apply_entry(lines: list[str], edit: Edit) -> list[str]:
    opening, end = _table_bounds(lines, edit)
    new = edit.text.split("\n")
    entries = [
        (i, key)
        for i in range(opening + 1, end)
        if (key := _entry_key(lines[i])) is not None
    ]
    for i, key in entries:
        if key == edit.key:
            if edit.mode == "keep":
                return lines
            stop = _entry_end(lines, i, end)
            return lines[:i] + new + lines[stop:]
    # vLLM keeps these tables mostly alphabetical (with exceptions): go right
    # after the greatest key that sorts before the new one.
    before = [(key.lower(), i) for i, key in entries if key.lower() < edit.key.lower()]
    if before:
        at = _entry_end(lines, max(before)[1], end)
    else:
        at = entries[0][0] if entries else end
        while at - 1 > opening and lines[at - 1].strip().startswith("#"):
            at -= 1  # above the comment lines that introduce the first entry
    return lines[:at] + new + lines[at:]


def _apply_append(lines: list[str], edit: Edit) -> list[str]:
    """Append a member at the end of the bracketed list opened by ``anchor``."""
    opening = _find(lines, edit.anchor, _start(lines, edit), edit)
    depth_line = lines[opening]
    indent = len(depth_line) - len(depth_line.lstrip())
    for end in range(opening + 1, len(lines)):
        line = lines[end]
        stripped = line.lstrip()
        if len(line) - len(stripped) == indent and stripped[:1] in (")", "]"):
            members = {m.strip().rstrip(",") for m in lines[opening + 1 : end]}
            if f'"{edit.key}"' in members:
                return lines
            return lines[:end] + edit.text.split("\n") + lines[end:]
    raise EditError(f"{edit.path}: the list opened by {edit.anchor!r} is not closed")


def _apply_before(lines: list[str], edit: Edit) -> list[str]:
    at = _find(lines, edit.anchor, _start(lines, edit), edit)
    if edit.key in "\n".join(lines[_start(lines, edit) : at]):
        return lines
    return lines[:at] + edit.text.split("\n") + lines[at:]


def _row_key(line: str) -> str | None:
    cells = line.split("|")
    if len(cells) < 3:
        return None
    return cells[1].strip().strip("`") or None


def _apply_md_row(lines: list[str], edit: Edit) -> list[str]:
    heading = _find(lines, edit.anchor, 0, edit)
    first = next(
        (i for i in range(heading + 1, len(lines)) if lines[i].startswith("|")), None
    )
    if first is None:
        raise EditError(f"{edit.path}: no table under {edit.anchor!r}")
    rows = first + 2  # header and separator
    end = rows
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    keys = [(_row_key(lines[i]), i) for i in range(rows, end)]
    if any(key == edit.key for key, _ in keys):
        return lines
    before = [(k.lower(), i) for k, i in keys if k and k.lower() < edit.key.lower()]
    at = max(before)[1] + 1 if before else rows
    return lines[:at] + [edit.text] + lines[at:]


def _apply_replace(lines: list[str], edit: Edit) -> list[str]:
    text = "\n".join(lines)
    if edit.key in text:
        return lines
    count = text.count(edit.anchor)
    if count != 1:
        first = edit.anchor.strip().split("\n")[0]
        raise EditError(
            f"{edit.path}: the text to replace (starting {first!r}) occurs "
            f"{count} times, not once"
        )
    return text.replace(edit.anchor, edit.text).split("\n")


_OPS = {
    "entry": _apply_entry,
    "append": _apply_append,
    "before": _apply_before,
    "md_row": _apply_md_row,
    "replace": _apply_replace,
}


def apply_edit(text: str, edit: Edit) -> str:
    """``text`` with ``edit`` applied (unchanged when the key is already there)."""
    lines = text.split("\n")
    return "\n".join(_OPS[edit.op](lines, edit))


def apply_edits(text: str, edits: list[Edit]) -> str:
    for edit in edits:
        text = apply_edit(text, edit)
    return text
