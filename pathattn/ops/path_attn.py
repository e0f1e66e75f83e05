"""Public PaTH / PaTH-FoX attention op (paper sections 2.2 and 3.3)."""

from __future__ import annotations

import torch

from .backends import Backend, get_backend, select_backend
from .layout import BlockLayout, make_layout
from .nonfinite import isolate_nonfinite, poison_keys, poison_rows
from .stages import compute_dtype, default_scale, num_reflections, single_reflection
from .validation import check_block_size, check_path_attn_inputs

__all__ = ["path_attn", "path_attn_with_keys", "DEFAULT_BLOCK_SIZE", "blockwise_layout",
           "default_block_size", "keys_backend"]

DEFAULT_BLOCK_SIZE = 128


def path_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
              beta: torch.Tensor, g: torch.Tensor | None = None, *,
              scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
              block_size: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Causal PaTH attention (PaTH-FoX when forget gates are given).

    For query position i and key position j <= i of the same sequence:

        logit(i, j) = scale * k_j^T H_{j+1} ... H_i q_i + (G_i - G_j),
        H_t = I - beta_t w_t w_t^T,   G_i = sum_{t <= i} g_t,
        o_i = sum_j softmax_j(logit(i, j)) v_j.

    Args:
        q: [B, T, HQ, D] queries.
        k: [B, T, H, D] keys; HQ must be a multiple of H (GQA / MQA: query head h uses
            key/value head h // (HQ // H)).
        v: [B, T, H, Dv] values.
        w: [B, T, H, D] Householder directions (the layer L2-normalises them; the op does
            not require it), or [B, T, H, R, D]: R >= 1 reflections per token, H_t =
            H_{t,1} H_{t,2} ... H_{t,R} with H_{t,r} = I - beta_{t,r} w_{t,r} w_{t,r}^T
            (R = 1 is the same op as w [B, T, H, D]; backends without several reflections,
            `pathattn.ops.backends`, refuse R > 1 and "auto" passes over them).
        beta: [B, T, H] Householder strengths (the layer keeps them in (0, 2)), or
            [B, T, H, R] with w [B, T, H, R, D].
        g: [B, T, HQ] log forget gates (<= 0) of PaTH-FoX, or None.
        scale: logit scale, default D ** -0.5. It multiplies only the PaTH term, not the
            gate term (the paper's and FoX's convention). fla's `parallel_path_attn`
            multiplies the gate term by the scale too: fla(g=g_fla) equals
            path_attn(g=g_fla * scale).
        cu_seqlens: optional int tensor [N + 1] of packed sequence boundaries (B must be 1,
            FlashAttention convention). No attention and no Householder product crosses a
            boundary.
        block_size: block length C of the blockwise algorithm, at most 1024 (default 128,
            256 on the fused CPU kernels once the longest sequence has 4096 tokens and
            every query head has its own key head, `pathattn.ops.cpu.kernel_block_size`;
            the longest sequence rounded up to a multiple of 16 when that is shorter; the
            UT transform itself runs on sub-blocks of at most 64 tokens). With
            backend="triton": a power of two in [16, 128], default the largest whose
            kernels fit the device's shared memory (`pathattn.ops.triton.config`).
        backend: "auto", or a registered backend: "cpu" (the blockwise algorithm with
            fused C++ kernels), "torch" (the same in PyTorch ops), "triton" (CUDA; on CPU
            tensors only under TRITON_INTERPRET=1). "auto" takes triton for CUDA tensors
            when installed, cpu for float32 / float64 CPU tensors when the kernels build,
            torch otherwise (`pathattn.ops.backends`).

    q, k, v, w share a dtype (float16, bfloat16, float32 or float64); beta and g may be any
    float dtype. Low precision inputs accumulate in float32. Returns o [B, T, HQ, Dv] in
    q's dtype, differentiable in q, k, v, w, beta and g.

    A NaN or inf in token t's k, v, w, beta or g makes the rows i >= t of its sequence (and
    those query heads) NaN, and a non-finite q_i row i; every other row is computed as if
    it were not there, as the definition says (`pathattn.ops.nonfinite`).

    Autocast does not reach inside: the op keeps its own precision rule (above) and
    returns q's dtype whatever autocast region it is called in.

    torch.compile traces it, forward and backward, without a graph break (fullgraph=True,
    dynamic sequence lengths, cu_seqlens): every backend runs as torch.library custom ops
    (`pathattn.ops.backends`), and the checks that read cu_seqlens' values run inside the
    compiled graph (their error comes when the compiled code runs).
    """
    device = q.device.type if isinstance(q, torch.Tensor) else "cpu"  # bad q: checked below
    with torch.autocast(device, enabled=False):
        return _path_attn(q, k, v, w, beta, g, scale, cu_seqlens, block_size, backend)


def _path_attn(q, k, v, w, beta, g, scale, cu_seqlens, block_size, backend):
    check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    impl = select_backend(backend, q, num_reflections(w))
    check_block_size(block_size)
    B, T, HQ, D = q.shape
    if B * T == 0:
        return q.new_zeros(B, T, HQ, v.shape[-1]) + 0 * (q.sum() + k.sum() + v.sum())
    (q, k, v, w, beta, g), bad = isolate_nonfinite(q, k, v, w, beta, g, cu_seqlens)
    o = impl.attention(q, k, v, w, beta, g, default_scale(D, scale), cu_seqlens, block_size)
    return poison_rows(o, bad)


def path_attn_with_keys(q, k, v, w, beta, g=None, *, scale=None, cu_seqlens=None,
                        block_size=None, backend: str = "auto"
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`path_attn` (no autograd) plus every key transformed by all later tokens of its
    sequence: keys[b, j] = H_{T-1} ... H_{j+1} k_j (T the sequence's length; row form
    k_j^T H_{j+1} ... H_{T-1}, the definition when R > 1 reflections per token make H_t
    non-symmetric), the cache of `path_attn_prefill`. Arguments as `path_attn`; the
    backend must provide the keys (`pathattn.ops.backends`: "cpu" and "torch" do; "auto"
    picks one that does).

    Returns o [B, T, HQ, Dv] in q's dtype and keys [B, T, H, D] in the compute dtype
    (float32, or float64 for float64 inputs).
    """
    check_path_attn_inputs(q, k, v, w, beta, g, scale, cu_seqlens)
    w, beta = single_reflection(w, beta)  # R = 1 runs as w [B, T, H, D]
    impl = keys_backend(backend, q, reflections=num_reflections(w))
    check_block_size(block_size)
    B, T, HQ, D = q.shape
    if B * T == 0:
        return (q.new_zeros(B, T, HQ, v.shape[-1]),
                k.new_zeros(B, T, k.shape[2], D, dtype=compute_dtype(q.dtype)))
    clean, bad = isolate_nonfinite(q, k, v, w, beta, g, cu_seqlens)
    with torch.autocast(q.device.type, enabled=False):
        o, keys = impl.with_keys(*clean, default_scale(D, scale), cu_seqlens, block_size)
    if bad is None:
        return o, keys
    return poison_rows(o, bad), poison_keys(keys, k, v, w, beta, cu_seqlens)


