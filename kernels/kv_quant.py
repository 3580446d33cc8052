"""KV-cache storage formats: how K/V vectors are quantized into pages and read back.

A KV page pool is one payload tensor ``[num_pages, 2, page_size, Hkv, D']`` plus,
for the integer formats, one scales tensor with the same leading dims. The byte
cost of each format matches ``engine/sizing.py``'s ``KV_DTYPES`` table:

- ``fp32``, ``fp16``, ``bf16``: stored as is, no scales.
- ``fp8_e4m3``, ``fp8_e5m2``: torch's float8 dtypes, saturated to the format's
  finite range (a plain cast would turn e4m3 overflow into NaN), no scales, as
  vLLM's ``kv_cache_dtype=fp8`` with unit scales.
- ``int8``: symmetric, one fp32 scale per token per head (``amax / 127``):
  scales ``[num_pages, 2, page_size, Hkv]``, 4 bytes per head vector.
- ``int4``: asymmetric, group-wise along head_dim (group 32), two values per
  byte (element ``2j`` in the low nibble of byte ``j``, ``2j+1`` in the high),
  one fp16 scale and one fp16 minimum per group: scales
  ``[num_pages, 2, page_size, Hkv, D/32, 2]``, 4 bytes per group. Asymmetric
  because K channels carry large per-channel offsets (a symmetric grid would
  spend half its 16 levels on values a skewed group never takes); the minimum
  costs the same two bytes a symmetric format would spend on padding.

The Triton kernels dequantize the same layout in registers
(``kernels/triton_kv.py``); ``dequantize`` here is the torch path's and the
reference's view of the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP = 32

PAYLOAD_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "int4": torch.uint8,
}
FLOAT_FORMATS = {"fp32", "fp16", "bf16"}


def check_format(kv_dtype: str) -> None:
    if kv_dtype not in PAYLOAD_DTYPES:
        raise ValueError(
            f"unknown KV format {kv_dtype!r}; choose one of {', '.join(PAYLOAD_DTYPES)}"
        )


def infer_format(payload: torch.Tensor, kv_dtype: str | None) -> str:
    """The format of ``payload``: ``kv_dtype`` checked against its dtype, or guessed.

    Only the float and fp8 dtypes name their format; ``int8`` and ``int4``
    payloads need ``kv_dtype`` spelled out (and scales).
    """
    if kv_dtype is None:
        guesses = [name for name, dt in PAYLOAD_DTYPES.items() if dt == payload.dtype]
        if len(guesses) != 1 or guesses[0] in ("int8", "int4"):
            raise ValueError(f"KV pages of dtype {payload.dtype} need an explicit kv_dtype")
        return guesses[0]
    check_format(kv_dtype)
    if PAYLOAD_DTYPES[kv_dtype] != payload.dtype:
        raise ValueError(
            f"KV format {kv_dtype!r} is stored as {PAYLOAD_DTYPES[kv_dtype]}, "
            f"got pages of dtype {payload.dtype}"
        )
    return kv_dtype


def check_pages(
    kv_pages: torch.Tensor, scales: torch.Tensor | None, kv_dtype: str | None, head_dim: int
) -> str:
    """The format of ``kv_pages``, after checking its payload and scales fit ``head_dim``."""
    kv_dtype = infer_format(kv_pages, kv_dtype)
    if kv_pages.dim() != 5 or kv_pages.shape[1] != 2:
        raise ValueError(
            f"KV pages must be [num_pages, 2, page_size, Hkv, D'], got {tuple(kv_pages.shape)}"
        )
    if kv_pages.shape[-1] != payload_dim(kv_dtype, head_dim):
        raise ValueError(
            f"{kv_dtype} pages of head_dim {head_dim} need last dim {payload_dim(kv_dtype, head_dim)}"
        )
    want = scales_shape(kv_dtype, tuple(kv_pages.shape[:4]), head_dim)
    if want is None and scales is not None:
        raise ValueError(f"KV format {kv_dtype!r} takes no scales")
    if want is not None and (scales is None or tuple(scales.shape) != want):
        got = None if scales is None else tuple(scales.shape)
        raise ValueError(f"KV format {kv_dtype!r} needs scales shaped {want}, got {got}")
    return kv_dtype


def payload_dim(kv_dtype: str, head_dim: int) -> int:
    """Last dimension of the payload tensor for vectors of ``head_dim`` elements."""
    if kv_dtype == "int4":
        if head_dim % INT4_GROUP:
            raise ValueError(f"int4 KV needs head_dim divisible by {INT4_GROUP}, got {head_dim}")
        return head_dim // 2
    return head_dim


def scales_shape(kv_dtype: str, lead: tuple[int, ...], head_dim: int) -> tuple[int, ...] | None:
    """Shape of the scales for payload vectors with leading dims ``lead``."""
    if kv_dtype == "int8":
        return lead
    if kv_dtype == "int4":
        return (*lead, head_dim // INT4_GROUP, 2)
    return None


def quantize(x: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Vectors ``x [..., D]`` to ``(payload, scales)`` in ``kv_dtype``."""
    check_format(kv_dtype)
    dtype = PAYLOAD_DTYPES[kv_dtype]
    if kv_dtype in FLOAT_FORMATS:
        return x.to(dtype), None
    x = x.float()
    if kv_dtype.startswith("fp8"):
        limit = torch.finfo(dtype).max
        return x.clamp(-limit, limit).to(dtype), None
    if kv_dtype == "int8":
        scale = x.abs().amax(dim=-1) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(x / safe[..., None]).clamp(-127, 127).to(torch.int8)
        return q, scale
    payload_dim(kv_dtype, x.shape[-1])
    groups = x.unflatten(-1, (-1, INT4_GROUP))
    low = groups.amin(dim=-1).half()
    scale = ((groups.amax(dim=-1) - low.float()) / 15.0).half()
    # Quantize against the fp16-rounded scale and minimum, the values dequantization sees.
    safe = torch.where(scale > 0, scale.float(), torch.ones_like(scale, dtype=torch.float32))
    q = torch.round((groups - low.float()[..., None]) / safe[..., None]).clamp(0, 15)
    q = q.to(torch.uint8).flatten(-2)
    packed = q[..., 0::2] | (q[..., 1::2] << 4)
    return packed, torch.stack([scale, low], dim=-1)


