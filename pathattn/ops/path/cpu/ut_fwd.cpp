// Fused CPU UT transform (forward only): ut.block_ut in C++, for the scans' inputs.
//
// One task per (block n, KV head h). For each sub-block i of c tokens (K, Q [c, D]) with R
// reflections per token (W [c R, D], beta [c R], reflection l = t R + r of token t):
//
//   A   = (I + strictLower(diag(beta) W W^T))^{-1} diag(beta)      (forward substitution)
//   q~_i = Q - incl(Q W^T) A W,   s_i = Q K^T - incl(Q W^T) A later(W K^T)
//   k~_i = K - (A later(W K^T))^T W,   pt_i = I - W^T A W
//
// with the token masks incl[i, l] = (l / R <= i) and later[l, j] = (l / R > j) (tril and
// strictLower for R = 1). Only the sub-block terms depend on R; their outputs do not.
//
// and the m = C / c sub-blocks are combined in pairwise merges (as ut.py, up to rounding):
//
//   Q~ rows of i   = q~_i pt_{i-1} ... pt_0           (state walked right to left)
//   S[i, j < i]    = q~_i pt_{i-1} ... pt_{j+1} k~_j^T, S[i, i] = s_i, S[i, j > i] = 0
//   K~ rows of i   = k~_i pt_{i+1}^T ... pt_{m-1}^T
//   Pt             = pt_{m-1} ... pt_0
//
// Inputs qb [NB, H, Gr, C, D] (unscaled), kb [NB, H, C, D], wb [NB, H, C * R, D],
// bb [NB, H, C * R]; returns
// (qt = scale Q~ [NB, H, Gr*C, D], kt [NB, H, C, D], pt [NB, H, D, D],
//  s_diag = scale S [NB, H, Gr*C, C]) as `ut.BlockUT`.
// ut_fwd_tokens reads the same inputs straight from token tensors (rows.h): q [N, H Gr, D],
// k [N, H, D], w [N, H, R D], beta [N, H, R], block n holding tokens [start[n],
// start[n] + C); each task copies its block's rows in, then runs as ut_fwd (same numbers).

#include "rows.h"
#include "ut_common.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

using namespace pathattn_cpu;

template <typename T>
struct UTArgs {
  Rows<T> q, k, w, b;  // heads H Gr, H, H, H; F = D, D, R D, R
  T *qt, *kt, *pt, *s;
  int64_t H, Gr, C, D, c, R;
  T scale;
};

template <typename T>
struct UTWork {
  std::vector<SubBlockUT<T>> sub;  // [m]
  std::vector<T> R, state, Ps;
  std::vector<T> qin, kin, win, bin;  // a block's token rows, copied in (token inputs)
};

