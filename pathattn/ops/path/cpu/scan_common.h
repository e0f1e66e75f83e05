// Shared pieces of the fused forward and backward scans (scan_fwd.cpp, scan_bwd.cpp): their
// common inputs, one check of them, and the gate terms of a logit row.
#pragma once

#include "common.h"
#include "rows.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstring>
#include <optional>
#include <vector>

namespace pathattn_cpu {

inline constexpr int64_t kMaxGroup = 8;  // most key blocks per scan step (group steps)

// qt [NB, H, R, D]; kt [NB, H, C, D]; pt [NB, H, D, D]; s_diag [NB, H, R, C];
// values vb [NB, H, C, Dv], or v [N, H, Dv] read in place with block n holding tokens
// [start[n], start[n] + C) (rows.h); pred [NB] int64 (row of the previous block of the
// sequence, or -1); gates: G [NB, H, Gr, C] float64, the per-sequence cumulative log
// forget gates at every slot (`gates.BlockGates`), or none.
template <typename T>
struct ScanInputs {
  const T *qt, *kt, *pt, *s_diag;
  Rows<const T> v;  // the values of block b, head h: v.at(b, h), row stride v.ld()
  const double* G;  // nullptr without gates
  const int64_t* pred;
  int64_t NB, H, R, C, D, Dv;
  int64_t group;  // key blocks per scan step (group steps, below)

  // start: nullptr with block values vb, the blocks' first tokens with token values v
  ScanInputs(const at::Tensor& qt_, const at::Tensor& kt_, const at::Tensor& pt_,
             const at::Tensor& s_diag_, const at::Tensor& v_, const at::Tensor& pred_,
             const std::optional<at::Tensor>& G_, int64_t group_,
             const int64_t* start = nullptr)
      : qt(qt_.data_ptr<T>()), kt(kt_.data_ptr<T>()), pt(pt_.data_ptr<T>()),
        s_diag(s_diag_.data_ptr<T>()),
        v(start ? Rows<const T>(v_, start, kt_.size(2))
                : Rows<const T>(v_.data_ptr<T>(), qt_.size(1), kt_.size(2), v_.size(3))),
        G(G_.has_value() ? G_->data_ptr<double>() : nullptr),
        pred(pred_.data_ptr<int64_t>()), NB(qt_.size(0)), H(qt_.size(1)), R(qt_.size(2)),
        C(kt_.size(2)), D(qt_.size(3)), Dv(v_.size(v_.dim() - 1)), group(group_) {}
};

// The checks of ScanInputs' tensors (op names the kernel in the messages). start: nullptr
// for block values vb [NB, H, C, Dv], else the blocks' first tokens [NB] (int64) of token
// values v [N, H, Dv].
inline void check_scan_inputs(const char* op, const at::Tensor& qt, const at::Tensor& kt,
                              const at::Tensor& pt, const at::Tensor& s_diag,
                              const at::Tensor& vb, const at::Tensor& pred,
                              const std::optional<at::Tensor>& G, int64_t group,
                              const at::Tensor* start = nullptr) {
  const auto dt = qt.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, op, ": float32 or float64 only");
  check_input(op, qt, "qt", 4, dt);
  check_input(op, kt, "kt", 4, dt);
  check_input(op, pt, "pt", 4, dt);
  check_input(op, s_diag, "s_diag", 4, dt);
  check_input(op, pred, "pred", 1, at::kLong);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), D = qt.size(3);
  const int64_t C = kt.size(2);
  TORCH_CHECK(kt.sizes() == at::IntArrayRef({NB, H, C, D}), op, ": kt shape");
  TORCH_CHECK(pt.sizes() == at::IntArrayRef({NB, H, D, D}), op, ": pt shape");
  TORCH_CHECK(s_diag.sizes() == at::IntArrayRef({NB, H, R, C}), op, ": s_diag shape");
  if (start == nullptr) {
    check_input(op, vb, "vb", 4, dt);
    TORCH_CHECK(vb.sizes() == at::IntArrayRef({NB, H, C, vb.size(3)}), op, ": vb shape");
  } else {
    TORCH_CHECK(vb.dim() == 3, op, ": v must be [N, H, Dv], got ", vb.dim(), " dims");
    check_token_input(op, vb, "v", H, vb.size(2), dt);
    check_block_starts(op, *start, NB, C, vb.size(0));
  }
  TORCH_CHECK(R % C == 0 && pred.size(0) == NB, op, ": R or pred shape");
  TORCH_CHECK(group >= 1 && group <= kMaxGroup, op, ": group must be in [1, ", kMaxGroup,
              "], got ", group);
  if (G.has_value()) {
    check_input(op, *G, "G", 4, at::kDouble);
    TORCH_CHECK(G->sizes() == at::IntArrayRef({NB, H, R / C, C}), op, ": G shape");
  }
  const int64_t* pr = pred.data_ptr<int64_t>();
  for (int64_t a = 0; a < NB; ++a)
    TORCH_CHECK(pr[a] < NB && pr[a] != a, op, ": pred[", a, "] out of range");
}

