// The per-sub-block UT terms shared by the fused UT forward (ut_fwd.cpp) and backward
// (ut_bwd.cpp): one sub-block of c tokens (R reflections each), with every intermediate kept
// for the backward.
#pragma once

#include "common.h"
#include "rows.h"

#include <cstring>
#include <vector>

namespace pathattn_cpu {

// Unit lower-triangular inverse: X = (I + L)^{-1}, L [c, c] strictly lower (row-major).
template <typename T>
void unit_lower_inverse(const T* L, T* X, int64_t c) {
  std::fill(X, X + c * c, T(0));
  for (int64_t r = 0; r < c; ++r) {
    T* xr = X + r * c;
    xr[r] = 1;
    for (int64_t t = 0; t < r; ++t) {
      const T l = L[r * c + t];
      if (l == T(0)) continue;
      const T* xt = X + t * c;
      for (int64_t e = 0; e <= t; ++e) xr[e] -= l * xt[e];
    }
  }
}

// Inputs of the UT kernels: qb [NB, H, Gr, C, D], kb [NB, H, C, D], wb [NB, H, C * R, D],
// bb [NB, H, C * R] (R >= 1 reflections per token, reflection l = t * R + r of token t),
// one dtype (float32 or float64), contiguous; sub_block divides C. Returns R.
inline int64_t check_ut_inputs(const char* op, const at::Tensor& qb, const at::Tensor& kb,
                               const at::Tensor& wb, const at::Tensor& bb,
                               int64_t sub_block) {
  const auto dt = qb.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, op, ": float32 or float64 only");
  check_input(op, qb, "qb", 5, dt);
  check_input(op, kb, "kb", 4, dt);
  check_input(op, wb, "wb", 4, dt);
  check_input(op, bb, "bb", 3, dt);
  const int64_t NB = qb.size(0), H = qb.size(1), C = qb.size(3), D = qb.size(4);
  TORCH_CHECK(kb.sizes() == at::IntArrayRef({NB, H, C, D}), op, ": kb shape");
  TORCH_CHECK(C >= 1 && wb.size(2) >= C && wb.size(2) % C == 0, op,
              ": wb must be [NB, H, C * R, D] with R >= 1 reflections per token");
  const int64_t R = wb.size(2) / C;
  TORCH_CHECK(wb.sizes() == at::IntArrayRef({NB, H, C * R, D}), op, ": wb shape");
  TORCH_CHECK(bb.sizes() == at::IntArrayRef({NB, H, C * R}), op, ": bb shape");
  TORCH_CHECK(sub_block >= 1 && C % sub_block == 0, op,
              ": sub_block must divide the block size");
  return R;
}

// Token inputs of the UT kernels (rows.h): q [N, HQ, D], k [N, H, D], w [N, H, R * D],
// beta [N, H, R] (one dtype, float32 or float64; unit stride along the last dim), start
// [NB] int64 with block n covering tokens [start[n], start[n] + block); sub_block divides
// block. Returns R.
inline int64_t check_ut_token_inputs(const char* op, const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& w, const at::Tensor& beta,
                                     const at::Tensor& start, int64_t block,
                                     int64_t sub_block) {
  const auto dt = q.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kDouble, op, ": float32 or float64 only");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && beta.dim() == 3, op,
              ": q, k and beta must be [N, heads, F]");
  const int64_t N = q.size(0), HQ = q.size(1), D = q.size(2), H = k.size(1);
  const int64_t R = beta.size(2);
  TORCH_CHECK(H >= 1 && HQ % H == 0, op, ": q's heads must be a multiple of k's");
  TORCH_CHECK(R >= 1, op, ": beta must have R >= 1 reflections per token");
  check_token_input(op, q, "q", HQ, D, dt);
  check_token_input(op, k, "k", H, D, dt);
  check_token_input(op, w, "w", H, R * D, dt);
  check_token_input(op, beta, "beta", H, R, dt);
  TORCH_CHECK(k.size(0) == N && w.size(0) == N && beta.size(0) == N, op,
              ": q, k, w and beta must have the same N tokens");
  TORCH_CHECK(block >= 1 && sub_block >= 1 && block % sub_block == 0, op,
              ": sub_block must divide the block size");
  check_block_starts(op, start, start.size(0), block, N);
  return R;
}