template <typename T>
void ut_task(const UTArgs<T>& U, int64_t n, int64_t h, UTWork<T>& W) {
  const int64_t H = U.H, Gr = U.Gr, C = U.C, D = U.D, c = U.c, m = C / c;
  const int64_t nh = n * H + h, cr = c * U.R;  // cr: reflections of a sub-block
  const T* Wb = U.w.tile(n, h, 1, W.win.data());  // [C * R, D]
  const T* Kb = U.k.tile(n, h, 1, W.kin.data());  // [C, D]
  const T* Bb = U.b.tile(n, h, 1, W.bin.data());  // [C * R]
  const T* Qb = U.q.tile(n, h * Gr, Gr, W.qin.data());  // [Gr, C, D]
  auto qsub = [&](int64_t g, int64_t i) { return W.sub[i].q.data() + g * c * D; };
  auto ssub = [&](int64_t g, int64_t i) { return W.sub[i].s.data() + g * c * c; };
  auto ksub = [&](int64_t i) { return W.sub[i].k.data(); };
  auto psub = [&](int64_t i) { return W.sub[i].p.data(); };

  // ---- per sub-block UT terms
  for (int64_t i = 0; i < m; ++i)
    W.sub[i].compute(Wb + i * cr * D, Kb + i * c * D, Bb + i * cr,
                     Qb + i * c * D, C * D, U.scale);

  // ---- combine the sub-blocks pairwise, spans of 1, 2, 4, ... sub-blocks (the last span
  // of a level may be shorter when m = C / c is not a power of two): a span [lo, hi)
  // keeps its rows of Q~ relative to its start (in qt),
  // its rows of K~ relative to its end (in kt) and its transition Ps[lo] = pt_{hi-1} ...
  // pt_lo. Merging L = [lo, mid) and R = [mid, hi):
  //   S[R rows, L keys] = Q~_R K~_L^T,  Q~_R <- Q~_R Ps[lo],  K~_L <- K~_L Ps[mid]^T,
  //   Ps[lo] <- Ps[mid] Ps[lo]
  // Each level moves C rows by a [D, D] product, log2(m) levels in all (a walk sub-block
  // by sub-block moves each query through all earlier ones: (m - 1) / 2 C rows).
  T* Ps = W.Ps.data();  // [m, D, D]
  for (int64_t i = 0; i < m; ++i) {
    std::memcpy(Ps + i * D * D, psub(i), sizeof(T) * D * D);
    std::memcpy(U.kt + (nh * C + i * c) * D, ksub(i), sizeof(T) * c * D);
  }
  for (int64_t g = 0; g < Gr; ++g) {
    T* Srows = U.s + (nh * Gr + g) * C * C;  // [C, C] of this head's rows
    T* Q = U.qt + (nh * Gr + g) * C * D;
    for (int64_t i = 0; i < m; ++i) {
      std::memcpy(Q + i * c * D, qsub(g, i), sizeof(T) * c * D);
      for (int64_t r = 0; r < c; ++r) {
        T* row = Srows + (i * c + r) * C;
        std::memcpy(row + i * c, ssub(g, i) + r * c, sizeof(T) * c);
        std::fill(row + (i + 1) * c, row + C, T(0));
      }
    }
  }
  T* tmp = W.state.data();  // [C, D]
  T* P2 = W.R.data();       // [D, D]
  for (int64_t span = 1; span < m; span *= 2) {
    for (int64_t lo = 0; lo + span < m; lo += 2 * span) {
      const int64_t mid = lo + span, hi = std::min(mid + span, m);
      const int64_t rl = span * c, rr = (hi - mid) * c;  // rows of L and of R
      const T* PL = Ps + lo * D * D;
      const T* PR = Ps + mid * D * D;
      T* KL = U.kt + (nh * C + lo * c) * D;
      for (int64_t g = 0; g < Gr; ++g) {
        T* Srows = U.s + (nh * Gr + g) * C * C;
        T* QR = U.qt + ((nh * Gr + g) * C + mid * c) * D;
        gemm_rm<T>(rr, rl, D, QR, D, false, KL, D, true, Srows + mid * c * C + lo * c, C,
                   false);
        gemm_rm<T>(rr, D, D, QR, D, false, PL, D, false, tmp, D, false);
        std::memcpy(QR, tmp, sizeof(T) * rr * D);
      }
      gemm_rm<T>(rl, D, D, KL, D, false, PR, D, true, tmp, D, false);
      std::memcpy(KL, tmp, sizeof(T) * rl * D);
      gemm_rm<T>(D, D, D, PR, D, false, PL, D, false, P2, D, false);
      std::memcpy(Ps + lo * D * D, P2, sizeof(T) * D * D);
    }
  }
  std::memcpy(U.pt + nh * D * D, Ps, sizeof(T) * D * D);
}

// Output tensors of the UT forward: qt [NB, H, Gr C, D], kt [NB, H, C, D], pt [NB, H, D, D],
// s [NB, H, Gr C, C].
struct UTOutputs {
  at::Tensor qt, kt, pt, s;
  UTOutputs(int64_t NB, int64_t H, int64_t Gr, int64_t C, int64_t D,
            const at::TensorOptions& opt)
      : qt(workspace_empty({NB, H, Gr * C, D}, opt)),
        kt(workspace_empty({NB, H, C, D}, opt)),
        pt(workspace_empty({NB, H, D, D}, opt)),
        s(workspace_empty({NB, H, Gr * C, C}, opt)) {}
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tuple() const {
    return std::make_tuple(qt, kt, pt, s);
  }
};

