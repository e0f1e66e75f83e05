// Shared pieces of the fused forward and backward scans (scan_fwd.cpp, scan_bwd.cpp): their
// common inputs, one check of them, and the gate terms of a logit row.
#pragma once

#include "common.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <optional>

namespace pathattn_cpu {

// qt [NB, H, R, D]; kt [NB, H, C, D]; pt [NB, H, D, D]; s_diag [NB, H, R, C];
// vb [NB, H, C, Dv]; pred [NB] int64 (row of the previous block of the sequence, or -1);
// gates: G [NB, H, Gr, C] float64, the per-sequence cumulative log forget gates at every
// slot (`gates.BlockGates`), or none.
template <typename T>
struct ScanInputs {
  const T *qt, *kt, *pt, *s_diag, *vb;
  const double* G;  // nullptr without gates
  const int64_t* pred;
  int64_t NB, H, R, C, D, Dv;

  ScanInputs(const at::Tensor& qt_, const at::Tensor& kt_, const at::Tensor& pt_,
             const at::Tensor& s_diag_, const at::Tensor& vb_, const at::Tensor& pred_,
             const std::optional<at::Tensor>& G_)
      : qt(qt_.data_ptr<T>()), kt(kt_.data_ptr<T>()), pt(pt_.data_ptr<T>()),
        s_diag(s_diag_.data_ptr<T>()), vb(vb_.data_ptr<T>()),
        G(G_.has_value() ? G_->data_ptr<double>() : nullptr),
        pred(pred_.data_ptr<int64_t>()), NB(qt_.size(0)), H(qt_.size(1)), R(qt_.size(2)),
        C(kt_.size(2)), D(qt_.size(3)), Dv(vb_.size(3)) {}
};

// The checks of ScanInputs' tensors (op names the kernel in the messages).
inline void check_scan_inputs(const char* op, const at::Tensor& qt, const at::Tensor& kt,
                              const at::Tensor& pt, const at::Tensor& s_diag,
                              const at::Tensor& vb, const at::Tensor& pred,
                              const std::optional<at::Tensor>& G) {
  const auto dt = qt.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, op, ": float32 or float64 only");
  check_input(op, qt, "qt", 4, dt);
  check_input(op, kt, "kt", 4, dt);
  check_input(op, pt, "pt", 4, dt);
  check_input(op, s_diag, "s_diag", 4, dt);
  check_input(op, vb, "vb", 4, dt);
  check_input(op, pred, "pred", 1, at::kLong);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), D = qt.size(3);
  const int64_t C = kt.size(2), Dv = vb.size(3);
  TORCH_CHECK(kt.sizes() == at::IntArrayRef({NB, H, C, D}), op, ": kt shape");
  TORCH_CHECK(pt.sizes() == at::IntArrayRef({NB, H, D, D}), op, ": pt shape");
  TORCH_CHECK(s_diag.sizes() == at::IntArrayRef({NB, H, R, C}), op, ": s_diag shape");
  TORCH_CHECK(vb.sizes() == at::IntArrayRef({NB, H, C, Dv}), op, ": vb shape");
  TORCH_CHECK(R % C == 0 && pred.size(0) == NB, op, ": R or pred shape");
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

// Key block b of C keys: row[j] += G_i - G_b[j].
template <typename T>
inline void cross_gate_row(T* row, const double* G_b, int64_t C, double G_i) {
  for (int64_t j = 0; j < C; ++j) row[j] += static_cast<T>(G_i - G_b[j]);
}

// Pair steps. Both scans walk a query block's key blocks two at a time: the step at key
// block b with predecessor p = pred[b] reads the keys of both, p's already moved past b's
// transition, and moves the query state past both transitions with one [D, D] product.
// A key block costs a query block 2 C^2 D + C D^2 FLOPs forward (logits, P V, state
// update) and 5 C^2 D + 3 C D^2 backward; pair steps halve the C D^2 terms, the state
// updates. The pair tiles are computed once per key block, not per pair of blocks:
//   kp[b] = K~_p Pt_b^T   [NB, H, C, D]
//   pp[b] = Pt_b Pt_p     [NB, H, D, D]      (both only where p >= 0; other rows unset)
// since state_b K~_p^T after the update state_b Pt_b is state_b (K~_p Pt_b^T)^T. A step's
// logit tile is [R, 2C]: keys of b (K~_b), then of p (kp[b]). A step at a block without
// predecessor reads C keys and ends the chain (no update follows it).
struct PairTiles {
  at::Tensor kp, pp;
};

template <typename T>
PairTiles pair_tiles(const ScanInputs<T>& A, const at::TensorOptions& opt) {
  const int64_t NB = A.NB, H = A.H, C = A.C, D = A.D;
  PairTiles P{workspace_empty({NB, H, C, D}, opt), workspace_empty({NB, H, D, D}, opt)};
  T* kp = P.kp.data_ptr<T>();
  T* pp = P.pp.data_ptr<T>();
  at::parallel_for(0, NB * H, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / H, h = t % H, p = A.pred[b];
      if (p < 0) continue;
      const int64_t ph = p * H + h;
      const T* ptb = A.pt + t * D * D;
      gemm_rm<T>(C, D, D, A.kt + ph * C * D, D, false, ptb, D, true, kp + t * C * D, D,
                 false);
      gemm_rm<T>(D, D, D, ptb, D, false, A.pt + ph * D * D, D, false, pp + t * D * D, D,
                 false);
    }
  });
  return P;
}

// Keys a step at key block b reads: 2C with a predecessor, else C.
template <typename T>
inline int64_t step_width(const ScanInputs<T>& A, int64_t b) {
  return A.pred[b] >= 0 ? 2 * A.C : A.C;
}

// Where the step after the one at b starts: the block before b's pair, or -1.
template <typename T>
inline int64_t next_step(const ScanInputs<T>& A, int64_t b) {
  const int64_t p = A.pred[b];
  return p >= 0 ? A.pred[p] : -1;
}

// Logits of the step at key block b for query block a (head h): S [R, W] (row stride W,
// W = step_width) = state [R, D] @ [K~_b ; kp_b]^T, plus G_i - G_j with gates. One code
// for both scans, so that the backward recomputes the forward's tile bit for bit.
template <typename T>
int64_t step_logits(const ScanInputs<T>& A, const T* kp, const T* state, int64_t a,
                    int64_t b, int64_t h, T* S) {
  const int64_t R = A.R, C = A.C, D = A.D, H = A.H, Gr = R / C;
  const int64_t bh = b * H + h, p = A.pred[b], W = step_width(A, b);
  gemm_rm<T>(R, C, D, state, D, false, A.kt + bh * C * D, D, true, S, W, false);
  if (p >= 0) gemm_rm<T>(R, C, D, state, D, false, kp + bh * C * D, D, true, S + C, W, false);
  if (A.G == nullptr) return W;
  const int64_t ah = a * H + h, ph = p * H + h;
  for (int64_t i = 0; i < R; ++i) {
    const int64_t g = i / C;
    const double Gi = A.G[(ah * Gr + g) * C + i % C];
    cross_gate_row(S + i * W, A.G + (bh * Gr + g) * C, C, Gi);
    if (p >= 0) cross_gate_row(S + i * W + C, A.G + (ph * Gr + g) * C, C, Gi);
  }
  return W;
}

}  // namespace pathattn_cpu