def keys_backend(backend: str, q: torch.Tensor, what: str = "path_attn_with_keys",
                 reflections: int = 1) -> Backend:
    """The blockwise backend of `path_attn_with_keys` (and of context parallelism, `what`
    names the caller): `backend` when it provides the keys; for "auto" the first of "cpu",
    "torch" that takes q (both take any number of reflections per token)."""
    if backend == "auto":
        cpu = get_backend("cpu")
        return cpu if cpu.refuses(q) is None else get_backend("torch")
    impl = select_backend(backend, q, reflections)
    if impl.with_keys is None:
        raise ValueError(f"backend={backend!r}: {what} runs on the blockwise backends "
                         "'cpu' and 'torch'")
    return impl


def blockwise_layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None,
                     block_size: int | None, kernels: bool = False,
                     kv_heads: int | None = None) -> BlockLayout:
    """The block layout of the blockwise backends for q [B, T, HQ, ...] (B * T > 0): blocks
    of `block_size` tokens, fewer when every sequence is shorter (`default_block_size`).
    Without `block_size`: DEFAULT_BLOCK_SIZE, or, where the fused CPU kernels run
    (kernels=True and q on the CPU), `pathattn.ops.cpu.kernel_block_size` of the longest
    sequence and HQ / kv_heads query heads per key head (kv_heads: HQ when not given)."""
    B, T = q.shape[:2]
    largest = block_size or DEFAULT_BLOCK_SIZE
    if block_size is None and kernels and q.device.type == "cpu":
        from .cpu import kernel_block_size

        q_per_kv = q.shape[2] // kv_heads if kv_heads else 1
        largest = kernel_block_size(longest_sequence(T, cu_seqlens), q_per_kv)
    C = default_block_size(T, cu_seqlens, largest)
    return make_layout(B, T, C, cu_seqlens, q.device)


def longest_sequence(T: int, cu_seqlens: torch.Tensor | None = None) -> int:
    """Tokens in the longest sequence: T, or the largest gap of cu_seqlens."""
    if cu_seqlens is None or cu_seqlens.numel() < 2:
        return T
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())


def default_block_size(T: int, cu_seqlens: torch.Tensor | None = None,
                       largest: int = DEFAULT_BLOCK_SIZE) -> int:
    """`largest` (DEFAULT_BLOCK_SIZE), or less for short sequences: the longest sequence
    rounded up to a multiple of 16 (every sequence is padded to whole blocks, so a 10-token
    sequence in a 128-token block would cost 12x its work)."""
    longest = longest_sequence(T, cu_seqlens)
    return min(largest, max(16, -(-longest // 16) * 16))
