// Fused CPU forward scan of blockwise PaTH attention (see pathattn/ops/blockwise.py).
//
// One task per (query block a, KV head h), in scan order (longest chain first), handed out
// from an atomic counter so that the long chains of a packed or long batch do not pile up
// on one thread. A task keeps its tiles in cache: the query state [R, D], one logit tile
// [R, C] and the accumulator [R, Dv], and walks its sequence's key blocks right to left:
//
//   diagonal:  S = s_diag[a] (+ gl_i - gl_j), masked j <= i % C; online softmax initialised.
//   b = pred[a], pred[pred[a]], ...:
//       S      = state @ K~_b^T            (- gl_b[j] + G_i - ref_b with gates)
//       m, den, acc <- online softmax update with S, acc += P @ V_b
//       state  = state @ Pt_b              (only while b has a predecessor)
//
// Outputs o = acc / den [NB, H, R, Dv] and lse = m + log(den) [NB, H, R]: the same numbers
// as the PyTorch scan, including its exp cutoff (arguments below -64 give exactly 0).

#include "common.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

namespace {

using namespace pathattn_cpu;

template <typename T>
struct Args {
  const T *qt, *kt, *pt, *s_diag, *vb;
  const T* gl;      // [NB, H, Gr, C] G - ref of the block, or nullptr
  const double* G;  // [NB, H, Gr, C] or nullptr
  const int64_t* pred;
  T *o, *lse;
  int64_t NB, H, R, C, D, Dv;
};

template <typename T>
void run_task(const Args<T>& A, int64_t a, int64_t h, std::vector<T>& buf) {
  const int64_t R = A.R, C = A.C, D = A.D, Dv = A.Dv, H = A.H;
  const int64_t Gr = R / C;
  T* S = buf.data();              // [R, C]
  T* st0 = S + R * C;             // [R, D]
  T* st1 = st0 + R * D;           // [R, D]
  T* acc = st1 + R * D;           // [R, Dv]
  T* m = acc + R * Dv;            // [R]
  T* den = m + R;                 // [R]
  const int64_t ah = a * H + h;
  const bool gated = A.G != nullptr;

  // ---- diagonal block: masked in-block logits
  std::memcpy(S, A.s_diag + ah * R * C, sizeof(T) * R * C);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t p = i % C, g = i / C;
    T* row = S + i * C;
    if (gated) {  // as blockwise._diag_logits, operation for operation
      const T* gl = A.gl + (ah * Gr + g) * C;
      for (int64_t j = 0; j <= p; ++j) row[j] = (row[j] + gl[p]) - gl[j];
    }
    for (int64_t j = p + 1; j < C; ++j) row[j] = 0;  // masked: probability 0
    const T mx = row_max(row, static_cast<int>(p + 1));
    for (int64_t j = 0; j <= p; ++j) row[j] -= mx;
    exp_nonpos(row, static_cast<int>(p + 1));
    m[i] = mx;
    den[i] = row_sum(row, static_cast<int>(p + 1));
  }
  gemm_rm<T>(R, Dv, C, S, C, false, A.vb + ah * C * Dv, Dv, false, acc, Dv, false);

  // ---- key blocks to the left, right to left
  const T* state = A.qt + ah * R * D;
  T* next = st0;
  for (int64_t b = A.pred[a]; b >= 0; b = A.pred[b]) {
    const int64_t bh = b * H + h;
    gemm_rm<T>(R, C, D, state, D, false, A.kt + bh * C * D, D, true, S, C, false);
    for (int64_t i = 0; i < R; ++i) {
      T* row = S + i * C;
      // gates as blockwise._cross_logits, operation for operation (the backward recomputes
      // these tiles in PyTorch from lse: the same rounding keeps the two consistent)
      T rt = 0;  // row term G_i - ref_b
      if (gated) {
        const int64_t g = i / C;
        const T* gl = A.gl + (bh * Gr + g) * C;
        for (int64_t j = 0; j < C; ++j) row[j] -= gl[j];
        rt = static_cast<T>(A.G[(ah * Gr + g) * C + i % C] - A.G[(bh * Gr + g) * C]);
      }
      const T m_new = std::max(m[i], row_max(row, static_cast<int>(C)) + rt);
      const T shift = m_new - rt;
      for (int64_t j = 0; j < C; ++j) row[j] -= shift;
      exp_nonpos(row, static_cast<int>(C));
      const T sum = row_sum(row, static_cast<int>(C));
      if (m_new > m[i]) {
        T alpha = m[i] - m_new;
        exp_nonpos(&alpha, 1);
        den[i] *= alpha;
        T* ar = acc + i * Dv;
        for (int64_t e = 0; e < Dv; ++e) ar[e] *= alpha;
        m[i] = m_new;
      }
      den[i] += sum;
    }
    gemm_rm<T>(R, Dv, C, S, C, false, A.vb + bh * C * Dv, Dv, false, acc, Dv, true);
    if (A.pred[b] >= 0) {
      gemm_rm<T>(R, D, D, state, D, false, A.pt + bh * D * D, D, false, next, D, false);
      state = next;
      next = next == st0 ? st1 : st0;
    }
  }

