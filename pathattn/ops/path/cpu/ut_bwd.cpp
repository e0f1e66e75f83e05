// Fused CPU UT transform, backward: gradients of (qb, kb, wb, bb) from those of the block
// quantities (qt, kt, pt, s_diag) of ut_fwd.cpp, by reverse-mode differentiation of its
// steps (the forward terms of the block are recomputed first, one task per (block, head)).
//
// Combination of the sub-blocks, reversed:
//   Pt = R_{-1}^T, R_{i-1} = pt_i^T R_i, K~_i = k~_i R_i:
//       dpt_i += R_i dR_{i-1}^T,   dR_i = pt_i dR_{i-1} + k~_i^T dK~_i,   dk~_i += dK~_i R_i^T
//   query chain of sub-block i (states st_j = q~_i pt_{i-1} ... pt_{j+1}, j = i-1 .. 0):
//       g = dQ~_i; for j = 0 .. i-1:  dpt_j += st_j^T g,  dk~_j += dS_ij^T st_j,
//                                      g <- g pt_j^T + dS_ij k~_j;        dq~_i = g
// Sub-block terms, reversed (see ut_common.h for the forward; the W side has c R rows, one
// per reflection, and incl, later are its token masks):
//   dQs = dq~ + ds K + incl(dQW) W,  dQW = -dq~ AW^T - ds M^T,  dAW = -QW^T dq~ - W dpt,
//   dM = -QW^T ds - W dk~^T,  dK = ds^T Qs + dk~ + later(dWKs)^T W,  dWKs = A^T dM,
//   dA = dM WKs^T + dAW W^T,  dX = dA diag(beta),  dL = strictLower(-X^T dX X^T),
//   dbeta_t = sum_r dA_rt X_rt + sum_t' dL_tt' WW_tt',  dWW = diag(beta) dL,
//   dW = incl(dQW)^T Qs - AW dpt^T - M dk~ + later(dWKs) K + A^T dAW + (dWW + dWW^T) W,
//   dq = scale dQs.
//
// ut_bwd_tokens reads q, k, w, beta from token tensors and writes their gradients as token
// tensors (rows.h), each task copying its block's rows in and its gradients out.

#include "rows.h"
#include "ut_common.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {

using namespace pathattn_cpu;

template <typename T>
struct UTBwdArgs {
  Rows<T> q, k, w, b;                  // inputs: heads H Gr, H, H, H; F = D, D, R D, R
  const T *dqt, *dkt, *dpt, *ds;       // block tensors
  Rows<T> out_q, out_k, out_w, out_b;  // their gradients, as q, k, w, b
  int64_t H, Gr, C, D, c, R;
  T scale;
};

template <typename T>
struct UTBwdWork {
  std::vector<SubBlockUT<T>> sub;       // [m]
  std::vector<T> R;                     // [m + 1] x [D, D]: R_{i} at index i + 1
  std::vector<T> dk, dp, dq;            // [m][c, D], [m][D, D], [Gr][m][c, D]
  std::vector<T> states, g, gn, dR, dR2;
  std::vector<T> dQs, dQW, dAW, dM, dA, dX, tmp, dL;  // W side: c R rows
  std::vector<T> qin, kin, win, bin, qout, kout, wout, bout;  // a block's token rows
};

