"""The runtime shared by `validate` and `speculators`: the vLLM engine in a worker
subprocess (:mod:`onboard.runtime.engine`, :mod:`onboard.runtime.engine_worker`,
:mod:`onboard.runtime.engine_probes`), the Hugging Face reference run on the same
prompts (:mod:`onboard.runtime.reference`, :mod:`onboard.runtime.prompts`), the
comparison rule and its thresholds (:mod:`onboard.runtime.compare`), and the
draft-head settings vLLM's CPU build needs (:mod:`onboard.runtime.cpu_draft`).

It produces no validation check itself (those are :mod:`onboard.validate`'s); see
docs/architecture.md, "Import layers".
"""
