"""Validation on the real vLLM engine: accuracy against the reference, and the
checks later stages add (kv-cache, quant:<scheme>, spec-decode:<method>, speed).

``validate()`` writes ``validation.json`` (contract in docs/architecture.md) and
``report.html``; see docs/validation.md.
"""

from onboard.validate.harness import CHECKS, RunContext, parse_checks, validate
from onboard.validate.results import Check, ValidationResult

__all__ = [
    "CHECKS",
    "Check",
    "RunContext",
    "ValidationResult",
    "parse_checks",
    "validate",
]