template <typename T>
void ut_bwd_task(const UTBwdArgs<T>& U, int64_t n, int64_t h, UTBwdWork<T>& W) {
  const int64_t H = U.H, Gr = U.Gr, C = U.C, D = U.D, c = U.c, m = C / c;
  const int64_t nh = n * H + h, R = U.R, cr = c * R;  // cr: reflections of a sub-block
  const T* Wb = U.w.tile(n, h, 1, W.win.data());  // [C * R, D]
  const T* Kb = U.k.tile(n, h, 1, W.kin.data());  // [C, D]
  const T* Bb = U.b.tile(n, h, 1, W.bin.data());  // [C * R]
  const T* Qb = U.q.tile(n, h * Gr, Gr, W.qin.data());  // [Gr, C, D]
  T* dWb = U.out_w.out_tile(n, h, W.wout.data());
  T* dKb = U.out_k.out_tile(n, h, W.kout.data());
  T* dBb = U.out_b.out_tile(n, h, W.bout.data());
  T* dQb = U.out_q.out_tile(n, h * Gr, W.qout.data());
  for (int64_t i = 0; i < m; ++i)
    W.sub[i].compute(Wb + i * cr * D, Kb + i * c * D, Bb + i * cr, Qb + i * c * D, C * D,
                     U.scale);
  auto pt = [&](int64_t i) { return W.sub[i].p.data(); };
  auto kt = [&](int64_t i) { return W.sub[i].k.data(); };
  auto Rm = [&](int64_t i) { return W.R.data() + (i + 1) * D * D; };  // R_i, i >= -1
  auto dk = [&](int64_t i) { return W.dk.data() + i * c * D; };
  auto dp = [&](int64_t i) { return W.dp.data() + i * D * D; };
  auto dq = [&](int64_t g, int64_t i) { return W.dq.data() + (g * m + i) * c * D; };
  std::fill(W.dk.begin(), W.dk.end(), T(0));
  std::fill(W.dp.begin(), W.dp.end(), T(0));

  // ---- key side: R_i for i >= 0 (R_{-1} = Pt^T is not needed) and their reverse
  std::fill(Rm(m - 1), Rm(m - 1) + D * D, T(0));
  for (int64_t e = 0; e < D; ++e) Rm(m - 1)[e * D + e] = 1;
  for (int64_t i = m - 1; i >= 1; --i)
    gemm_rm<T>(D, D, D, pt(i), D, true, Rm(i), D, false, Rm(i - 1), D, false);
  T* dR = W.dR.data();   // gradient of R_{i-1}
  T* dR2 = W.dR2.data();
  const T* dPt = U.dpt + nh * D * D;
  for (int64_t r = 0; r < D; ++r)
    for (int64_t e = 0; e < D; ++e) dR[r * D + e] = dPt[e * D + r];  // dR_{-1} = dPt^T
  for (int64_t i = 0; i < m; ++i) {
    const T* dKt = U.dkt + (nh * C + i * c) * D;
    gemm_rm<T>(D, D, D, Rm(i), D, false, dR, D, true, dp(i), D, true);
    gemm_rm<T>(c, D, D, dKt, D, false, Rm(i), D, true, dk(i), D, true);
    if (i + 1 < m) {
      gemm_rm<T>(D, D, D, pt(i), D, false, dR, D, false, dR2, D, false);
      gemm_rm<T>(D, D, c, kt(i), D, true, dKt, D, false, dR2, D, true);
      std::swap(dR, dR2);
    }
  }

  // ---- query chains
  for (int64_t g = 0; g < Gr; ++g) {
    const T* dS = U.ds + (nh * Gr + g) * C * C;  // [C, C]
    for (int64_t i = 0; i < m; ++i) {
      const T* dQt = U.dqt + ((nh * Gr + g) * C + i * c) * D;
      if (i == 0) {
        std::memcpy(dq(g, 0), dQt, sizeof(T) * c * D);
        continue;
      }
      // st_j for j = i-1 .. 0 at states + j * c * D
      T* st = W.states.data();
      std::memcpy(st + (i - 1) * c * D, W.sub[i].q.data() + g * c * D, sizeof(T) * c * D);
      for (int64_t j = i - 1; j >= 1; --j)
        gemm_rm<T>(c, D, D, st + j * c * D, D, false, pt(j), D, false, st + (j - 1) * c * D, D,
                   false);
      T* gcur = W.g.data();
      T* gnext = W.gn.data();
      std::memcpy(gcur, dQt, sizeof(T) * c * D);
      for (int64_t j = 0; j < i; ++j) {
        const T* sj = st + j * c * D;
        const T* dSij = dS + i * c * C + j * c;
        gemm_rm<T>(D, D, c, sj, D, true, gcur, D, false, dp(j), D, true);
        gemm_rm<T>(c, D, c, dSij, C, true, sj, D, false, dk(j), D, true);
        gemm_rm<T>(c, D, D, gcur, D, false, pt(j), D, true, gnext, D, false);
        gemm_rm<T>(c, D, c, dSij, C, false, kt(j), D, false, gnext, D, true);
        std::swap(gcur, gnext);
      }
      std::memcpy(dq(g, i), gcur, sizeof(T) * c * D);
    }
  }

  // ---- sub-block terms
  for (int64_t i = 0; i < m; ++i) {
    const SubBlockUT<T>& S = W.sub[i];
    const T* Wi = Wb + i * cr * D;  // [cr, D]
    const T* Ki = Kb + i * c * D;
    const T* bi = Bb + i * cr;  // [cr]
    T* dWi = dWb + i * cr * D;
    T* dKi = dKb + i * c * D;
    T* dbi = dBb + i * cr;
    T* dAW = W.dAW.data();
    T* dM = W.dM.data();
    T* dA = W.dA.data();
    T* dQs = W.dQs.data();
    T* dQW = W.dQW.data();
    // pt = I - W^T AW and k~ = K - M^T W
    gemm_rm<T>(cr, D, D, Wi, D, false, dp(i), D, false, dAW, D, false, T(-1));  // -W dpt
    gemm_rm<T>(cr, c, D, Wi, D, false, dk(i), D, true, dM, c, false, T(-1));    // -W dk~^T
    gemm_rm<T>(cr, D, D, S.AW.data(), D, false, dp(i), D, true, dWi, D, false, T(-1));
    gemm_rm<T>(cr, D, c, S.M.data(), c, false, dk(i), D, false, dWi, D, true, T(-1));
    std::memcpy(dKi, dk(i), sizeof(T) * c * D);
    for (int64_t g = 0; g < Gr; ++g) {
      const T* dqg = dq(g, i);
      const T* dsg = U.ds + ((nh * Gr + g) * C + i * c) * C + i * c;  // [c, c], ld C
      const T* Qs = S.Qs.data() + g * c * D;
      const T* QW = S.QW.data() + g * c * cr;  // [c, cr]
      // dQs = dq~ + ds K; dQW = incl(-dq~ AW^T - ds M^T)
      std::memcpy(dQs, dqg, sizeof(T) * c * D);
      gemm_rm<T>(c, D, c, dsg, C, false, Ki, D, false, dQs, D, true);
      gemm_rm<T>(c, cr, D, dqg, D, false, S.AW.data(), D, true, dQW, cr, false, T(-1));
      gemm_rm<T>(c, cr, c, dsg, C, false, S.M.data(), c, true, dQW, cr, true, T(-1));
      for (int64_t r = 0; r < c; ++r)
        for (int64_t t = (r + 1) * R; t < cr; ++t) dQW[r * cr + t] = 0;
      gemm_rm<T>(cr, D, c, QW, cr, true, dqg, D, false, dAW, D, true, T(-1));
      gemm_rm<T>(cr, c, c, QW, cr, true, dsg, C, false, dM, c, true, T(-1));
      gemm_rm<T>(c, D, c, dsg, C, true, Qs, D, false, dKi, D, true);
      gemm_rm<T>(c, D, cr, dQW, cr, false, Wi, D, false, dQs, D, true);
      gemm_rm<T>(cr, D, c, dQW, cr, true, Qs, D, false, dWi, D, true);
      T* dQ = dQb + (g * C + i * c) * D;
      for (int64_t e = 0; e < c * D; ++e) dQ[e] = dQs[e] * U.scale;
    }
    // M = A WKs, WKs = later(W K^T)
    gemm_rm<T>(cr, cr, c, dM, c, false, S.WKs.data(), c, true, dA, cr, false);  // dM WKs^T
    T* dWKs = W.tmp.data();  // [cr, c]
    gemm_rm<T>(cr, c, cr, S.A.data(), cr, true, dM, c, false, dWKs, c, false);  // A^T dM
    for (int64_t l = 0; l < cr; ++l)
      for (int64_t t = l / R; t < c; ++t) dWKs[l * c + t] = 0;
    gemm_rm<T>(cr, D, c, dWKs, c, false, Ki, D, false, dWi, D, true);
    gemm_rm<T>(c, D, cr, dWKs, c, true, Wi, D, false, dKi, D, true);
    // AW = A W
    gemm_rm<T>(cr, cr, D, dAW, D, false, Wi, D, true, dA, cr, true);
    gemm_rm<T>(cr, D, cr, S.A.data(), cr, true, dAW, D, false, dWi, D, true);
    // A = X diag(beta)
    T* dX = W.dX.data();
    for (int64_t t = 0; t < cr; ++t) dbi[t] = 0;
    for (int64_t r = 0; r < cr; ++r)
      for (int64_t t = 0; t < cr; ++t) {
        dX[r * cr + t] = dA[r * cr + t] * bi[t];
        dbi[t] += dA[r * cr + t] * S.X[r * cr + t];
      }
    // X = (I + L)^{-1}: dL = strictLower(-X^T dX X^T)
    T* tmp = W.tmp.data();
    T* dL = W.dL.data();
    gemm_rm<T>(cr, cr, cr, S.X.data(), cr, true, dX, cr, false, tmp, cr, false);
    gemm_rm<T>(cr, cr, cr, tmp, cr, false, S.X.data(), cr, true, dL, cr, false, T(-1));
    // L = strictLower(diag(beta) WW): dbeta_r += sum_t dL_rt WW_rt, dWW = diag(beta) dL
    for (int64_t r = 0; r < cr; ++r) {
      T acc = 0;
      for (int64_t t = 0; t < r; ++t) {
        acc += dL[r * cr + t] * S.WW[r * cr + t];
        dL[r * cr + t] *= bi[r];
      }
      for (int64_t t = r; t < cr; ++t) dL[r * cr + t] = 0;
      dbi[r] += acc;
    }
    // WW = W W^T: dW += (dWW + dWW^T) W
    gemm_rm<T>(cr, D, cr, dL, cr, false, Wi, D, false, dWi, D, true);
    gemm_rm<T>(cr, D, cr, dL, cr, true, Wi, D, false, dWi, D, true);
  }
  U.out_w.flush(n, h, 1, dWb);
  U.out_k.flush(n, h, 1, dKb);
  U.out_b.flush(n, h, 1, dBb);
  U.out_q.flush(n, h * Gr, Gr, dQb);
}