  // ---- normalise
  T* o = A.o + ah * R * Dv;
  T* lse = A.lse + ah * R;
  for (int64_t i = 0; i < R; ++i) {
    const T inv = T(1) / den[i];
    for (int64_t e = 0; e < Dv; ++e) o[i * Dv + e] = acc[i * Dv + e] * inv;
    lse[i] = m[i] + std::log(den[i]);
  }
}

template <typename T>
void run_all(const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
             const at::Tensor& s_diag, const at::Tensor& vb, const int64_t* pred,
             const std::optional<at::Tensor>& gl, const std::optional<at::Tensor>& G,
             at::Tensor& o, at::Tensor& lse) {
  const bool gated = G.has_value();
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), D = qt.size(3);
  const int64_t C = kt.size(2), Dv = vb.size(3);
  Args<T> A;
  A.qt = qt.data_ptr<T>();
  A.kt = kt.data_ptr<T>();
  A.pt = pt.data_ptr<T>();
  A.s_diag = s_diag.data_ptr<T>();
  A.vb = vb.data_ptr<T>();
  A.gl = gated ? gl->data_ptr<T>() : nullptr;
  A.G = gated ? G->data_ptr<double>() : nullptr;
  A.pred = pred;
  A.o = o.data_ptr<T>();
  A.lse = lse.data_ptr<T>();
  A.NB = NB; A.H = H; A.R = R; A.C = C; A.D = D; A.Dv = Dv;
  const int64_t n_tasks = NB * H;
  const int64_t buf_len = R * C + 2 * R * D + R * Dv + 2 * R;
  std::atomic<int64_t> counter{0};
  const int64_t n_workers =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_tasks));
  at::parallel_for(0, n_workers, 1, [&](int64_t, int64_t) {
    std::vector<T> buf(buf_len);
    for (int64_t t = counter++; t < n_tasks; t = counter++) {
      run_task<T>(A, t / H, t % H, buf);
    }
  });
}

// qt [NB, H, R, D]; kt [NB, H, C, D]; pt [NB, H, D, D]; s_diag [NB, H, R, C];
// vb [NB, H, C, Dv]; pred [NB] int64 (row of the previous block of the sequence, or -1);
// gates (both or neither): gl [NB, H, Gr, C] compute dtype and G [NB, H, Gr, C] float64
// (`gates.BlockGates`; ref_b = G[b, ..., 0]).
std::tuple<at::Tensor, at::Tensor> scan_fwd(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& vb, const at::Tensor& pred,
    const std::optional<at::Tensor>& gl, const std::optional<at::Tensor>& G) {
  const auto dt = qt.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, "scan_fwd: float32 or float64 only");
  check_input("scan_fwd", qt, "qt", 4, dt);
  check_input("scan_fwd", kt, "kt", 4, dt);
  check_input("scan_fwd", pt, "pt", 4, dt);
  check_input("scan_fwd", s_diag, "s_diag", 4, dt);
  check_input("scan_fwd", vb, "vb", 4, dt);
  check_input("scan_fwd", pred, "pred", 1, at::kLong);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), D = qt.size(3);
  const int64_t C = kt.size(2), Dv = vb.size(3);
  TORCH_CHECK(kt.sizes() == at::IntArrayRef({NB, H, C, D}), "scan_fwd: kt shape");
  TORCH_CHECK(pt.sizes() == at::IntArrayRef({NB, H, D, D}), "scan_fwd: pt shape");
  TORCH_CHECK(s_diag.sizes() == at::IntArrayRef({NB, H, R, C}), "scan_fwd: s_diag shape");
  TORCH_CHECK(vb.sizes() == at::IntArrayRef({NB, H, C, Dv}), "scan_fwd: vb shape");
  TORCH_CHECK(R % C == 0 && pred.size(0) == NB, "scan_fwd: R or pred shape");
  TORCH_CHECK(gl.has_value() == G.has_value(), "scan_fwd: gl and G are given together");
  if (G.has_value()) {
    check_input("scan_fwd", *gl, "gl", 4, dt);
    check_input("scan_fwd", *G, "G", 4, at::kDouble);
    TORCH_CHECK(G->sizes() == at::IntArrayRef({NB, H, R / C, C}), "scan_fwd: G shape");
    TORCH_CHECK(gl->sizes() == G->sizes(), "scan_fwd: gl shape");
  }
  auto o = at::empty({NB, H, R, Dv}, qt.options());
  auto lse = at::empty({NB, H, R}, qt.options());
  const int64_t* pr = pred.data_ptr<int64_t>();
  for (int64_t a = 0; a < NB; ++a)
    TORCH_CHECK(pr[a] < NB && pr[a] != a, "scan_fwd: pred[", a, "] out of range");
  if (dt == at::kFloat) {
    run_all<float>(qt, kt, pt, s_diag, vb, pr, gl, G, o, lse);
  } else {
    run_all<double>(qt, kt, pt, s_diag, vb, pr, gl, G, o, lse);
  }
  return {o, lse};
}

}  // namespace

TORCH_LIBRARY(pathattn_cpu, m) {
  m.def("scan_fwd(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor vb, Tensor pred, "
        "Tensor? gl, Tensor? G) -> (Tensor, Tensor)");
  m.impl("scan_fwd", c10::DispatchKey::CPU, TORCH_FN(scan_fwd));
}
