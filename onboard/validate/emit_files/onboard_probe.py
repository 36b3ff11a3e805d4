"""The model class vLLM instantiated, asked of a running `vllm serve`.

Written by `onboard validate --emit`. run.sh serves with
``--worker-extension-cls onboard_probe.ModelClassProbe`` (vLLM mixes this class
into every worker; it adds one method and changes nothing else) and
``VLLM_SERVER_DEV_MODE=1`` (vLLM's /collective_rpc endpoint), then
``python onboard_probe.py --base-url URL --out FILE`` calls the method on every
worker and writes ``{"model_class": "<module>.<class>", "workers": [...]}``: the
class each worker built, not the architecture name vLLM logs (a generated class
may share its name with vLLM's own).
"""

from __future__ import annotations

import argparse
import json
import urllib.request

METHOD = "onboard_model_class"


class ModelClassProbe:
    """Worker extension: the qualified class name of the worker's model."""

    def onboard_model_class(self) -> str:
        # The model LLM.apply_model hands its function (what the cpu target
        # records through it).
        cls = type(self.get_model())
        return f"{cls.__module__}.{cls.__qualname__}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    request = urllib.request.Request(
        args.base_url + "/collective_rpc",
        json.dumps({"method": METHOD}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        workers = json.loads(reply.read())["results"]
    classes = sorted(set(workers))
    result = {
        "model_class": classes[0] if len(classes) == 1 else "",
        "workers": workers,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"model class: {', '.join(classes)}")


if __name__ == "__main__":
    main()