template <typename T>
void run_ut_bwd(const UTBwdArgs<T>& U, int64_t NB) {
  const int64_t H = U.H, Gr = U.Gr, C = U.C, D = U.D, c = U.c, R = U.R;
  const int64_t m = C / c, cr = c * R;
  at::parallel_for(0, NB * H, 1, [&](int64_t t0, int64_t t1) {
    UTBwdWork<T> W;
    W.sub.resize(m);
    for (auto& sb : W.sub) sb.resize(c, D, Gr, R);
    W.R.resize((m + 1) * D * D);
    W.dk.resize(m * c * D);
    W.dp.resize(m * D * D);
    W.dq.resize(Gr * m * c * D);
    W.states.resize(std::max<int64_t>(1, m - 1) * c * D);
    for (auto* v : {&W.g, &W.gn, &W.dQs}) v->resize(c * D);
    W.dAW.resize(cr * D);
    for (auto* v : {&W.dR, &W.dR2}) v->resize(D * D);
    for (auto* v : {&W.dQW, &W.dM}) v->resize(c * cr);
    for (auto* v : {&W.dA, &W.dX, &W.tmp, &W.dL}) v->resize(cr * cr);
    if (U.q.tokens()) {
      for (auto* v : {&W.qin, &W.qout}) v->resize(Gr * C * D);
      for (auto* v : {&W.kin, &W.kout}) v->resize(C * D);
      for (auto* v : {&W.win, &W.wout}) v->resize(C * R * D);
      for (auto* v : {&W.bin, &W.bout}) v->resize(C * R);
    }
    for (int64_t k = t0; k < t1; ++k) ut_bwd_task<T>(U, k / H, k % H, W);
  });
}

