"""Errors the CLI turns into exit codes instead of tracebacks."""


class InputError(Exception):
    """Bad input from the user (spec, checkpoint, flag): exit code 2."""


class CheckFailed(Exception):
    """A check ran and failed: exit code 1."""
