// Fused CPU forward scan of blockwise PaTH attention (see pathattn/ops/blockwise.py).
//
// One task per (query block a, KV head h), in scan order (longest chain first), handed out
// from an atomic counter so that the long chains of a packed or long batch do not pile up
// on one thread. A task keeps its tiles in cache: the query state [R, D], one logit tile
// [R, g C] and the accumulator [R, Dv], and walks its sequence's key blocks right to left,
// g = group at a time (group steps, scan_common.h):
//
//   diagonal:  S = s_diag[a] (+ G_i - G_j), masked j <= i % C; online softmax initialised.
//   b = pred[a], then the block g before b, ... (x_0 = b, x_1, ..., x_{n-1}: step_blocks):
//       S      = state @ kk[b][:n]^T          [R, n C]: keys of x_0, then of x_1, ...
//                                          (+ G_i - G_j with gates)
//       m, den, acc <- online softmax update with S, acc += P @ [V_x0 ; ... ; V_x(n-1)]
//       state  = state @ pg[b]              (only while a block precedes x_{n-1})
//
// Outputs o = acc / den [NB, H, R, Dv] and lse = m + log(den) [NB, H, R]: the numbers of
// the PyTorch scan up to rounding, with its exp cutoff (arguments below -64 give exactly 0).
// scan_fwd_tokens reads the values from, and writes o and lse to, token tensors (rows.h).

#include "scan_common.h"

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
struct Args : ScanInputs<T> {
  // outputs: o [NB, H, R, Dv] and lse [NB, H, R] as rows of the H Gr query heads, or token
  // tensors o [N, H Gr, Dv] and lse [N, H Gr] (rows.h)
  Rows<T> o, lse;
  Args(const ScanInputs<T>& in, Rows<T> o_, Rows<T> lse_)
      : ScanInputs<T>(in), o(o_), lse(lse_) {}
};

template <typename T>
void run_task(const Args<T>& A, const T* kk, const T* pg, int64_t a, int64_t h,
              std::vector<T>& buf) {
  const int64_t R = A.R, C = A.C, D = A.D, Dv = A.Dv, H = A.H;
  const int64_t Gr = R / C;
  T* S = buf.data();              // [R, g C]
  T* st0 = S + R * A.group * C;   // [R, D]
  T* st1 = st0 + R * D;           // [R, D]
  T* acc = st1 + R * D;           // [R, Dv]
  T* m = acc + R * Dv;            // [R]
  T* den = m + R;                 // [R]
  T* sum = den + R;               // [R]: a step's row sums
  T* alpha = sum + R;             // [R]: a step's rescalings exp(m_old - m_new)
  const int64_t ah = a * H + h;
  const bool gated = A.G != nullptr;

  // ---- diagonal block: masked in-block logits
  std::memcpy(S, A.s_diag + ah * R * C, sizeof(T) * R * C);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t p = i % C, g = i / C;
    T* row = S + i * C;
    if (gated) diag_gate_row(row, A.G + (ah * Gr + g) * C, p);
    for (int64_t j = p + 1; j < C; ++j) row[j] = 0;  // masked: probability 0
    const T mx = row_max(row, static_cast<int>(p + 1));
    m[i] = mx;
    den[i] = exp_shifted_sum(row, static_cast<int>(p + 1), mx);
  }
  diag_rows_times<T>(R, C, Dv, S, A.v.at(a, h), A.v.ld(), acc, false);

  // ---- key blocks to the left, right to left, a group per step
  const T* state = A.qt + ah * R * D;
  T* next = st0;
  for (int64_t b = A.pred[a]; b >= 0;) {
    int64_t x[kMaxGroup];
    const int64_t n = step_blocks(A, b, x);
    const int64_t W = step_logits(A, kk, state, a, h, x, n, S);
    for (int64_t i = 0; i < R; ++i) {
      T* row = S + i * W;
      const T m_new = std::max(m[i], row_max(row, static_cast<int>(W)));
      sum[i] = exp_shifted_sum(row, static_cast<int>(W), m_new);
      alpha[i] = m[i] - m_new;
      m[i] = m_new;
    }
    exp_nonpos(alpha, static_cast<int>(R));  // all rows' rescalings in one vector pass
    for (int64_t i = 0; i < R; ++i) {
      if (alpha[i] != T(1)) {  // the row's max moved (exp(0) is exactly 1)
        den[i] *= alpha[i];
        T* ar = acc + i * Dv;
        for (int64_t e = 0; e < Dv; ++e) ar[e] *= alpha[i];
      }
      den[i] += sum[i];
    }
    for (int64_t k = 0; k < n; ++k)
      gemm_rm<T>(R, Dv, C, S + k * C, W, false, A.v.at(x[k], h), A.v.ld(), false, acc, Dv,
                 true);
    const int64_t after = A.pred[x[n - 1]];  // where the next step starts
    if (after < 0) break;
    gemm_rm<T>(R, D, D, state, D, false, pg + (b * H + h) * D * D, D, false, next, D, false);
    state = next;
    next = next == st0 ? st1 : st0;
    b = after;
  }

  // ---- normalise: row i is position i % C of query head h Gr + i / C
  for (int64_t i = 0; i < R; ++i) {
    const int64_t head = h * Gr + i / C, p = i % C;
    T* o = A.o.at(a, head) + p * A.o.ld();
    const T inv = T(1) / den[i];
    for (int64_t e = 0; e < Dv; ++e) o[e] = acc[i * Dv + e] * inv;
    A.lse.at(a, head)[p * A.lse.ld()] = m[i] + std::log(den[i]);
  }
}