// The gradients' checks: dqt [NB, H, Gr*C, D], dkt [NB, H, C, D], dpt [NB, H, D, D],
// ds [NB, H, Gr*C, C].
inline void check_ut_grads(const char* op, const at::Tensor& dqt, const at::Tensor& dkt,
                           const at::Tensor& dpt, const at::Tensor& ds, int64_t NB, int64_t H,
                           int64_t Gr, int64_t C, int64_t D, at::ScalarType dt) {
  check_input(op, dqt, "dqt", 4, dt);
  check_input(op, dkt, "dkt", 4, dt);
  check_input(op, dpt, "dpt", 4, dt);
  check_input(op, ds, "ds", 4, dt);
  TORCH_CHECK(dqt.sizes() == at::IntArrayRef({NB, H, Gr * C, D}), op, ": dqt shape");
  TORCH_CHECK(dkt.sizes() == at::IntArrayRef({NB, H, C, D}), op, ": dkt shape");
  TORCH_CHECK(dpt.sizes() == at::IntArrayRef({NB, H, D, D}), op, ": dpt shape");
  TORCH_CHECK(ds.sizes() == at::IntArrayRef({NB, H, Gr * C, C}), op, ": ds shape");
}

// Inputs as ut_fwd (wb [NB, H, C * R, D], bb [NB, H, C * R]) plus the gradients
// dqt [NB, H, Gr*C, D], dkt [NB, H, C, D], dpt [NB, H, D, D] and ds [NB, H, Gr*C, C] (read
// on and left of the diagonal sub-blocks).
// Returns dqb, dkb, dwb, dbb (shaped as qb, kb, wb, bb).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ut_bwd(
    const at::Tensor& qb, const at::Tensor& kb, const at::Tensor& wb, const at::Tensor& bb,
    double scale, int64_t sub_block, const at::Tensor& dqt, const at::Tensor& dkt,
    const at::Tensor& dpt, const at::Tensor& ds) {
  const FlopScope flops(kUtBwd);
  const char* op = "ut_bwd";
  const auto dt = qb.scalar_type();
  const int64_t R = check_ut_inputs(op, qb, kb, wb, bb, sub_block);
  const int64_t NB = qb.size(0), H = qb.size(1), Gr = qb.size(2), C = qb.size(3);
  const int64_t D = qb.size(4);
  check_ut_grads(op, dqt, dkt, dpt, ds, NB, H, Gr, C, D, dt);
  auto dq = workspace_like(qb), dk = workspace_like(kb), dw = workspace_like(wb),
       db = workspace_like(bb);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const int64_t HQ = H * Gr;
    run_ut_bwd<T>(UTBwdArgs<T>{
        Rows<T>(qb.data_ptr<T>(), HQ, C, D), Rows<T>(kb.data_ptr<T>(), H, C, D),
        Rows<T>(wb.data_ptr<T>(), H, C, R * D), Rows<T>(bb.data_ptr<T>(), H, C, R),
        dqt.data_ptr<T>(), dkt.data_ptr<T>(), dpt.data_ptr<T>(), ds.data_ptr<T>(),
        Rows<T>(dq.data_ptr<T>(), HQ, C, D), Rows<T>(dk.data_ptr<T>(), H, C, D),
        Rows<T>(dw.data_ptr<T>(), H, C, R * D), Rows<T>(db.data_ptr<T>(), H, C, R),
        H, Gr, C, D, sub_block, R, static_cast<T>(scale)}, NB);
  };
  dispatch_float(dt, run);
  return std::make_tuple(dq, dk, dw, db);
}