def dequantize(
    payload: torch.Tensor,
    scales: torch.Tensor | None,
    kv_dtype: str,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(payload, scales)`` back to vectors ``[..., D]`` of ``dtype``."""
    check_format(kv_dtype)
    if kv_dtype in FLOAT_FORMATS or kv_dtype.startswith("fp8"):
        return payload.to(dtype)
    if scales is None:
        raise ValueError(f"KV format {kv_dtype!r} needs its scales tensor")
    if kv_dtype == "int8":
        return (payload.float() * scales.float()[..., None]).to(dtype)
    q = torch.stack([payload & 0xF, payload >> 4], dim=-1).flatten(-2).float()
    groups = q.unflatten(-1, (-1, INT4_GROUP))
    scale, low = scales.float().unbind(-1)
    return (groups * scale[..., None] + low[..., None]).flatten(-2).to(dtype)


@dataclass(slots=True)
class KVPages:
    """One page pool (one layer's K and V) in a storage format.

    ``data`` is ``[num_pages, 2, page_size, Hkv, D']``; ``scales`` is ``None``
    for the float formats. A slot is ``page * page_size + offset``.
    """

    data: torch.Tensor
    scales: torch.Tensor | None
    kv_dtype: str
    head_dim: int

    @classmethod
    def allocate(
        cls,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        kv_dtype: str = "fp32",
        device: torch.device | str = "cpu",
    ) -> KVPages:
        check_format(kv_dtype)
        lead = (num_pages, 2, page_size, num_kv_heads)
        data = torch.zeros(
            (*lead, payload_dim(kv_dtype, head_dim)),
            dtype=PAYLOAD_DTYPES[kv_dtype],
            device=device,
        )
        shape = scales_shape(kv_dtype, lead, head_dim)
        scale_dtype = torch.float32 if kv_dtype == "int8" else torch.float16
        scales = None if shape is None else torch.zeros(shape, dtype=scale_dtype, device=device)
        return cls(data, scales, kv_dtype, head_dim)

    @property
    def page_size(self) -> int:
        return self.data.shape[2]

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scales is None else self.scales.nbytes
        return self.data.nbytes + extra

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize ``k``, ``v`` ``[T, Hkv, D]`` into ``slots`` ``[T]`` (int)."""
        slots = slots.to(device=self.data.device, dtype=torch.long)
        self.write_at(slots // self.page_size, slots % self.page_size, torch.stack((k, v), 1))

    def write_at(self, pages: torch.Tensor, offsets: torch.Tensor, kv: torch.Tensor) -> None:
        """Quantize ``kv`` ``[T, 2, Hkv, D]`` (K and V of each token) into ``(pages,
        offsets)`` ``[T]`` (long): one index_put per tensor for K and V together."""
        payload, scales = quantize(kv, self.kv_dtype)
        self.data[pages, :, offsets] = payload
        if self.scales is not None:
            self.scales[pages, :, offsets] = scales

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole pool as ``[num_pages, 2, page_size, Hkv, D]`` of ``dtype``."""
        return dequantize(self.data, self.scales, self.kv_dtype, dtype)
