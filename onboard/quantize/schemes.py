"""The eight schemes, as compressed-tensors presets, and their ``quantization_config``.

Each onboard scheme name maps to one compressed-tensors preset (the library's own
``QuantizationArgs``: bits, strategy, group or block size, scale dtype) and to the
compressor (storage format) the library picks for it. Nothing here re-states those
numbers: group sizes, scale dtypes and formats are read from the preset, so the
``quantization_config`` block is exactly what compressed-tensors (and vLLM, which
parses it with the same classes) expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compressed_tensors.quantization import QuantizationScheme


@dataclass(frozen=True)
class Scheme:
    name: str  # onboard's name (CLI, spec)
    preset: str  # compressed-tensors preset
    format: str  # compressed-tensors CompressionFormat value
    calibrated: bool  # static activation scales need a calibration forward
    summary: str

    @property
    def ct_scheme(self) -> QuantizationScheme:
        return _ct_scheme(self.preset)

    @property
    def input_multiple(self) -> int:
        """Input features must be a multiple of this (the FP4 group size), else 1."""
        w = self.ct_scheme.weights
        if w.strategy in ("group", "tensor_group"):
            return int(w.group_size)
        return 1

    @property
    def block(self) -> tuple[int, int] | None:
        w = self.ct_scheme.weights
        return tuple(w.block_structure) if w.strategy == "block" else None

    @property
    def global_scale(self) -> bool:
        """NVFP4's per-tensor FP32 scale above the FP8 group scales."""
        return self.ct_scheme.weights.strategy == "tensor_group"

    @property
    def packed(self) -> bool:
        """4-bit weights, several to a stored element (FP4: two per byte; INT4:
        eight per int32)."""
        return self.ct_scheme.weights.num_bits == 4

    @property
    def integer(self) -> bool:
        """Integer weights (INT4 packed into int32, INT8), compressed-tensors'
        ``pack-quantized`` and ``int-quantized`` formats."""
        return self.ct_scheme.weights.type == "int"

    @property
    def symmetric(self) -> bool:
        """Scales only; else a zero point per scale too (``w4a16-asym``)."""
        return bool(self.ct_scheme.weights.symmetric)


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "fp8-dynamic",
            "FP8_DYNAMIC",
            "float-quantized",
            False,
            "FP8 e4m3 weights, one scale per output channel; activations FP8 "
            "per token, scaled at run time",
        ),
        Scheme(
            "fp8-block",
            "FP8_BLOCK",
            "float-quantized",
            False,
            "FP8 e4m3 weights in 128x128 blocks (ceil-divided grid); activations "
            "FP8 per 128-group, scaled at run time",
        ),
        Scheme(
            "nvfp4",
            "NVFP4",
            "nvfp4-pack-quantized",
            True,
            "FP4 e2m1 weights and activations, FP8 scales per 16 and an FP32 "
            "global scale; activation global scales calibrated",
        ),
        Scheme(
            "nvfp4a16",
            "NVFP4A16",
            "nvfp4-pack-quantized",
            False,
            "FP4 e2m1 weights with FP8 scales per 16 and an FP32 global scale; "
            "16-bit activations",
        ),
        Scheme(
            "mxfp4",
            "MXFP4",
            "mxfp4-pack-quantized",
            False,
            "FP4 e2m1 weights and activations with E8M0 (power-of-two) scales per 32",
        ),
        Scheme(
            "w4a16",
            "W4A16",
            "pack-quantized",
            False,
            "INT4 weights, symmetric, one scale per group of 128 inputs, eight "
            "to an int32; 16-bit activations",
        ),
        Scheme(
            "w4a16-asym",
            "W4A16_ASYM",
            "pack-quantized",
            False,
            "INT4 weights, asymmetric: a scale and an int4 zero point per group "
            "of 128 inputs; 16-bit activations",
        ),
        Scheme(
            "w8a8-int8",
            "W8A8",
            "int-quantized",
            False,
            "INT8 weights, one scale per output channel; activations INT8 per "
            "token, scaled at run time",
        ),
    )
}


@cache
def _ct_scheme(preset: str) -> QuantizationScheme:
    from onboard.quantize.ct_import import import_compressed_tensors

    import_compressed_tensors()
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme(preset, ["Linear"])


def get_scheme(name: str) -> Scheme:
    from onboard.errors import InputError

    try:
        return SCHEMES[name]
    except KeyError:
        raise InputError(
            f"--scheme: unknown scheme {name!r}; choose one of {', '.join(SCHEMES)}"
        ) from None


def quantization_config(scheme: Scheme, ignore: list[str]) -> dict[str, Any]:
    """The config.json ``quantization_config`` block, as compressed-tensors writes it.

    Mirrors ``ModelCompressor.update_config``: the library's ``QuantizationConfig``
    dumped without ``quant_method``, plus version, method and empty sparsity and
    transform blocks. ``ignore`` lists every Linear module left unquantized.
    """
    from onboard.quantize.ct_import import import_compressed_tensors

    import_compressed_tensors()
    import compressed_tensors
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    qconfig = QuantizationConfig(
        config_groups={"group_0": scheme.ct_scheme.model_copy(deep=True)},
        format=scheme.format,
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=sorted(ignore, key=_natural_key),
    )
    qconfig.config_groups["group_0"].format = scheme.format
    return {
        "version": compressed_tensors.__version__,
        "quant_method": "compressed-tensors",
        "sparsity_config": {},
        "transform_config": {},
        **qconfig.model_dump(mode="json", exclude={"quant_method"}),
    }


def _natural_key(name: str) -> list:
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