template <typename T>
void run_ut(const Rows<T>& q, const Rows<T>& k, const Rows<T>& w, const Rows<T>& b,
            UTOutputs& out, int64_t NB, int64_t H, int64_t Gr, int64_t D, double scale,
            int64_t c, int64_t R) {
  const int64_t C = k.C, m = C / c;
  UTArgs<T> U{q, k, w, b,
              out.qt.data_ptr<T>(), out.kt.data_ptr<T>(), out.pt.data_ptr<T>(),
              out.s.data_ptr<T>(), H, Gr, C, D, c, R, static_cast<T>(scale)};
  at::parallel_for(0, NB * H, 1, [&](int64_t t0, int64_t t1) {
    UTWork<T> W;
    W.sub.resize(m);
    for (auto& sb : W.sub) sb.resize(c, D, Gr, R);
    W.R.resize(D * D);
    W.state.resize(C * D);  // a span's rows
    W.Ps.resize(m * D * D);
    if (q.tokens()) {
      W.qin.resize(Gr * C * D);
      W.kin.resize(C * D);
      W.win.resize(C * R * D);
      W.bin.resize(C * R);
    }
    for (int64_t t = t0; t < t1; ++t) ut_task<T>(U, t / H, t % H, W);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ut_fwd(
    const at::Tensor& qb, const at::Tensor& kb, const at::Tensor& wb, const at::Tensor& bb,
    double scale, int64_t sub_block) {
  const FlopScope flops(kUtFwd);
  const char* op = "ut_fwd";
  const auto dt = qb.scalar_type();
  const int64_t R = check_ut_inputs(op, qb, kb, wb, bb, sub_block);
  const int64_t NB = qb.size(0), H = qb.size(1), Gr = qb.size(2), C = qb.size(3);
  const int64_t D = qb.size(4);
  UTOutputs out(NB, H, Gr, C, D, qb.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    run_ut<T>(Rows<T>(qb.data_ptr<T>(), H * Gr, C, D), Rows<T>(kb.data_ptr<T>(), H, C, D),
              Rows<T>(wb.data_ptr<T>(), H, C, R * D), Rows<T>(bb.data_ptr<T>(), H, C, R),
              out, NB, H, Gr, D, scale, sub_block, R);
  };
  dispatch_float(dt, run);
  return out.tuple();
}

// ut_fwd from token tensors: q [N, HQ, D], k [N, H, D], w [N, H, R D], beta [N, H, R]
// (unit stride along the last dim, any other strides), start [NB] int64: block n holds
// tokens [start[n], start[n] + block). Returns ut_fwd's outputs for these blocks.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ut_fwd_tokens(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, const at::Tensor& beta,
    const at::Tensor& start, int64_t block, double scale, int64_t sub_block) {
  const FlopScope flops(kUtFwd);
  const char* op = "ut_fwd_tokens";
  const auto dt = q.scalar_type();
  const int64_t R = check_ut_token_inputs(op, q, k, w, beta, start, block, sub_block);
  const int64_t HQ = q.size(1), D = q.size(2), H = k.size(1);
  const int64_t C = block, NB = start.size(0), Gr = HQ / H;
  UTOutputs out(NB, H, Gr, C, D, q.options());
  const int64_t* st = start.data_ptr<int64_t>();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    run_ut<T>(Rows<T>(q, st, C), Rows<T>(k, st, C), Rows<T>(w, st, C), Rows<T>(beta, st, C),
              out, NB, H, Gr, D, scale, sub_block, R);
  };
  dispatch_float(dt, run);
  return out.tuple();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("ut_fwd(Tensor qb, Tensor kb, Tensor wb, Tensor bb, float scale, int sub_block) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.impl("ut_fwd", c10::DispatchKey::CPU, TORCH_FN(ut_fwd));
  m.def("ut_fwd_tokens(Tensor q, Tensor k, Tensor w, Tensor beta, Tensor start, int block, "
        "float scale, int sub_block) -> (Tensor, Tensor, Tensor, Tensor)");
  m.impl("ut_fwd_tokens", c10::DispatchKey::CPU, TORCH_FN(ut_fwd_tokens));
}
