"""The `quant` check (not built yet: reported as not-run, never passed)."""

from __future__ import annotations

from onboard.validate.results import Check


def run(ctx, name: str) -> Check:
    return Check.not_run(name, f"the {name} check is not implemented in onboard yet")