template <typename T>
void run_all(const Args<T>& A, const at::TensorOptions& opt) {
  const int64_t NB = A.NB, H = A.H, R = A.R, C = A.C, D = A.D, Dv = A.Dv;
  const int64_t n_tasks = NB * H;
  const int64_t buf_len = R * A.group * C + 2 * R * D + R * Dv + 4 * R;
  const GroupTiles P = group_tiles(A, opt);
  const T* kk = P.kk.data_ptr<T>();
  const T* pg = P.pg.data_ptr<T>();
  std::atomic<int64_t> counter{0};
  const int64_t n_workers =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_tasks));
  at::parallel_for(0, n_workers, 1, [&](int64_t, int64_t) {
    std::vector<T> buf(buf_len);
    for (int64_t t = counter++; t < n_tasks; t = counter++) {
      run_task<T>(A, kk, pg, t / H, t % H, buf);
    }
  });
}

// Inputs as ScanInputs (scan_common.h), group: key blocks per step. Returns
// o [NB, H, R, Dv] and lse [NB, H, R].
std::tuple<at::Tensor, at::Tensor> scan_fwd(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& vb, const at::Tensor& pred,
    const std::optional<at::Tensor>& G, int64_t group) {
  const FlopScope flops(kScanFwd);
  check_scan_inputs("scan_fwd", qt, kt, pt, s_diag, vb, pred, G, group);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), Dv = vb.size(3);
  const int64_t C = kt.size(2), HQ = H * (R / C);
  auto o = workspace_empty({NB, H, R, Dv}, qt.options());
  auto lse = workspace_empty({NB, H, R}, qt.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    run_all<T>(Args<T>(ScanInputs<T>(qt, kt, pt, s_diag, vb, pred, G, group),
                       Rows<T>(o.data_ptr<T>(), HQ, C, Dv), Rows<T>(lse.data_ptr<T>(), HQ, C, 1)),
               qt.options());
  };
  dispatch_float(qt.scalar_type(), run);
  return {o, lse};
}

// scan_fwd reading the values from token tensors, v [N, H, Dv] (unit stride along Dv), and
// writing token tensors o [N, H Gr, Dv] and lse [N, H Gr]: block n holds tokens [start[n],
// start[n] + C) (start [NB] int64; rows.h). Tokens no block holds are left unset.
std::tuple<at::Tensor, at::Tensor> scan_fwd_tokens(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& v, const at::Tensor& start,
    const at::Tensor& pred, const std::optional<at::Tensor>& G, int64_t group) {
  const FlopScope flops(kScanFwd);
  check_scan_inputs("scan_fwd_tokens", qt, kt, pt, s_diag, v, pred, G, group, &start);
  const int64_t H = qt.size(1), R = qt.size(2), C = kt.size(2);
  const int64_t N = v.size(0), Dv = v.size(2), HQ = H * (R / C);
  auto o = workspace_empty({N, HQ, Dv}, qt.options());
  auto lse = workspace_empty({N, HQ}, qt.options());
  const int64_t* st = start.data_ptr<int64_t>();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    run_all<T>(Args<T>(ScanInputs<T>(qt, kt, pt, s_diag, v, pred, G, group, st),
                       Rows<T>(o.data_ptr<T>(), st, HQ, C, Dv, HQ * Dv, Dv),
                       Rows<T>(lse.data_ptr<T>(), st, HQ, C, 1, HQ, 1)),
               qt.options());
  };
  dispatch_float(qt.scalar_type(), run);
  return {o, lse};
}

}  // namespace

TORCH_LIBRARY(pathattn_cpu, m) {
  m.def("scan_fwd(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor vb, Tensor pred, "
        "Tensor? G, int group=4) -> (Tensor, Tensor)");
  m.impl("scan_fwd", c10::DispatchKey::CPU, TORCH_FN(scan_fwd));
  m.def("scan_fwd_tokens(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor v, "
        "Tensor start, Tensor pred, Tensor? G, int group=4) -> (Tensor, Tensor)");
  m.impl("scan_fwd_tokens", c10::DispatchKey::CPU, TORCH_FN(scan_fwd_tokens));
}
