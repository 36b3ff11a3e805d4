"""onboard.quantize.prescan: the FP4 observer forked before torch imports gives
exactly what the workers' own observer gives, and the checkpoint is the same
with it and without it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from onboard.quantize import SCHEMES, kernels, prescan, quantize_checkpoint
from onboard.quantize.st_io import read_header

FP4 = ["nvfp4a16", "mxfp4"]


def test_the_prescanned_schemes_are_those_observed_by_group_maxima():
    by_group = {
        name
        for name, scheme in SCHEMES.items()
        if scheme.ct_scheme.weights.strategy in ("group", "tensor_group")
        and scheme.ct_scheme.weights.symmetric
        and scheme.ct_scheme.weights.group_size % prescan.GROUP == 0
    }
    assert set(prescan.SCHEMES) == by_group


def _weights(dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    special = torch.tensor(
        [0.0, -0.0, 1e-40, -1e-40, 6.0e4, -6.0e4, 1.0, -1.0, 2.0**-14, -(2.0**-24)]
    )
    out = {}
    for i, (rows, cols) in enumerate([(33, 64), (7, 4096), (129, 96)]):
        w = torch.randn(rows, cols, generator=g) * 10.0 ** (i - 1)
        w.view(-1)[: len(special)] = special  # signs, zeros, subnormals, extremes
        out[f"w{i}.weight"] = w.to(dtype)
    out["odd.weight"] = torch.randn(8, 40).to(dtype)  # rows not whole groups of 16
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_maxima_equal_the_workers_observer(tmp_path, dtype):
    path = tmp_path / "model.safetensors"
    weights = _weights(dtype)
    save_file(weights, path)
    infos, _ = read_header(path)
    observer = prescan.start([(path, t) for t in infos])
    maxima = observer.finish(stop=False)
    assert observer.finish() is maxima  # idempotent, the child reaped once
    with pytest.raises(ChildProcessError):
        os.waitpid(observer.pid, 0)
    assert set(maxima) == {"w0.weight", "w1.weight", "w2.weight"}
    for scheme in FP4:
        for name, m in maxima.items():
            got = kernels.observed(m, SCHEMES[scheme])
            want = kernels.observe(weights[name], SCHEMES[scheme])
            assert isinstance(got, kernels._AbsMax)
            for a, b in zip(got, want, strict=True):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name


def test_non_finite_maxima_raise_as_the_observer_does(tmp_path):
    path = tmp_path / "model.safetensors"
    w = torch.randn(16, 64).to(torch.bfloat16)
    w[3, 17] = float("inf")
    save_file({"w.weight": w}, path)
    infos, _ = read_header(path)
    maxima = prescan.start([(path, infos[0])]).finish(stop=False)
    with pytest.raises(kernels.NonFiniteWeights):
        kernels.observed(maxima["w.weight"], SCHEMES["nvfp4a16"])


def test_stopped_observer_returns_only_finished_weights(tmp_path):
    # Many weights, stopped at once: whatever it finished is exact, the rest is
    # left to the workers.
    path = tmp_path / "model.safetensors"
    weights = {
        f"w{i}.weight": torch.randn(256, 1024).to(torch.bfloat16) for i in range(40)
    }
    save_file(weights, path)
    infos, _ = read_header(path)
    observer = prescan.start([(path, t) for t in infos])
    maxima = observer.finish()
    assert set(maxima) <= set(weights)
    for name, m in maxima.items():
        want = kernels.observe(weights[name], SCHEMES["nvfp4a16"])
        assert torch.equal(kernels.observed(m, SCHEMES["nvfp4a16"])[1], want[1])


def test_nothing_to_observe_starts_nothing(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w.weight": torch.randn(4, 64)}, path)  # float32: not prescanned
    infos, _ = read_header(path)
    assert prescan.start([(path, t) for t in infos]) is None


@pytest.mark.parametrize("scheme", FP4)
def test_checkpoint_is_byte_identical_without_the_prescan(
    scheme, tmp_path, monkeypatch
):
    from quantize_helpers import write_llama_checkpoint

    ckpt = write_llama_checkpoint(
        tmp_path / "bf16", hidden=128, intermediate=256, layers=2, vocab=256,
        heads=4, kv=2, shards=2,
    )  # fmt: skip
    # In-process, torch is imported already: let the observer finish every weight
    # instead of stopping it at once, so that the workers use all of them.
    collect, used = prescan.Prescan._collect, {}
    monkeypatch.setattr(
        prescan.Prescan,
        "_collect",
        lambda self, stop: used.update(collect(self, False)) or used,
    )
    with_it = quantize_checkpoint(ckpt, scheme, tmp_path / "with", workers=2)
    assert len(used) == 2 * 7  # every linear weight of the two layers
    monkeypatch.undo()
    monkeypatch.setattr(prescan, "SCHEMES", ())
    without = quantize_checkpoint(ckpt, scheme, tmp_path / "without", workers=2)
    names = sorted(p.name for p in Path(with_it).iterdir())
    assert names == sorted(p.name for p in Path(without).iterdir())
    for name in names:
        assert (Path(with_it) / name).read_bytes() == (
            Path(without) / name
        ).read_bytes(), name