// Gate terms, operation for operation as blockwise._gate_tile: G_i - G_j in double, then
// cast and added to the logit. The backward recomputes the forward's probabilities from
// lse, so both scans must round alike (they share these helpers).
// Diagonal block, row of in-block position p: row[j] += G_b[p] - G_b[j], j <= p.
template <typename T>
inline void diag_gate_row(T* row, const double* G_b, int64_t p) {
  const double Gi = G_b[p];
  for (int64_t j = 0; j <= p; ++j) row[j] += static_cast<T>(Gi - G_b[j]);
}

// The diagonal block's products skip its masked (zero) upper triangle in strips: a
// block's C rows (each of the R / C row groups) in kDiagStrips strips of C / kDiagStrips,
// strip r reading only keys [0, (r + 1) C / kDiagStrips). That does 5/8 of the full tile's
// FLOPs (one strip when C is not a multiple of kDiagStrips or below kDiagStripsFrom).
inline constexpr int64_t kDiagStrips = 4, kDiagStripsFrom = 64;

inline int64_t diag_strips(int64_t C) {
  return C >= kDiagStripsFrom && C % kDiagStrips == 0 ? kDiagStrips : 1;
}

// out [R, N] (=, or += when accumulate) P [R, C] @ B [C, N] (row stride ldb), P zero
// above each row group's diagonal (row i of a group reads keys j <= i).
template <typename T>
void diag_rows_times(int64_t R, int64_t C, int64_t N, const T* P, const T* B, int64_t ldb,
                     T* out, bool accumulate) {
  const int64_t ns = diag_strips(C), cs = C / ns;
  for (int64_t g = 0; g < R / C; ++g)
    for (int64_t r = 0; r < ns; ++r) {
      const int64_t row = g * C + r * cs;
      gemm_rm<T>(cs, N, (r + 1) * cs, P + row * C, C, false, B, ldb, false, out + row * N, N,
                 accumulate);
    }
}

// out [C, N] (row stride ldo) += P^T @ X, P [R, C] as above, X [R, N]: key j collects
// rows i >= j.
template <typename T>
void diag_keys_times(int64_t R, int64_t C, int64_t N, const T* P, const T* X, T* out,
                     int64_t ldo) {
  const int64_t ns = diag_strips(C), cs = C / ns;
  for (int64_t g = 0; g < R / C; ++g)
    for (int64_t r = 0; r < ns; ++r) {
      const int64_t row = g * C + r * cs;  // first row that reads key strip r
      gemm_rm<T>(cs, N, C - r * cs, P + row * C + r * cs, C, true, X + row * N, N, false,
                 out + r * cs * ldo, ldo, true);
    }
}

// dP [R, C] = X [R, N] @ B [C, N]^T (B's row stride ldb) on each row's keys j <= i's
// strip, zero beyond it.
template <typename T>
void diag_rows_times_t(int64_t R, int64_t C, int64_t N, const T* X, const T* B,
                       int64_t ldb, T* dP) {
  const int64_t ns = diag_strips(C), cs = C / ns;
  for (int64_t g = 0; g < R / C; ++g)
    for (int64_t r = 0; r < ns; ++r) {
      const int64_t row = g * C + r * cs, w = (r + 1) * cs;
      gemm_rm<T>(cs, w, N, X + row * N, N, false, B, ldb, true, dP + row * C, C, false);
      for (int64_t i = row; i < row + cs; ++i) std::fill(dP + i * C + w, dP + (i + 1) * C, T(0));
    }
}

// Key block b of C keys: row[j] += G_i - G_b[j].
template <typename T>
inline void cross_gate_row(T* row, const double* G_b, int64_t C, double G_i) {
  for (int64_t j = 0; j < C; ++j) row[j] += static_cast<T>(G_i - G_b[j]);
}

// Group steps. Both scans walk a query block's key blocks `group` (g) at a time: the step at
// key block b reads the keys of b and of the g - 1 blocks before it in its sequence (fewer
// at the sequence's start), each already moved past the transitions of the blocks after
// it in the group, and then moves the query state past all g transitions with one [D, D]
// product. A key block costs a query block 2 C^2 D + C D^2 FLOPs forward (logits, P V,
// state update) and 5 C^2 D + 3 C D^2 backward; group steps divide the C D^2 terms, the
// state updates, by g. With step blocks x_0 = b, x_{k+1} = pred[x_k] (k < n <= g) and the
// products M_1 = Pt_b, M_{k+1} = M_k Pt_{x_k}, the group tiles are computed once per key
// block, not per query block:
//   kk[b][k] = K~_{x_k} M_k^T   [NB, H, g, C, D]   (kk[b][0] = K~_b; slots k >= n unset)
//   pg[b]    = M_n              [NB, H, D, D]      (only where a block precedes x_{n-1})
// since state_b K~_x^T after the update state_b M_k is state_b (K~_x M_k^T)^T. A step's
// logit tile is [R, n C]: the keys of x_0, ..., x_{n-1}, one GEMM. n < g only at a
// sequence's start, where the chain ends and no update follows.
struct GroupTiles {
  at::Tensor kk, pg;
};