// One sub-block of c tokens with R reflections each, n = c R: inputs W [n, D] (reflection
// l = t R + r of token t), beta [n], K [c, D], Q^g [c, D] for g < Gr (row stride D each,
// Q^g at q + g * q_stride), scale. Intermediates (row-major):
//   WW = W W^T [n, n], X = (I + strictLower(diag(beta) WW))^{-1}, A = X diag(beta),
//   AW = A W [n, D], WKs = later(W K^T) [n, c], M = A WKs [n, c], Qs^g = scale Q^g,
//   QW^g = incl(Qs^g W^T) [c, n],
// with the token masks later[l, j] = (l / R > j) and incl[i, l] = (l / R <= i)
// (strictLower and tril for R = 1); outputs
//   q~^g = Qs - QW AW, s^g = Qs K^T - QW M, k~ = K - M^T W, pt = I - W^T AW.
template <typename T>
struct SubBlockUT {
  int64_t c = 0, D = 0, Gr = 0, R = 1, n = 0;
  std::vector<T> WW, X, A, AW, WKs, M, k, p;  // k = k~, p = pt
  std::vector<T> Qs, QW, q, s;               // [Gr] x ...: q = q~

  void resize(int64_t c_, int64_t D_, int64_t Gr_, int64_t R_) {
    c = c_, D = D_, Gr = Gr_, R = R_, n = c_ * R_;
    for (auto* v : {&WW, &X, &A}) v->resize(n * n);
    for (auto* v : {&WKs, &M}) v->resize(n * c);
    AW.resize(n * D);
    k.resize(c * D);
    p.resize(D * D);
    for (auto* v : {&Qs, &q}) v->resize(Gr * c * D);
    QW.resize(Gr * c * n);
    s.resize(Gr * c * c);
  }

  void compute(const T* Wi, const T* Ki, const T* bi, const T* Q, int64_t q_stride,
               T scale) {
    gemm_rm<T>(n, n, D, Wi, D, false, Wi, D, true, WW.data(), n, false);
    T* Ad = A.data();  // L first, then A
    for (int64_t r = 0; r < n; ++r)
      for (int64_t t = 0; t < n; ++t) Ad[r * n + t] = t < r ? bi[r] * WW[r * n + t] : T(0);
    unit_lower_inverse<T>(Ad, X.data(), n);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t t = 0; t < n; ++t) Ad[r * n + t] = X[r * n + t] * bi[t];
    gemm_rm<T>(n, D, n, Ad, n, false, Wi, D, false, AW.data(), D, false);
    gemm_rm<T>(n, c, D, Wi, D, false, Ki, D, true, WKs.data(), c, false);
    for (int64_t l = 0; l < n; ++l)  // later: key j < l / R
      for (int64_t t = l / R; t < c; ++t) WKs[l * c + t] = 0;
    gemm_rm<T>(n, c, n, Ad, n, false, WKs.data(), c, false, M.data(), c, false);
    std::memcpy(k.data(), Ki, sizeof(T) * c * D);
    gemm_rm<T>(c, D, n, M.data(), c, true, Wi, D, false, k.data(), D, true, T(-1));
    std::fill(p.begin(), p.end(), T(0));
    for (int64_t e = 0; e < D; ++e) p[e * D + e] = 1;
    gemm_rm<T>(D, D, n, Wi, D, true, AW.data(), D, false, p.data(), D, true, T(-1));
    for (int64_t g = 0; g < Gr; ++g) {
      const T* Qg = Q + g * q_stride;
      T* qs = Qs.data() + g * c * D;
      T* qw = QW.data() + g * c * n;
      T* qg = q.data() + g * c * D;
      T* sg = s.data() + g * c * c;
      for (int64_t e = 0; e < c * D; ++e) qs[e] = Qg[e] * scale;
      gemm_rm<T>(c, n, D, qs, D, false, Wi, D, true, qw, n, false);
      for (int64_t r = 0; r < c; ++r)  // incl: reflections of tokens <= r
        for (int64_t t = (r + 1) * R; t < n; ++t) qw[r * n + t] = 0;
      gemm_rm<T>(c, c, D, qs, D, false, Ki, D, true, sg, c, false);
      gemm_rm<T>(c, c, n, qw, n, false, M.data(), c, false, sg, c, true, T(-1));
      std::memcpy(qg, qs, sizeof(T) * c * D);
      gemm_rm<T>(c, D, n, qw, n, false, AW.data(), D, false, qg, D, true, T(-1));
    }
  }
};

}  // namespace pathattn_cpu