// ut_bwd from token tensors, as ut_fwd_tokens: q [N, HQ, D], k [N, H, D], w [N, H, R D],
// beta [N, H, R], start [NB] (block n holds tokens [start[n], start[n] + block)), and the
// gradients of ut_fwd_tokens' block outputs. Returns dq [N, HQ, D], dk [N, H, D],
// dw [N, H, R D], dbeta [N, H, R] (contiguous; tokens no block holds are left unset).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> ut_bwd_tokens(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& w, const at::Tensor& beta,
    const at::Tensor& start, int64_t block, double scale, int64_t sub_block,
    const at::Tensor& dqt, const at::Tensor& dkt, const at::Tensor& dpt, const at::Tensor& ds) {
  const FlopScope flops(kUtBwd);
  const char* op = "ut_bwd_tokens";
  const auto dt = q.scalar_type();
  const int64_t R = check_ut_token_inputs(op, q, k, w, beta, start, block, sub_block);
  const int64_t N = q.size(0), HQ = q.size(1), D = q.size(2), H = k.size(1);
  const int64_t NB = start.size(0), C = block, Gr = HQ / H;
  check_ut_grads(op, dqt, dkt, dpt, ds, NB, H, Gr, C, D, dt);
  const auto opt = q.options();
  auto dq = workspace_empty({N, HQ, D}, opt), dk = workspace_empty({N, H, D}, opt),
       dw = workspace_empty({N, H, R * D}, opt), db = workspace_empty({N, H, R}, opt);
  const int64_t* st = start.data_ptr<int64_t>();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    run_ut_bwd<T>(UTBwdArgs<T>{
        Rows<T>(q, st, C), Rows<T>(k, st, C), Rows<T>(w, st, C), Rows<T>(beta, st, C),
        dqt.data_ptr<T>(), dkt.data_ptr<T>(), dpt.data_ptr<T>(), ds.data_ptr<T>(),
        Rows<T>(dq, st, C), Rows<T>(dk, st, C), Rows<T>(dw, st, C), Rows<T>(db, st, C),
        H, Gr, C, D, sub_block, R, static_cast<T>(scale)}, NB);
  };
  dispatch_float(dt, run);
  return std::make_tuple(dq, dk, dw, db);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("ut_bwd(Tensor qb, Tensor kb, Tensor wb, Tensor bb, float scale, int sub_block, "
        "Tensor dqt, Tensor dkt, Tensor dpt, Tensor ds) -> (Tensor, Tensor, Tensor, Tensor)");
  m.impl("ut_bwd", c10::DispatchKey::CPU, TORCH_FN(ut_bwd));
  m.def("ut_bwd_tokens(Tensor q, Tensor k, Tensor w, Tensor beta, Tensor start, int block, "
        "float scale, int sub_block, Tensor dqt, Tensor dkt, Tensor dpt, Tensor ds) -> "
        "(Tensor, Tensor, Tensor, Tensor)");
  m.impl("ut_bwd_tokens", c10::DispatchKey::CPU, TORCH_FN(ut_bwd_tokens));
}