// The blocks of the step at b: x[0] = b, x[k + 1] = pred[x[k]], at most g. Returns n.
template <typename T>
inline int64_t step_blocks(const ScanInputs<T>& A, int64_t b, int64_t* x) {
  int64_t n = 0;
  for (int64_t y = b; y >= 0 && n < A.group; y = A.pred[y]) x[n++] = y;
  return n;
}

// The products M_1 = Pt_{x_0}, M_{k+1} = M_k Pt_{x_k} of a step's blocks x (head h) for
// k + 1 <= last, into Ms [last + 1, D, D] at index k (index 0 unused). group_tiles and the
// backward's group_grads both form them here, so that they round alike.
template <typename T>
void step_products(const ScanInputs<T>& A, const int64_t* x, int64_t h, int64_t last,
                   T* Ms) {
  const int64_t H = A.H, D = A.D;
  if (last < 1) return;
  std::memcpy(Ms + D * D, A.pt + (x[0] * H + h) * D * D, sizeof(T) * D * D);
  for (int64_t k = 1; k < last; ++k)
    gemm_rm<T>(D, D, D, Ms + k * D * D, D, false, A.pt + (x[k] * H + h) * D * D, D, false,
               Ms + (k + 1) * D * D, D, false);
}

template <typename T>
GroupTiles group_tiles(const ScanInputs<T>& A, const at::TensorOptions& opt) {
  const int64_t NB = A.NB, H = A.H, C = A.C, D = A.D, g = A.group;
  GroupTiles P{workspace_empty({NB, H, g, C, D}, opt), workspace_empty({NB, H, D, D}, opt)};
  T* kk = P.kk.data_ptr<T>();
  T* pg = P.pg.data_ptr<T>();
  at::parallel_for(0, NB * H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> Ms((g + 1) * D * D);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / H, h = t % H;
      int64_t x[kMaxGroup];
      const int64_t n = step_blocks(A, b, x);
      const bool follows = A.pred[x[n - 1]] >= 0;
      step_products(A, x, h, follows ? n : n - 1, Ms.data());
      T* kkb = kk + t * g * C * D;
      std::memcpy(kkb, A.kt + t * C * D, sizeof(T) * C * D);
      for (int64_t k = 1; k < n; ++k)
        gemm_rm<T>(C, D, D, A.kt + (x[k] * H + h) * C * D, D, false, Ms.data() + k * D * D,
                   D, true, kkb + k * C * D, D, false);
      if (follows) std::memcpy(pg + t * D * D, Ms.data() + n * D * D, sizeof(T) * D * D);
    }
  });
  return P;
}

// Where the step after the one at b starts: the block before b's group, or -1.
template <typename T>
inline int64_t next_step(const ScanInputs<T>& A, int64_t b) {
  int64_t y = b;
  for (int64_t k = 0; k < A.group && y >= 0; ++k) y = A.pred[y];
  return y;
}

// Logits of the step at key block b (blocks x[0..n), step_blocks) for query block a (head
// h): S [R, W] (row stride W = n C) = state [R, D] @ kk[b][:n]^T, plus G_i - G_j with
// gates. One code for both scans, so that the backward recomputes the forward's tile bit
// for bit. Returns W.
template <typename T>
int64_t step_logits(const ScanInputs<T>& A, const T* kk, const T* state, int64_t a,
                    int64_t h, const int64_t* x, int64_t n, T* S) {
  const int64_t R = A.R, C = A.C, D = A.D, H = A.H, Gr = R / C, W = n * C;
  gemm_rm<T>(R, W, D, state, D, false, kk + (x[0] * H + h) * A.group * C * D, D, true, S,
             W, false);
  if (A.G == nullptr) return W;
  const int64_t ah = a * H + h;
  for (int64_t i = 0; i < R; ++i) {
    const int64_t gi = i / C;
    const double Gi = A.G[(ah * Gr + gi) * C + i % C];
    for (int64_t k = 0; k < n; ++k)
      cross_gate_row(S + i * W + k * C, A.G + ((x[k] * H + h) * Gr + gi) * C, C, Gi);
  }
  return W;
}

}  // namespace pathattn_cpu
