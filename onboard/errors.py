"""Errors the CLI turns into exit codes instead of tracebacks."""


class InputError(Exception):
    """Bad input from the user (spec, checkpoint, flag): exit code 2."""


class CheckFailed(Exception):
    """A check ran and failed: exit code 1."""


def printable(text: str, limit: int | None = None) -> str:
    """``text`` safe for one terminal line: control characters (ANSI escapes, raw
    newlines, bidi overrides) escaped as ``\\x1b``, ``\\n``, ``\\u202e``; with
    ``limit``, cut to about that many characters with the rest counted."""
    out = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in str(text))
    if limit is not None and len(out) > limit:
        out = f"{out[:limit]}... ({len(out) - limit} more characters)"
    return out


def printable_lines(text: str) -> str:
    """Each line of a multi-line message made printable (the newlines kept)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
