"""Rotary position embedding (RoPE), neox style (rotate the two halves of each head).

cos/sin for every position are computed once into `cos_sin_cache` [max_position, head_dim]
so a step only gathers rows by position — the same cache a device can hold resident. Every layer
rotates by the same angles, so the model gathers them once per step (`cos_sin`) and each layer's
call only rotates (`forward(cos_sin, query, key)`), as vLLM shares one rotary embedding across layers.

The cache follows the module's dtype (``model.to(float16)`` casts it), so the rotation runs in the
activations' dtype, as Hugging Face casts cos/sin to the query's dtype.

A model built on the meta device (shapes only, as a weightless study builds one) gets a meta table:
a meta tensor holds no values, so computing 131,072 positions of float64 angles only to drop them
would be pure cost. Elsewhere the table is computed in blocks of positions straight into its float32
rows, so the float64 intermediates never exist for the whole table at once (the values are the same:
every entry is its own ``cos``/``sin`` of its own angle).
"""

from __future__ import annotations

import torch

from spyre_lab.engine.layers.custom_op import CustomOp

CosSin = tuple[torch.Tensor, torch.Tensor]

POSITIONS_PER_BLOCK = 4096
"""Positions whose float64 angles exist at once while the table is filled (about 2 MB at head_dim 128)."""


def on_build_device(table: torch.Tensor) -> torch.Tensor:
    """A host-made constant table on the device and in the floating dtype the model is being built with
    (``torch.device(...)`` and ``torch.set_default_dtype`` while the loader constructs the model)."""
    return table.to(torch.get_default_device(), torch.get_default_dtype())


def rotary_table(head_dim: int, max_position: int, base: float = 10000.0) -> torch.Tensor:
    """``[cos | sin]`` of every position's angles [max_position, head_dim], float32 on the host.

    Computed in float64 and rounded once to float32 (then to the model's dtype by the caller), as the
    reference implementations round it; block by block, so the host touches the float32 table and one
    block of float64 angles, not four float64 copies of the whole table."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu") / head_dim))
    half = head_dim // 2
    table = torch.empty(max_position, head_dim, dtype=torch.float32, device="cpu")
    for start in range(0, max_position, POSITIONS_PER_BLOCK):
        stop = min(start + POSITIONS_PER_BLOCK, max_position)
        freqs = torch.outer(torch.arange(start, stop, dtype=torch.float64, device="cpu"), inv_freq)
        table[start:stop, :half] = freqs.cos()
        table[start:stop, half:] = freqs.sin()
    return table


def _adjacent(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Is ``key`` the columns right after ``query``'s in the same rows (the q and k slices of a fused qkv)?

    Then both rotate in one pass over ``[T, (heads + kv_heads) * d]``: the same elementwise math on the same
    values, half the ops per layer (a decode step on the cpu platform is bound by per-op host cost)."""
    return (query.dim() == key.dim() == 2 and query.stride() == key.stride() and query.stride(1) == 1
            and query.dtype == key.dtype and query.device == key.device and query.shape[0] == key.shape[0]
            and key.data_ptr() == query.data_ptr() + query.shape[1] * query.element_size())


class RotaryEmbedding(CustomOp):
    op_name = "RotaryEmbedding"

    def __init__(self, head_dim: int, max_position: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        # A constant: computed on the host in float64, then moved to wherever the model is being built (the
        # loader builds it under torch.device("spyre")), as a runtime uploads a program's constants. The device
        # never runs arange / cos / sin for it, and the table is rounded as on the CPU (float64 -> float32 -> dtype).
        if torch.get_default_device().type == "meta":      # shapes only: there are no values to compute
            cache = torch.empty(max_position, head_dim, dtype=torch.get_default_dtype(), device="meta")
        else:
            cache = on_build_device(rotary_table(head_dim, max_position, base))
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        # the last step's angles and their full-width forms (host eager only: `_full_width`)
        self._full_width_of: tuple[torch.Tensor, ...] | None = None

    def cos_sin(self, positions: torch.Tensor) -> CosSin:
        """The angles of each token's position, cos and sin [T, 1, d/2]: gathered once per step, used by every layer."""
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return cos, sin

    def forward_native(
        self, cos_sin: CosSin, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate query [T, heads*d] and key [T, kv_heads*d] by the angles `cos_sin(positions)` gathered."""
        cos, sin = cos_sin
        width = query.shape[1]
        # host tensors in eager only. A traced graph keeps its two rotations and its kernels as they were, and a
        # modeled card's eager launches stay the two rotations vLLM's rotary layer makes (the waterfall's all-off
        # stage models the real stack's single-op launches, not this host shortcut)
        if query.device.type == "cpu" and not torch.compiler.is_compiling():
            full = self._full_width(cos, sin)
            if _adjacent(query, key):
                both = query.as_strided((query.shape[0], width + key.shape[1]), query.stride())
                both = self._rotate_full(both, *full)
                return both[:, :width], both[:, width:]
            return self._rotate_full(query, *full), self._rotate_full(key, *full)
        return self._rotate(query, cos, sin), self._rotate(key, cos, sin)

    def _full_width(self, cos: torch.Tensor, sin: torch.Tensor) -> CosSin:
        """The step's ``[cos | cos]`` and ``[-sin | sin]`` [T, 1, d], made by the first layer to rotate (on the
        host) and reused by the others: the step's angles are the same tensors in every layer."""
        made = self._full_width_of
        if made is None or made[0] is not cos or made[1] is not sin:
            made = self._full_width_of = (cos, sin, torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1))
        return made[2], made[3]

    def _rotate_full(self, x: torch.Tensor, cos_full: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """`_rotate`'s values (bit for bit: ``x2 * -sin`` is ``-(x2 * sin)`` exactly, and each half adds the same
        two products) in three elementwise passes and one copy instead of six and a concatenation."""
        num_tokens = x.shape[0]
        heads = x.view(num_tokens, -1, self.head_dim)
        x1, x2 = heads.chunk(2, dim=-1)
        out = heads * cos_full
        out += torch.cat([x2, x1], dim=-1) * signed_sin
        return out.view(num_tokens, -1)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        num_tokens = x.shape[0]
        x1, x2 = x.view(num_tokens, -1, self.head_dim).chunk(2, dim=-1)
        # integer sizes, not x.shape: a torch.Size argument takes a slower path through the view op
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).view(num_tokens, -1)
