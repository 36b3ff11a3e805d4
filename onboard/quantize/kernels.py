"""Quantize one weight: compressed-tensors' arithmetic, onboard's fused inner loops.

Every scale comes from compressed-tensors itself: min/max taken over the shapes
llm-compressor's weight observers use, then ``calculate_qparams`` (FP8 rounding of
NVFP4 group scales, E8M0 rounding of MXFP4 scales), ``generate_gparam`` (the NVFP4
global scale) and the compressor's own scale encoding (``_compress_scale``).

The element loop is onboard's: compressed-tensors' ``compress`` runs the
quantization in five full-size passes and packs FP4 through an ``[rows, cols, 8]``
distance tensor (8x the weight in memory, ~1 s per 16M weights here), which alone
would make quantizing slower than reading and writing the checkpoint many times
over. The fused loops below compute the same numbers in cache-sized row blocks:
the same division in the same dtypes, the same clamp, the same round-half-to-even
onto the FP4 grid, the same nibble order. ``check_against_library`` compares them
byte for byte with the library's compressor, on every tensor's first rows at run
time and on random and boundary values in the tests, so a change of convention in
compressed-tensors fails loudly instead of writing a wrong checkpoint.

The integer schemes (INT4, INT8) take the library's own passes (divide, add the
zero point, clamp, round; INT4 packed eight to an int32), fused the same way: in
place on a cache-sized row block, where the library allocates a fresh full-size
tensor for each.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from functools import cache, partial

import torch

from onboard.quantize.schemes import Scheme

TORCH_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
ST_DTYPES = {v: k for k, v in TORCH_DTYPES.items()}

BLOCK_VALUES = 1 << 17  # values per fused-loop block (see _block_rows)
CHECK_ROWS = 16  # rows of every tensor re-done by compressed-tensors at run time,
CHECK_VALUES = 1 << 13  # or fewer where rows are long (the library's path is slow:
# ~4 ms for 32K NVFP4 values, 1.2 ms for 8K, per tensor)


def output_tensors(
    scheme: Scheme, module: str, shape: tuple[int, int], dtype: str
) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of what quantizing ``module.weight`` writes.

    Planned before any data is read, so files can be laid out up front; the
    writer checks each produced tensor against this.
    """
    rows, cols = shape
    w = scheme.ct_scheme.weights
    out: list[tuple[str, str, tuple[int, ...]]] = []
    if scheme.integer:
        # compressed-tensors' pack-quantized (INT4: eight to an int32, the first
        # column in the lowest bits; zero points packed down the rows) and
        # int-quantized (INT8) layouts.
        scale_cols = cols // w.group_size if w.strategy == "group" else 1
        if scheme.packed:
            out.append((f"{module}.weight_packed", "I32", (rows, cols // 8)))
            out.append((f"{module}.weight_scale", dtype, (rows, scale_cols)))
            out.append((f"{module}.weight_shape", "I64", (2,)))
            if not scheme.symmetric:
                zp_shape = (math.ceil(rows / 8), scale_cols)
                out.append((f"{module}.weight_zero_point", "I32", zp_shape))
        else:
            out.append((f"{module}.weight", "I8", (rows, cols)))
            out.append((f"{module}.weight_scale", dtype, (rows, scale_cols)))
    elif scheme.packed:
        out.append((f"{module}.weight_packed", "U8", (rows, cols // 2)))
        scale_dtype = "F8_E4M3" if scheme.global_scale else "U8"
        out.append(
            (f"{module}.weight_scale", scale_dtype, (rows, cols // w.group_size))
        )
        if scheme.global_scale:
            out.append((f"{module}.weight_global_scale", "F32", (1,)))
        if scheme.calibrated:
            out.append((f"{module}.input_global_scale", "F32", (1,)))
    else:
        out.append((f"{module}.weight", "F8_E4M3", (rows, cols)))
        if scheme.block:
            bh, bw = scheme.block
            grid = (math.ceil(rows / bh), math.ceil(cols / bw))
            out.append((f"{module}.weight_scale", dtype, grid))
        else:
            out.append((f"{module}.weight_scale", dtype, (rows, 1)))
    return out


# ---- scales: compressed-tensors ----------------------------------------------


class NonFiniteWeights(ValueError):
    pass


def observe(
    w: torch.Tensor, scheme: Scheme, fast: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max per scale, over the shapes llm-compressor's observers reduce.

    ``fast``: for symmetric scales, (-absmax, absmax) instead (the same scales).
    Raises NonFiniteWeights on NaN or infinity (which min/max propagate).
    """
    from compressed_tensors.quantization.utils import maybe_pad_tensor_for_block_quant

    args = scheme.ct_scheme.weights
    if fast and args.symmetric and w.dtype in _BITS and args.strategy != "block":
        group = w.shape[1] if args.strategy == "channel" else args.group_size
        mx = _absmax(w, group)
        if not torch.isfinite(mx).all():
            raise NonFiniteWeights("NaN or infinite values")
        return _AbsMax((-mx, mx))
    if args.strategy in ("channel", "group", "tensor_group") and w.dtype in _WIDENED:
        group = w.shape[1] if args.strategy == "channel" else args.group_size
        mn, mx = _minmax(w, group)
    elif args.strategy == "channel":
        mn, mx = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    elif args.strategy in ("group", "tensor_group"):
        groups = w.unflatten(-1, (-1, args.group_size))
        mn, mx = groups.amin(dim=-1), groups.amax(dim=-1)
    elif args.strategy == "block":
        bh, bw = args.block_structure
        # Zero padding, as compressed-tensors pads: it cannot raise a max or lower a
        # min past zero, which calculate_qparams includes anyway.
        p = maybe_pad_tensor_for_block_quant(w, (bh, bw))
        blocks = p.reshape(p.shape[0] // bh, bh, p.shape[1] // bw, bw)
        mn, mx = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    else:
        raise AssertionError(args.strategy)
    if not (torch.isfinite(mn).all() and torch.isfinite(mx).all()):
        raise NonFiniteWeights("NaN or infinite values")
    return mn, mx


def observes_by_block(scheme: Scheme, dtype: torch.dtype) -> bool:
    """Whether ``quantize_weight`` observes the weight itself, row block by row
    block (one symmetric scale per row, nothing shared across rows: fp8-dynamic),
    so that the caller need not ``observe`` it first. It raises NonFiniteWeights
    then, possibly after some blocks were handed to the sink."""
    args = scheme.ct_scheme.weights
    return (
        args.strategy == "channel"
        and args.symmetric
        and not scheme.global_scale
        and not scheme.integer
        and dtype in _BITS
        and dtype.itemsize == 2
    )


# Symmetric scales depend on max(|min|, |max|) alone (calculate_qparams), so the
# observer may take one absolute maximum per scale instead: on the bit patterns
# with the sign cleared, whose integer order is the order of the magnitudes, about
# 4x faster than torch.aminmax over groups of 16. An exponent of all ones (NaN or
# infinity) is the largest pattern, so it still shows in the maximum.
_BITS = {
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
}
# Magnitude bits at and above which a value is infinite or NaN (exponent all ones).
_INF_BITS = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00, torch.float32: 0x7F800000}


def all_finite(w: torch.Tensor) -> bool:
    """Whether no value of a float tensor is NaN or infinite.

    On the bit patterns, a block at a time: no float temporaries the size of the
    tensor (it runs on every tensor copied unchanged, embeddings included).
    """
    int_dtype, mask = _BITS[w.dtype]
    flat = w.reshape(-1).view(int_dtype)
    step = 1 << 22
    buf = torch.empty(min(step, flat.numel()), dtype=int_dtype)
    for i in range(0, flat.numel(), step):
        part = torch.bitwise_and(flat[i : i + step], mask, out=buf[: flat.numel() - i])
        if int(part.max()) >= _INF_BITS[w.dtype]:
            return False
    return True


def _absmax(w: torch.Tensor, group: int) -> torch.Tensor:
    """Largest magnitude per ``group`` consecutive values of each row (w.dtype)."""
    int_dtype, mask = _BITS[w.dtype]
    rows, cols = w.shape
    bits = w.view(int_dtype)
    out = torch.empty(rows, cols // group, dtype=int_dtype)
    step = _block_rows(cols)
    buf = torch.empty(min(step, rows), cols, dtype=int_dtype)
    for i in range(0, rows, step):
        a = torch.bitwise_and(bits[i : i + step], mask, out=buf[: min(step, rows - i)])
        torch.amax(a.unflatten(-1, (-1, group)), dim=-1, out=out[i : i + step])
    return out.view(w.dtype)


# 16-bit weights are observed in float32, which holds them exactly: its
# reductions are vectorised where the 16-bit ones are not (two reductions over
# groups of 128, one thread: 0.75 against 2.1 ns per bf16 value, the conversion
# included; two reductions beat one torch.aminmax, 3.9 ns).
_WIDENED = (torch.bfloat16, torch.float16)


def _minmax(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max per ``group`` consecutive values of each row (w.dtype), a row
    block at a time in float32: the same values, since min and max pick one
    value each and the conversions are exact both ways."""
    rows, cols = w.shape
    mn = torch.empty(rows, cols // group, dtype=torch.float32)
    mx = torch.empty_like(mn)
    # Four of the fused loops' blocks (2 MB of float32): 12 against 16 ms for a
    # 4096 x 4096 bf16 weight in groups of 128.
    step = 4 * _block_rows(cols)
    buf = torch.empty(min(step, rows), cols, dtype=torch.float32)
    for i in range(0, rows, step):
        block = buf[: min(step, rows - i)]
        block.copy_(w[i : i + step])
        groups = block.unflatten(-1, (-1, group))
        torch.amin(groups, dim=-1, out=mn[i : i + step])
        torch.amax(groups, dim=-1, out=mx[i : i + step])
    return mn.to(w.dtype), mx.to(w.dtype)


def absmax(stats: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Largest magnitude of a weight from its observed min/max (weight dtype)."""
    mn, mx = stats
    return torch.maximum(-mn.min(), mx.max())


def global_scale(absmaxes: list[torch.Tensor]) -> torch.Tensor:
    """NVFP4 global scale shared by a fused group (llm-compressor's FusionHandler)."""
    from compressed_tensors.quantization.utils import generate_gparam

    a = absmaxes[0]
    for other in absmaxes[1:]:
        a = torch.maximum(a, other)
    return generate_gparam(-a.reshape(1), a.reshape(1))


def input_global_scale(activation_absmax: float) -> torch.Tensor:
    """NVFP4 activation global scale from the calibrated absolute maximum."""
    from compressed_tensors.quantization.utils import generate_gparam

    a = torch.tensor([activation_absmax], dtype=torch.float32)
    return generate_gparam(-a, a)


class _AbsMax(tuple):
    """(-absmax, absmax) from the fast observer: its scales can be looked up."""


def scales(
    stats: tuple[torch.Tensor, torch.Tensor],
    scheme: Scheme,
    gscale: torch.Tensor | None,
) -> torch.Tensor:
    """compressed-tensors' ``calculate_qparams`` scales for observed min/max.

    Its arithmetic is elementwise, and a 16-bit absolute maximum has at most 32768
    values: the library computes the scale of every one of them at once (a table),
    and each group's scale is looked up by its absmax's bits, instead of running
    the library's dozen full passes over all the groups (NVFP4: one per 16 values,
    ~1 ns per weight value, as much as the FP4 loop's biggest passes).
    """
    from compressed_tensors.quantization.utils import calculate_qparams

    mn, mx = stats
    if isinstance(stats, _AbsMax) and mx.dtype in _BITS and mx.dtype.itemsize == 2:
        table = _scale_table(scheme, mx.dtype, gscale)
        idx = mx.view(torch.int16).reshape(-1).to(torch.int32)  # sign cleared
        return table.index_select(0, idx).reshape(mx.shape)
    scale, _zero_point = calculate_qparams(
        mn, mx, scheme.ct_scheme.weights, global_scale=gscale
    )
    return scale


def _scale_table(
    scheme: Scheme, dtype: torch.dtype, gscale: torch.Tensor | None
) -> torch.Tensor:
    if gscale is None:
        return _fixed_scale_table(scheme, dtype)
    return _compute_scale_table(scheme, dtype, gscale)


@cache
def _fixed_scale_table(scheme: Scheme, dtype: torch.dtype) -> torch.Tensor:
    return _compute_scale_table(scheme, dtype, None)


def _compute_scale_table(
    scheme: Scheme, dtype: torch.dtype, gscale: torch.Tensor | None
) -> torch.Tensor:
    """The library's scale for each non-negative ``dtype`` value (by its bits)."""
    from compressed_tensors.quantization.utils import calculate_qparams

    a = torch.arange(1 << 15, dtype=torch.int16).view(dtype)
    a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=dtype))  # unused
    scale, _zero_point = calculate_qparams(
        -a, a, scheme.ct_scheme.weights, global_scale=gscale
    )
    return scale


# ---- the fused element loops --------------------------------------------------

FP8_MAX = 448.0
_ZERO = torch.zeros(())


def _block_rows(cols: int) -> int:
    """Rows per loop block: a block and its scratch buffers stay in L2 cache."""
    return max(1, BLOCK_VALUES // max(1, cols))


def _fp8_rows(
    w: torch.Tensor, scale_rows: torch.Tensor, out: torch.Tensor, buf: torch.Tensor
) -> None:
    # compressed-tensors: x / scale in the weight dtype, clamp to +-448, cast.
    # (+ 0.0: compressed-tensors adds the zero point, which turns -0.0 into +0.0.)
    # (A 0-dim tensor: adding a Python scalar takes a slower path in bf16.)
    x = torch.div(w, scale_rows, out=buf[: w.shape[0]])
    out.copy_(x.clamp_(-FP8_MAX, FP8_MAX).add_(_ZERO))


# Clamp, zero point and cast of a 16-bit quotient depend on its 16 bits alone, so
# for 16-bit weights they are one table lookup: the table is those very torch ops
# applied once to all 65536 bit patterns, then indexed by each quotient's bits
# (index_select, 0.5 ns per value; clamp + add + cast take 2.2 ns).


@cache
def _fp8_table(dtype: torch.dtype) -> torch.Tensor:
    """FP8 byte of clamp(x, -448, 448) + 0 for every ``dtype`` (16-bit) value x."""
    values = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(dtype)
    cast = torch.empty(values.shape, dtype=torch.float8_e4m3fn)
    cast.copy_(values.clamp(-FP8_MAX, FP8_MAX).add_(_ZERO))
    return cast.view(torch.uint8)


def _fp8_rows_table(
    w: torch.Tensor,
    scale_rows: torch.Tensor,
    out: torch.Tensor,
    buf: torch.Tensor,
    index: torch.Tensor,
) -> None:
    """``_fp8_rows`` for 16-bit quotients, through ``_fp8_table``."""
    n = w.shape[0]
    x = torch.div(w, scale_rows, out=buf[:n])
    idx = index[:n].copy_(x.view(torch.uint16))  # zero-extended: 0..65535
    torch.index_select(
        _fp8_table(x.dtype), 0, idx.view(-1), out=out.view(torch.uint8).view(-1)
    )


# Rounding onto the E2M1 grid 0, .5, 1, 1.5, 2, 3, 4, 6 as compressed-tensors'
# cast_to_fp4 does it: to the nearest grid point, ties to the one with the even
# code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), and
# magnitudes past 6 to 6. The grid has steps of 0.5 up to 2, 1 up to 4 and 2 up to
# 6, so on each stretch the code is 2x, x + 2 or x / 2 + 4 rounded half to even
# (torch.round, exact in float32), and off its own stretch each of the three is
# at least the right code: the code is their minimum. Nine cheap float passes,
# about 3x faster than counting the seven midpoints below each value.


class _Fp4Scratch:
    """Buffers of one block of the FP4 loop, reused from block to block."""

    def __init__(self, rows: int, cols: int, group: int):
        grouped = (rows, cols // group, group)
        self.x = torch.empty(grouped, dtype=torch.float32)
        self.x16 = torch.empty(grouped, dtype=torch.bfloat16)
        self.a = torch.empty(grouped, dtype=torch.float32)
        self.b = torch.empty(grouped, dtype=torch.float32)
        self.neg = torch.empty(rows, cols, dtype=torch.uint8)  # (faster than bool)
        self.codes = torch.empty(rows, cols, dtype=torch.uint8)
        self.pairs = torch.empty(rows, cols // 2, dtype=torch.int16)


def _fp4_codes_into(x: torch.Tensor, s: _Fp4Scratch, n: int) -> torch.Tensor:
    """E2M1 nibbles of float32 ``x`` (overwritten): grid index, sign in bit 3."""
    x = x.flatten(-2)
    neg = torch.lt(x, 0, out=s.neg[:n])  # -0.0 is not negative: nibble 0
    x.abs_().clamp_(max=6.0)
    code = torch.mul(x, 2.0, out=s.a[:n].flatten(-2)).round_()
    other = torch.round(x, out=s.b[:n].flatten(-2)).add_(2.0)
    torch.minimum(code, other, out=code)
    torch.minimum(code, x.mul_(0.5).round_().add_(4.0), out=code)
    codes = s.codes[:n]
    codes.copy_(code)
    return codes.add_(neg, alpha=8)


def fp4_codes(scaled: torch.Tensor) -> torch.Tensor:
    """E2M1 nibbles of a ``[rows, cols]`` tensor of scaled values (for the tests)."""
    rows, cols = scaled.shape
    s = _Fp4Scratch(rows, cols, cols)
    s.x.copy_(scaled.reshape(s.x.shape))
    return _fp4_codes_into(s.x, s, rows).clone()


def _pack_into(codes: torch.Tensor, out: torch.Tensor, s: _Fp4Scratch) -> None:
    # Two nibbles per byte, the even column low: as int16 (little-endian), a pair
    # is even + 256 * odd, and (pair | pair >> 4) has the packed byte below.
    pair = codes.view(torch.int16)
    packed = torch.bitwise_right_shift(pair, 4, out=s.pairs[: codes.shape[0]])
    out.copy_(packed.bitwise_or_(pair))  # int16 -> uint8 keeps the low byte


def _fp4_scaled(
    w: torch.Tensor,
    scale_rows: torch.Tensor,
    gscale: torch.Tensor | None,
    group: int,
    s: _Fp4Scratch,
) -> torch.Tensor:
    # compressed-tensors' _process_group + _quantize: x grouped, divided by
    # (scale / global_scale) with torch's type promotion (float32 for NVFP4, the
    # weight dtype for MXFP4), then rounded onto the grid (by the caller).
    n = w.shape[0]
    scale = scale_rows.unsqueeze(-1)
    if gscale is not None:
        scale = scale / gscale
    grouped = w.unflatten(-1, (-1, group))
    dtype = torch.result_type(grouped, scale)
    if dtype == torch.float32:
        return torch.div(grouped, scale, out=s.x[:n])
    # rounded to 16 bits first, as the library's division is
    if s.x16.dtype != dtype:
        s.x16 = torch.empty(s.x16.shape, dtype=dtype)
    return s.x[:n].copy_(torch.div(grouped, scale, out=s.x16[:n]))


def _fp4_rows(
    w: torch.Tensor,
    scale_rows: torch.Tensor,
    gscale: torch.Tensor | None,
    group: int,
    out: torch.Tensor,
    s: _Fp4Scratch,
) -> None:
    x = _fp4_scaled(w, scale_rows, gscale, group, s)
    _pack_into(_fp4_codes_into(x, s, w.shape[0]), out, s)


# A 16-bit weight's FP4 code depends on its 16 bits and its group's scale alone,
# and a weight has few distinct group scales (FP8 or E8M0 values: ~30 for NVFP4,
# ~4 for MXFP4 on the benchmark's weights). So, as for FP8, the code is a table
# lookup: the table is the loop above (the very same torch ops) applied once to
# every 16-bit pattern with each distinct scale, and each value is looked up by
# (its group's scale, its bits): three passes and the packing instead of ~14.
# Used where the table is much smaller than the weight.

_TABLE_COLS = 1 << 16  # every 16-bit pattern, as signed int16 from -32768
# Only where the weight has this many times the table's entries: building an
# entry costs a value of the plain loop (~5.5 ns), a lookup ~2 ns.
TABLE_MIN_RATIO = 2


def _fp4_table_keys(
    stats: tuple[torch.Tensor, torch.Tensor],
    scheme: Scheme,
    gscale: torch.Tensor | None,
    numel: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(divisors, keys): the distinct group scales of a weight (the scales'
    dtype) and, per group, the offset of its scale's row in the code table
    (int32, plus 32768 for the signed bits); None where no table pays off."""
    mn, mx = stats
    if not (
        isinstance(stats, _AbsMax) and mx.dtype in _BITS and mx.dtype.itemsize == 2
    ):
        return None
    table = _scale_table(scheme, mx.dtype, gscale)  # scale of every absmax
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[table.element_size()]
    # Distinct scales by their bits (not values: -0.0 and 0.0 divide differently).
    uniq, inv = torch.unique(table.view(int_dtype), return_inverse=True)
    group_key = inv.index_select(0, mx.view(torch.int16).reshape(-1).to(torch.int32))
    used = torch.bincount(group_key, minlength=uniq.numel()) > 0
    k = int(used.sum())
    if k * _TABLE_COLS * TABLE_MIN_RATIO > numel:
        return None
    rank = torch.cumsum(used, 0, dtype=torch.int32) - 1
    keys = rank.index_select(0, group_key) * _TABLE_COLS + (_TABLE_COLS // 2)
    divisors = uniq[used].view(table.dtype)
    return divisors, keys.reshape(mx.shape)


def _fp4_code_table(
    divisors: torch.Tensor,
    gscale: torch.Tensor | None,
    group: int,
    dtype: torch.dtype,
    limit: int,
) -> torch.Tensor:
    """FP4 nibble of ``dtype`` bit patterns under each scale (flat uint8).

    Filled only for magnitudes up to the bits ``limit`` (the weight's absolute
    maximum: no value of it is larger), both signs; the rest is never read.
    """
    mags = torch.arange(limit + 1, dtype=torch.int32)
    cols = torch.cat([mags - (1 << 15), mags])  # the int16 values: -, then +
    values = cols.to(torch.int16).view(dtype)
    pad = -len(values) % group  # whole groups for the loop (codes discarded)
    values = torch.cat([values, torch.zeros(pad, dtype=dtype)])
    rows = max(1, BLOCK_VALUES // len(values))
    s = _Fp4Scratch(rows, len(values), group)
    table = torch.empty(divisors.numel(), _TABLE_COLS, dtype=torch.uint8)
    where = (cols + (1 << 15)).to(torch.int64)  # column of each value
    for i in range(0, divisors.numel(), rows):
        n = min(rows, divisors.numel() - i)
        w = values.expand(n, len(values))
        scale_rows = divisors[i : i + n].unsqueeze(1).expand(n, len(values) // group)
        x = _fp4_scaled(w, scale_rows, gscale, group, s)
        codes = _fp4_codes_into(x, s, n)[:, : len(cols)]
        table[i : i + n].index_copy_(1, where, codes)
    return table.view(-1)


def _fp4_rows_table(
    w: torch.Tensor,
    keys: torch.Tensor,
    table: torch.Tensor,
    group: int,
    out: torch.Tensor,
    s: _Fp4Scratch,
    index: torch.Tensor,
) -> None:
    """``_fp4_rows`` through ``_fp4_code_table``: keys from ``_fp4_table_keys``."""
    n = w.shape[0]
    # (copy, then add in one dtype: faster than one mixed-dtype broadcast add)
    idx = index[:n].copy_(w.view(torch.int16).unflatten(-1, (-1, group)))
    idx.add_(keys.unsqueeze(-1))  # the bits sign-extended, + 32768 in the key
    codes = s.codes[:n]
    torch.index_select(table, 0, idx.view(-1), out=codes.view(-1))
    _pack_into(codes, out, s)


def quantize_weight(
    w: torch.Tensor,
    scheme: Scheme,
    module: str,
    gscale: torch.Tensor | None = None,
    in_gscale: torch.Tensor | None = None,
    stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    check: bool = True,
    sink: Callable[[str, int, torch.Tensor], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Compressed tensors of ``module.weight`` (names as vLLM loads them).

    ``stats`` is ``observe(w, scheme)`` when the caller has it already.
    ``sink(name, first_row, rows)``: the quantized weight (``weight`` or
    ``weight_packed``) is handed over block by block as it is made, from a reused
    buffer that ``sink`` must consume at once, and left out of the result; the
    writer writes each block while it is still in cache instead of a whole fresh
    tensor (whose first touch costs ~1 ns per byte here).
    """
    args = scheme.ct_scheme.weights
    rows, cols = w.shape
    # Per-row scales are observed block by block, just before the block is
    # quantized (it is then read from cache, not from memory a second time).
    by_block = stats is None and observes_by_block(scheme, w.dtype)
    if by_block:
        scale = torch.empty(rows, 1, dtype=_fixed_scale_table(scheme, w.dtype).dtype)
    else:
        stats = stats or observe(w, scheme)
        if not scheme.integer:  # (int_qparams: scales and zero points)
            scale = scales(stats, scheme, gscale)
    step = _block_rows(cols)
    out: dict[str, torch.Tensor] = {}
    if scheme.integer:
        name, head = _int_weight(w, scheme, module, stats, out, sink)
    elif scheme.packed:
        name = f"{module}.weight_packed"
        group = args.group_size
        scratch = _Fp4Scratch(min(step, rows), cols, group)
        block = torch.empty(min(step, rows), cols // 2, dtype=torch.uint8)
        emit, head = _emitter(name, (rows, cols // 2), block.dtype, sink, out)
        keyed = None
        if w.dtype.itemsize == 2:
            keyed = _fp4_table_keys(stats, scheme, gscale, w.numel())
        if keyed is not None:
            divisors, keys = keyed
            limit = int(stats[1].view(torch.int16).max())  # largest magnitude's bits
            table = _fp4_code_table(divisors, gscale, group, w.dtype, limit)
            index = torch.empty(
                min(step, rows), cols // group, group, dtype=torch.int32
            )
        for i in range(0, rows, step):
            n = min(step, rows - i)
            if keyed is not None:
                _fp4_rows_table(
                    w[i : i + n],
                    keys[i : i + n],
                    table,
                    group,
                    block[:n],
                    scratch,
                    index,
                )
            else:
                _fp4_rows(
                    w[i : i + n], scale[i : i + n], gscale, group, block[:n], scratch
                )
            emit(i, block[:n])
        out[f"{module}.weight_scale"] = _compressor(scheme)._compress_scale(scale, args)
        if gscale is not None:
            out[f"{module}.weight_global_scale"] = gscale
        if scheme.calibrated:
            assert in_gscale is not None, module
            out[f"{module}.input_global_scale"] = in_gscale
    else:
        name = f"{module}.weight"
        if scheme.block:
            bh, bw = scheme.block
            step = max(bh, step // bh * bh)
        buf = torch.empty(min(step, rows), cols, dtype=torch.result_type(w, scale))
        block = torch.empty(buf.shape, dtype=torch.float8_e4m3fn)
        emit, head = _emitter(name, (rows, cols), block.dtype, sink, out)
        rows_fn = _fp8_rows
        if buf.dtype.itemsize == 2:
            index = torch.empty(buf.shape, dtype=torch.int32)
            rows_fn = partial(_fp8_rows_table, index=index)
        for i in range(0, rows, step):
            n = min(step, rows - i)
            if scheme.block:
                s = scale[i // bh : (i + step) // bh + 1]
                s = s.repeat_interleave(bh, 0).repeat_interleave(bw, 1)[:n, :cols]
            else:
                s = scale[i : i + n]
            if by_block:
                s.copy_(scales(observe(w[i : i + n], scheme), scheme, None))
            rows_fn(w[i : i + n], s, block[:n], buf)
            emit(i, block[:n])
        out[f"{module}.weight_scale"] = scale
    if check:
        check_against_library(w, scheme, module, gscale, {**out, name: head()})
    return out


def int_qparams(
    stats: tuple[torch.Tensor, torch.Tensor], scheme: Scheme
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """compressed-tensors' ``calculate_qparams`` scales and int8 zero points of an
    integer scheme (zero points None where symmetric: all zero, and the format
    stores none)."""
    if scheme.symmetric:
        return scales(stats, scheme, None), None
    from compressed_tensors.quantization.utils import calculate_qparams

    return calculate_qparams(*stats, scheme.ct_scheme.weights)


def _int_weight(w, scheme, module, stats, out, sink) -> tuple[str, Callable]:
    """INT4 / INT8 weights into ``out`` (or the sink), a row block at a time:
    compressed-tensors' ``quantize`` and, for INT4, ``pack_to_int32``, fused
    (``_int_rows``, ``_pack_int4_into``). Returns the quantized weight's name and
    ``_emitter``'s ``head`` for the check.
    """
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    args = scheme.ct_scheme.weights
    rows, cols = w.shape
    scale, zp = int_qparams(stats, scheme)
    if scheme.packed:
        name, shape, dtype = f"{module}.weight_packed", (rows, cols // 8), torch.int32
    else:
        name, shape, dtype = f"{module}.weight", (rows, cols), torch.int8
    emit, head = _emitter(name, shape, dtype, sink, out)
    step = _block_rows(cols)
    first = min(step, rows)
    buf = torch.empty(first, cols, dtype=torch.result_type(w, scale))
    q = torch.empty(first, cols, dtype=torch.int8)
    block = torch.empty(first, *shape[1:], dtype=dtype) if scheme.packed else q
    half = 2.0 ** (args.num_bits - 1)
    for i in range(0, rows, step):
        n = min(step, rows - i)
        rows_zp = None if zp is None else zp[i : i + n]
        rows_scale = scale[i : i + n]
        _int_rows(w[i : i + n], rows_scale, rows_zp, args.group_size, half, q[:n], buf)
        if scheme.packed:
            _pack_int4_into(q[:n], block[:n])
        emit(i, block[:n])
    out[f"{module}.weight_scale"] = scale
    if scheme.packed:
        out[f"{module}.weight_shape"] = torch.tensor([rows, cols])
    if zp is not None:
        zp = pack_to_int32(zp, args.num_bits, packed_dim=0)
        out[f"{module}.weight_zero_point"] = zp.contiguous()
    return name, head


def _int_rows(
    w: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group: int | None,
    half: float,
    out: torch.Tensor,
    buf: torch.Tensor,
) -> None:
    """compressed-tensors' integer ``quantize`` of a row block into ``out``
    (int8), in ``buf``: divide (in the weight's and scale's dtype), add the zero
    point (in the weight's dtype), clamp to [-half, half - 1], round half to even;
    the library's passes, in place on a block that stays in cache."""
    n, cols = w.shape
    buf = buf[:n]
    if group:  # the library's grouped shape: [rows, groups, group]
        w, buf = w.view(n, -1, group), buf.view(n, -1, group)
        scale = scale.unsqueeze(-1)
        zero_point = None if zero_point is None else zero_point.unsqueeze(-1)
    torch.div(w, scale, out=buf)
    if zero_point is not None:
        buf.add_(zero_point.to(w.dtype))
    buf.clamp_(-half, half - 1).round_()
    out.copy_(buf.view(n, cols))


def _pack_int4_into(q: torch.Tensor, out: torch.Tensor) -> None:
    """compressed-tensors' ``pack_to_int32`` of INT4 values ``q`` (int8 in
    [-8, 7], overwritten) into ``out`` (int32: value j of each 8 at bits 4j):
    offset to [0, 15], two values to a byte (the first in the low nibble), four
    bytes to a little-endian int32."""
    u = q.add_(8).view(torch.uint8).view(q.shape[0], -1, 2)
    byte = out.view(torch.uint8)
    torch.bitwise_left_shift(u[..., 1], 4, out=byte)
    byte.bitwise_or_(u[..., 0])


def _emitter(name, shape, dtype, sink, out):
    """(emit(first_row, rows), head()) for the quantized weight ``name``: to the
    sink, else into a whole tensor in ``out``; head() has its first rows that
    ``check_against_library`` compares (CHECK_ROWS, or one block row for fp8-block)."""
    if sink is None:
        whole = out[name] = torch.empty(shape, dtype=dtype)

        def emit(i: int, rows: torch.Tensor) -> None:
            whole[i : i + rows.shape[0]] = rows

        return emit, lambda: whole
    keep = 128  # >= CHECK_ROWS and the 128-row FP8 blocks
    first = torch.empty(min(keep, shape[0]), *shape[1:], dtype=dtype)

    def emit_sink(i: int, rows: torch.Tensor) -> None:
        if i < keep:
            first[i : i + rows.shape[0]] = rows[: keep - i]
        sink(name, i, rows)

    return emit_sink, lambda: first


# ---- the library's own path, for checks and dequantization -------------------


@cache
def _compressor(scheme: Scheme):
    from onboard.quantize.ct_import import import_compressed_tensors

    import_compressed_tensors()
    from compressed_tensors.compressors import BaseCompressor

    return BaseCompressor.get_value_from_registry(scheme.format)


def library_compress(
    w: torch.Tensor, scheme: Scheme, gscale: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """compressed-tensors' own ``compress`` of one weight (slow; the reference)."""
    from compressed_tensors.quantization.utils import calculate_qparams

    mn, mx = observe(w, scheme, fast=False)
    scale, zp = calculate_qparams(mn, mx, scheme.ct_scheme.weights, global_scale=gscale)
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    if gscale is not None:
        state["weight_global_scale"] = gscale
    # cast_to_fp4 is torch.compile'd (unless ct_import kept it eager); eager gives
    # the same values without a multi-second compile per process.
    with _eager():
        return dict(_compressor(scheme).compress(state, scheme.ct_scheme))


def _eager():
    # No torch compiler loaded: nothing is compiled, and importing it costs ~1.5 s.
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


def check_against_library(
    w: torch.Tensor,
    scheme: Scheme,
    module: str,
    gscale: torch.Tensor | None,
    out: dict[str, torch.Tensor],
) -> None:
    """Byte-compare the first rows of ``out`` with compressed-tensors' compressor."""
    rows = max(1, min(CHECK_ROWS, CHECK_VALUES // w.shape[1]))
    if scheme.integer and not scheme.symmetric:
        rows = -(-rows // 8) * 8  # whole int32s of zero points packed down the rows
    n = min(w.shape[0], scheme.block[0] if scheme.block else rows)
    # (a copy: ``w`` may be a read-only file mapping, the library gets its own rows)
    ref = library_compress(w[:n].clone(), scheme, gscale)
    ref.pop("weight_shape", None)  # the first rows' shape (ours: the whole's)
    for local, value in ref.items():
        mine = out[f"{module}.{local}"][: value.shape[0]]
        if mine.dtype != value.dtype or not torch.equal(
            mine.reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)
        ):
            raise AssertionError(
                f"{module}.{local}: onboard's quantizer disagrees with "
                "compressed-tensors' compressor; please report this"
            )


def dequantize(
    tensors: dict[str, torch.Tensor], scheme: Scheme, module: str
) -> torch.Tensor:
    """The float weight a compressed module stands for, by compressed-tensors."""
    prefix = f"{module}."
    state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    state.pop("input_global_scale", None)
    if scheme.block:
        # compressed-tensors 0.17's decompress infers the block size as rows //
        # scale rows, wrong for a ceil-divided grid (576 rows, 5 blocks): give it
        # the scheme's arguments instead.
        from compressed_tensors.quantization.lifecycle.forward import (
            dequantize as ct_dequantize,
        )

        return ct_dequantize(
            state["weight"], state["weight_scale"], args=scheme.ct_scheme.weights
        )
    return _compressor(scheme).decompress(state, scheme.ct_scheme)["weight"]
