"""KV cache of PaTH attention inference with in-place Householder key updates (section 3.4).

After a prefix of length T a key is cached as k_j^(T) = H_{T-1} ... H_{j+1} k_j (row form
k_j^T H_{j+1} ... H_{T-1}, the definition with R > 1 reflections per token), so a query
i >= T sees the cache through q~_i = H_T ... H_i q_i as plain attention. The latest tokens
stay in a pending window committed by one GEMM every `max_pending_tokens` tokens; keys and
values are stored in the compute dtype, gate sums in float64. Masked tokens (left padding
or zeros anywhere in the attention mask) are positions that are no key and transform
nothing (`key_mask`). With `history`, the raw per-token inputs of every position are kept
as well, so that `truncate` can go back to any length and `history_inputs` can feed the
reference (attention probabilities). The window, truncation, storage and torch.compile:
docs/ops.md, "Inference: the key cache".
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from ..common.validation import batch_index
from .stages import chain_suffix_products
from .ut import block_ut

__all__ = ["PaTHCache", "Transition", "History", "key_transforms"]

KEY_BLOCK = 64  # block length of `key_transforms` (one UT sub-block, no merging)
COMMIT_ROWS = 4096  # rows per GEMM when committing (eager): bounds the temporary


class Transition(NamedTuple):
    """The transform of a chunk of m consecutive tokens, P = H_first ... H_last.

    w [B, H, m * R, D] and beta [B, H, m * R]: the R reflections of every token in order
    (H_t = H_{t,1} ... H_{t,R}; R = 1: one per token); pt [B, H, D, D] = P^T, or None when
    m == 1 (then P = H_{t,1} ... H_{t,R}, applied as R rank-1 updates).
    """

    w: torch.Tensor
    beta: torch.Tensor
    pt: torch.Tensor | None

    def apply_(self, x: torch.Tensor) -> None:
        """x <- x @ P in place (row form: every row r becomes r^T H_first ... H_last).
        x [B, H, n, D], small (M and the window keys)."""
        if self.pt is None and self.w.shape[2] == 1:
            coef = (x @ self.w.mT).mul_(self.beta[..., None])  # [B, H, n, 1]
            x.addcmul_(coef, self.w, value=-1)
        elif self.pt is None:  # x <- x H_{t,1} ... H_{t,R}: first reflection first
            for r in range(self.w.shape[2]):
                wr = self.w[:, :, r: r + 1]  # [B, H, 1, D]
                coef = (x @ wr.mT).mul_(self.beta[:, :, r: r + 1, None])  # [B, H, n, 1]
                x.addcmul_(coef, wr, value=-1)
        else:
            x.copy_(x @ self.pt.mT)


class History(NamedTuple):
    """Raw per-position inputs kept by a cache with history, head-major in the cache:
    k [B, H, T, D], w [B, H, T, R, D], beta [B, H, T, R] (compute dtype) and g [B, HQ, T]
    float64 or None; zero at masked positions."""

    k: torch.Tensor
    w: torch.Tensor
    beta: torch.Tensor
    g: torch.Tensor | None


def key_transforms(k: torch.Tensor, w: torch.Tensor,
                   beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys transformed by every later token of their sequence, and the total transition.

    k, w [B, H, n, D]; beta [B, H, n]; one dtype; R reflections per token: w
    [B, H, n * R, D] and beta [B, H, n * R], each token's in order. Returns
    (kn [B, H, n, D], M [B, H, D, D]) with kn_j = H_{n-1} ... H_{j+1} k_j (row form
    k_j^T H_{j+1} ... H_{n-1}) and M = H_0 ... H_{n-1} (so x^T M is x^T transformed by
    all n tokens).

    Blockwise (section 3.4): for blocks of C tokens with in-block transformed keys K~_b and
    transitions P_b (`block_ut`), K^(n)_b = K~_b R_b with the suffix products
    R_b = P_{b+1} R_{b+1}, R_last = I: linear in the number of blocks.
    """
    B, H, n, D = k.shape
    eye = torch.eye(D, dtype=k.dtype, device=k.device)
    if n == 0:
        return k.clone(), eye.expand(B, H, D, D).clone()
    R = w.shape[2] // n  # reflections per token
    C = min(KEY_BLOCK, n)
    nb = -(-n // C)
    pad = nb * C - n  # identity tokens (w = 0, beta = 0, k = 0) after the real ones
    if pad:
        k = torch.nn.functional.pad(k, (0, 0, 0, pad))
        w = torch.nn.functional.pad(w, (0, 0, 0, pad * R))
        beta = torch.nn.functional.pad(beta, (0, pad * R))
    kb = k.reshape(B * H * nb, 1, C, D)  # every (row, head, block) is one UT block
    wb = w.reshape(B * H * nb, 1, C * R, D)
    bb = beta.reshape(B * H * nb, 1, C * R)
    qb = kb.new_empty(B * H * nb, 1, 0, C, D)  # no query rows: only K~ and Pt are needed
    ut = block_ut(qb, kb, wb, bb, 1.0)
    pt = ut.pt.view(B, H, nb, D, D)
    R = chain_suffix_products(pt)  # R[b] = P_{b+1} ... P_{nb-1}
    M = pt[:, :, 0].mT @ R[:, :, 0]
    kn = ut.kt.view(B, H, nb, C, D) @ R  # [B, H, nb, C, D]
    return kn.view(B, H, nb * C, D)[:, :, :n], M


def _grown(x: torch.Tensor, rows: int, keep: int) -> torch.Tensor:
    """x [B, H, n, ...] -> [B, H, rows, ...]: its first `keep` rows, zeros after."""
    y = x.new_zeros(x.shape[:2] + (rows,) + x.shape[3:])
    y[:, :, :keep] = x[:, :, :keep]
    return y


def _initial_capacity(T: int) -> int:
    return max(64, T + max(64, T // 8))


class PaTHCache:
    """KV cache of `path_attn_prefill` / `path_attn_step` (see the module docstring).

    Public views (valid part only; keys and values in the compute dtype):
        k [B, T, H, D]   keys k_j^(T), transformed by every later token (reading it commits
                         the pending window, see `commit`)
        v [B, T, H, Dv]  values
        g_cumsum [B, T, HQ] float64 gate cumsums G (None without gates)
        key_mask [B, T]  bool, False at masked tokens (no key, no transform)
        start [B]        first real position of each row (left padding)
    `len(cache)` == `cache.seq_len` == T. `reorder(index)` and `truncate(new_len)` edit it
    in place; `max_pending_tokens` (default 128) is the size of the pending window.
    `has_history`: the raw inputs of every position are kept (`truncate` to any length).
    `step_backends`: the (backend, dtype) pairs `path_attn_step` has checked for this cache,
    so that it checks each once, not at every token. `reflections`: R, the reflections per
    token of the prefill, which every step must use too.
    """

    max_pending_tokens: int = 128

    def __init__(self, k: torch.Tensor, v: torch.Tensor, g_cumsum: torch.Tensor | None,
                 start: torch.Tensor, num_q_heads: int, padded: bool | None = None,
                 reflections: int = 1, key_mask: torch.Tensor | None = None,
                 history: History | None = None):
        """k [B, H, T, D] transformed keys k_j^(T); v [B, H, T, Dv]; g_cumsum [B, HQ, T]
        float64 or None; start [B] int64; num_q_heads HQ; padded: whether some key is
        masked, when the caller knows (None: read from the mask, a host read torch.compile
        cannot trace); reflections: R, the reflections per token of every later step;
        key_mask: bool [B, T] (None: the positions from each row's start); history: the raw
        inputs of the T positions, or None (no history). Built by `path_attn_prefill`."""
        B, H, T, D = k.shape
        self.num_q_heads = num_q_heads
        cap = _initial_capacity(T)
        self._k = k.new_zeros(B, H, cap, D)  # zero from t0 on (see the module docstring)
        self._v = v.new_empty(B, H, cap, v.shape[-1])
        self._k[:, :, :T] = k
        self._v[:, :, :T] = v
        self._g = None
        if g_cumsum is not None:
            self._g = g_cumsum.new_empty(B, num_q_heads, cap)
            self._g[:, :, :T] = g_cumsum
        self._start = start.to(device=k.device, dtype=torch.long)
        self._keep = torch.zeros(B, cap, dtype=torch.bool, device=k.device)  # key mask
        if key_mask is None:
            key_mask = torch.arange(T, device=k.device)[None, :] >= self._start[:, None]
        self._keep[:, :T] = key_mask
        self._padded = bool((~key_mask).any()) if padded is None else padded
        self._len = self._t0 = T
        self._hist = None if history is None else History(
            *(None if x is None else _grown(x, cap, T) for x in history))
        self._eye = torch.eye(D, dtype=k.dtype, device=k.device)
        self.reflections = reflections
        # [M ; window keys], and the raw k, w, beta of the window tokens (for `truncate`):
        # buffers, not a list, so that a compiled step sees the same Python state each token
        self._win = k.new_empty(B, H, D + self.max_pending_tokens + 1, D)
        self._win[:, :, :D] = self._eye
        self._raw_k, self._raw_w, self._raw_b = self._raw_buffers(self.max_pending_tokens + 1)
        self.step_backends: set[tuple[str, torch.dtype]] = set()  # checked by path_attn_step
        self.num_grows = 0  # reallocations of the buffers (each doubles the capacity)

    # ------------------------------------------------------------------ views and sizes

    def __len__(self) -> int:
        return self._len

    @property
    def seq_len(self) -> int:
        return self._len

    @property
    def capacity(self) -> int:
        return self._k.shape[2]

    @property
    def batch_size(self) -> int:
        return self._k.shape[0]

    @property
    def num_heads(self) -> int:
        return self._k.shape[1]

    @property
    def head_dim(self) -> int:
        return self._k.shape[3]

    @property
    def value_dim(self) -> int:
        return self._v.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        """Storage (compute) dtype of keys and values."""
        return self._k.dtype

    @property
    def device(self) -> torch.device:
        return self._k.device

    @property
    def has_gates(self) -> bool:
        return self._g is not None

    @property
    def padded(self) -> bool:
        """True when some position is masked (left padding or a masked token)."""
        return self._padded

    @property
    def key_mask(self) -> torch.Tensor:
        """[B, T] bool (a view): False at masked positions (no key, no transform)."""
        return self._keep[:, : self._len]

    @property
    def has_history(self) -> bool:
        """Whether the raw inputs of every position are kept (`truncate` to any length)."""
        return self._hist is not None

    @property
    def start(self) -> torch.Tensor:
        """[B] int64 first real (non-padding) position of every row."""
        return self._start

    @property
    def committed_len(self) -> int:
        """t0: keys before it are stored as k_j^(t0); the window [t0, T) is pending."""
        return self._t0

    @property
    def window_len(self) -> int:
        """Number of pending tokens (transforms not yet applied to the committed keys)."""
        return self._len - self._t0

    @property
    def min_len(self) -> int:
        """Smallest length `truncate` accepts: 0 with history, else the start of the
        pending window (at most the start of the last step; the current length once
        everything is committed)."""
        return 0 if self._hist is not None else self._t0

    @property
    def k(self) -> torch.Tensor:
        """[B, T, H, D] keys k_j^(T) (a view). Commits the pending window first."""
        self.commit()
        return self._k[:, :, : self._len].transpose(1, 2)

    @property
    def v(self) -> torch.Tensor:
        """[B, T, H, Dv] values (a view)."""
        return self._v[:, :, : self._len].transpose(1, 2)

    @property
    def g_cumsum(self) -> torch.Tensor | None:
        """[B, T, HQ] float64 cumulative log forget gates G (a view), or None."""
        return None if self._g is None else self._g[:, :, : self._len].transpose(1, 2)

    def history_inputs(self) -> History:
        """The raw inputs of every position, token-major: k [B, T, H, D], w [B, T, H, R, D],
        beta [B, T, H, R] (compute dtype), g [B, T, HQ] float64 or None; zero at masked
        positions. ValueError without history."""
        if self._hist is None:
            raise ValueError("this cache keeps no history of its inputs: build it with "
                             "path_attn_prefill(..., history=True)")
        T = self._len
        return History(*(None if x is None else x[:, :, :T].transpose(1, 2)
                         for x in self._hist))

    # ------------------------------------------------------------------ attention pieces

    def window_rows(self) -> torch.Tensor:
        """[B, H, D + T - t0, D] (a view): the window transition M = H_t0 ... H_{T-1} (row
        form, k_j^(T) = k_j^(t0) @ M), then the window keys k_j^(T), j in [t0, T)."""
        return self._win[:, :, : self.head_dim + self.window_len]

    def keys(self, n: int) -> torch.Tensor:
        """[B, H, n, D] the big key buffer (a view): k_j^(t0) before t0, zero after."""
        return self._k[:, :, :n]

    def values(self, n: int) -> torch.Tensor:
        """[B, H, n, Dv] the first n values (a view)."""
        return self._v[:, :, :n]

    def gate_cumsum(self, n: int) -> torch.Tensor:
        """[B, HQ, n] float64 G of the first n positions (a view; gates only)."""
        return self._g[:, :, :n]

    def last_gate_cumsum(self) -> torch.Tensor:
        """[B, HQ] float64 G at the last position (zeros for an empty cache)."""
        if self._len == 0:
            return self._g.new_zeros(self._g.shape[:2])
        return self._g[:, :, self._len - 1: self._len].squeeze(2)  # a slice: no guard on T

    # ------------------------------------------------------------------ updates

    def reserve(self, n: int) -> None:
        """Make room for n positions; a full buffer grows to max(2 * capacity, n + 1). One
        row is kept spare: the cache's views never span a whole buffer, so a compiled step
        sees one relation between length and capacity (no recompile when they meet)."""
        cap = self.capacity
        if n < cap:
            return
        new_cap, T = max(2 * cap, n + 1), self._len
        self._k, self._v = _grown(self._k, new_cap, T), _grown(self._v, new_cap, T)
        if self._g is not None:
            self._g = _grown(self._g, new_cap, T)
        keep = self._keep.new_zeros(self._keep.shape[0], new_cap)
        keep[:, :T] = self._keep[:, :T]
        self._keep = keep
        if self._hist is not None:
            self._hist = History(*(None if x is None else _grown(x, new_cap, T)
                                   for x in self._hist))
        self.num_grows += 1

    def _raw_buffers(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Empty raw k [B, H, n, D], w [B, H, n * R, D] and beta [B, H, n * R] of n window
        tokens."""
        B, H, _, D = self._win.shape
        R = self.reflections
        return (self._win.new_empty(B, H, n, D), self._win.new_empty(B, H, n * R, D),
                self._win.new_empty(B, H, n * R))

    def _window_room(self, m: int) -> None:
        """Make room in the window buffers for m more tokens (each doubles when full)."""
        n, D = self.window_len, self.head_dim
        if D + n + m < self._win.shape[2]:  # one row spare, as `reserve`
            return
        cap, R = 2 * (n + m), self.reflections
        self._win = _grown(self._win, D + cap, D + n)
        self._raw_k = _grown(self._raw_k, cap, n)
        self._raw_w = _grown(self._raw_w, cap * R, n * R)
        self._raw_b = _grown(self._raw_b, cap * R, n * R)

    def append(self, kt: torch.Tensor, k: torch.Tensor, tr: Transition, v: torch.Tensor,
               g_cumsum: torch.Tensor | None, keep: torch.Tensor | None = None,
               g: torch.Tensor | None = None) -> None:
        """Add a chunk of m tokens (the next step) at positions [T, T + m).

        kt [B, H, m, D] its keys transformed inside the chunk (they join the window);
        k [B, H, m, D] its raw keys; tr its transition (with the raw w, beta);
        v [B, H, m, Dv]; g_cumsum [B, HQ, m] float64 or None; keep: None (every token a
        key) or bool [B, m], False at masked tokens (whose k, w, beta, g are zero); g: the
        raw log gates [B, HQ, m] float64 (kept with history)."""
        T, m, D = self._len, kt.shape[2], self.head_dim
        R = tr.w.shape[2] // m
        if R != self.reflections:
            raise ValueError(
                f"w has {R} reflections per token, but this cache was built for "
                f"{self.reflections}: every step must use the prefill's number of reflections")
        self.reserve(T + m)
        self._v[:, :, T: T + m] = v
        if g_cumsum is not None:
            self._g[:, :, T: T + m] = g_cumsum
        if keep is None:
            self._keep[:, T: T + m].fill_(True)  # a fill on the device, no host scalar
        else:
            self._keep[:, T: T + m] = keep
            self._padded = True
        if self._hist is not None:
            hk, hw, hb, hg = self._hist
            hk[:, :, T: T + m] = k
            hw[:, :, T: T + m] = tr.w.unflatten(2, (m, R))
            hb[:, :, T: T + m] = tr.beta.unflatten(2, (m, R))
            if hg is not None:
                hg[:, :, T: T + m] = g
        self._window_room(m)
        wl = self.window_len
        n = D + wl
        tr.apply_(self._win[:, :, :n])  # M and the window keys, both x <- x @ P
        self._win[:, :, n: n + m] = kt
        self._raw_k[:, :, wl: wl + m] = k
        self._raw_w[:, :, wl * R: (wl + m) * R] = tr.w
        self._raw_b[:, :, wl * R: (wl + m) * R] = tr.beta
        self._len = T + m

    def commit(self) -> None:
        """Apply the pending window's transforms to the committed keys (K <- K @ M) and move
        the window keys to the big buffer. Afterwards `truncate` can no longer go back
        before the current length."""
        T0, T, D = self._t0, self._len, self.head_dim
        if T0 == T:
            return
        if T0 > 0:
            self._commit_rows(T0)
        self._k[:, :, T0:T] = self._win[:, :, D: D + T - T0]
        self._win[:, :, :D] = self._eye
        self._t0 = T

    def _commit_rows(self, T0: int) -> None:
        """K[:T0] <- K[:T0] @ M: a rank-1 update for a one-token window, else a GEMM."""
        B, H, cap, D = self._k.shape
        K = self._k.view(B * H, cap, D)
        if self.window_len == 1:  # M = H_{t,1} ... H_{t,R}, H_{t,r} = I - beta w w^T
            ws, betas = self._raw_w, self._raw_b
            for r in range(self.reflections):
                w = ws[:, :, r].reshape(B * H, 1, D)
                coef = (K[:, :T0] @ w.mT).mul_(-betas[:, :, r].reshape(B * H, 1, 1))
                K[:, :T0].baddbmm_(coef, w)  # coef [BH, T0, 1]
            return
        M = self._win[:, :, :D].reshape(B * H, D, D)
        if torch.compiler.is_compiling():  # one GEMM: a loop over T0 would fix its value
            K[:, :T0] = K[:, :T0] @ M
            return
        for s in range(0, T0, COMMIT_ROWS):
            rows = K[:, s: min(T0, s + COMMIT_ROWS)]
            rows.copy_(rows @ M)

    def truncate(self, new_len: int) -> None:
        """Keep the first new_len positions (drop rejected draft tokens).

        new_len must lie in [min_len, seq_len]: without history back to the start of the
        pending window at most (earlier keys already carry the dropped tokens' transforms,
        which cannot be undone); with history anywhere (the keys are rebuilt from the raw
        inputs, one key-only UT pass over the kept positions).
        """
        if isinstance(new_len, bool) or not isinstance(new_len, numbers.Integral):
            raise ValueError(f"new_len must be an int, got {new_len!r}")
        new_len = int(new_len)
        if not self.min_len <= new_len <= self._len:
            raise ValueError(
                f"new_len={new_len} is out of range: the cache can only be truncated to a "
                f"length in [{self.min_len}, {self._len}], i.e. back to the start of its "
                "pending window at most (keys before it already include the transforms of "
                "every later token, which are not invertible; reading .k or commit() also "
                "fixes the current length); a cache built with history=True can be "
                "truncated to any length")
        if new_len == self._len:
            return
        if new_len < self._t0:
            self._rebuild(new_len)
            return
        n, D, R = new_len - self._t0, self.head_dim, self.reflections
        kn, M = key_transforms(  # window keys and transition, rebuilt from the kept tokens
            self._raw_k[:, :, :n], self._raw_w[:, :, :n * R], self._raw_b[:, :, :n * R])
        self._win[:, :, :D] = M
        self._win[:, :, D: D + n] = kn
        self._len = new_len

    def _rebuild(self, new_len: int) -> None:
        """Keys k_j^(new_len) of the first new_len positions from the history, all committed
        (the window empty)."""
        hk, hw, hb, _ = self._hist
        n, T, D = new_len, self._len, self.head_dim
        kn, _ = key_transforms(hk[:, :, :n], hw[:, :, :n].flatten(2, 3),
                               hb[:, :, :n].flatten(2, 3))
        self._k[:, :, :n] = kn
        self._k[:, :, n:T] = 0  # the big buffer is zero from t0 on
        self._win[:, :, :D] = self._eye
        self._t0 = self._len = n

    def reorder(self, index: torch.Tensor) -> None:
        """Select batch rows: row b becomes old row index[b] (beam search). index [B'] int;
        B' may differ from B."""
        index = batch_index(index, self.batch_size, self.device)
        T = self._len

        def take(x: torch.Tensor) -> torch.Tensor:
            y = x.new_zeros((index.numel(),) + x.shape[1:])
            y[:, :, :T] = x[:, :, :T].index_select(0, index)
            return y

        self._k, self._v = take(self._k), take(self._v)
        if self._g is not None:
            self._g = take(self._g)
        self._win = self._win.index_select(0, index)
        self._raw_k, self._raw_w, self._raw_b = (
            x.index_select(0, index) for x in (self._raw_k, self._raw_w, self._raw_b))
        self._start = self._start.index_select(0, index)
        self._keep = self._keep.index_select(0, index)
        if self._hist is not None:
            self._hist = History(*(None if x is None else take(x) for x in self._hist))
        self._padded = bool((~self._keep[:, :T]).any())
