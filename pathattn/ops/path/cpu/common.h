// Shared pieces of the fused CPU kernels: BLAS GEMMs on row-major tiles, a vectorisable
// exp for non-positive arguments with blockwise.py's cutoff, row reductions, input checks.
#pragma once

#include "workspace.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

// the BLAS inside libtorch (column-major Fortran interface)
extern "C" {
void sgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b,
            const int* ldb, const float* beta, float* c, const int* ldc);
void dgemm_(const char* ta, const char* tb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b,
            const int* ldb, const double* beta, double* c, const int* ldc);
}

namespace pathattn_cpu {

inline constexpr double kExpCutoff = -64.0;  // as _EXP_CUTOFF in blockwise.py

// Matrix FLOPs (2 M N K per gemm_rm), counted per kernel while counting is on (off by
// default: one relaxed load per GEMM). Each kernel entry point holds a FlopScope, which
// books the FLOPs done while it runs to that kernel; kernels run one at a time from the
// caller's thread (their parallel regions end before they return), so the split is exact.
// Read by the op gemm_flops (flops.cpp) for benchmarks/profile_path_attn_cpu.py.
enum FlopKernel { kScanFwd = 0, kScanBwd, kUtFwd, kUtBwd, kNumFlopKernels };

struct FlopCounter {
  std::atomic<bool> on{false};
  std::atomic<int64_t> total{0};
  std::array<std::atomic<int64_t>, kNumFlopKernels> per_kernel{};
};

inline FlopCounter& flop_counter() {
  static FlopCounter counter;
  return counter;
}

inline void count_flops(int64_t M, int64_t N, int64_t K) {
  FlopCounter& f = flop_counter();
  if (f.on.load(std::memory_order_relaxed))
    f.total.fetch_add(2 * M * N * K, std::memory_order_relaxed);
}

class FlopScope {
 public:
  explicit FlopScope(FlopKernel k)
      : k_(k), start_(flop_counter().total.load(std::memory_order_relaxed)) {}
  ~FlopScope() {
    FlopCounter& f = flop_counter();
    f.per_kernel[k_].fetch_add(f.total.load(std::memory_order_relaxed) - start_,
                               std::memory_order_relaxed);
  }
  FlopScope(const FlopScope&) = delete;
  FlopScope& operator=(const FlopScope&) = delete;

 private:
  FlopKernel k_;
  int64_t start_;
};

// Row-major C [M, N] = alpha op(A) [M, K] @ op(B) [K, N] (+ C when accumulate). op(A) is A
// stored [M, K], or A^T with A stored [K, M] when a_t; likewise op(B) for b_t. lda, ldb, ldc
// are the row strides of the stored matrices.
template <typename T>
inline void gemm_rm(int M, int N, int K, const T* A, int lda, bool a_t, const T* B, int ldb,
                    bool b_t, T* Cm, int ldc, bool accumulate, T alpha = T(1)) {
  // column-major view of the same memory: C^T [N, M] = op(B)^T [N, K] @ op(A)^T [K, M]
  const char tb = b_t ? 'T' : 'N', ta = a_t ? 'T' : 'N';
  const T beta = accumulate ? 1 : 0;
  count_flops(M, N, K);
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&tb, &ta, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, Cm, &ldc);
  } else {
    dgemm_(&tb, &ta, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, Cm, &ldc);
  }
}

template <typename T> struct ExpConst;
template <> struct ExpConst<float> {
  using I = int32_t;
  static constexpr int kMantissa = 23, kBias = 127;
};
template <> struct ExpConst<double> {
  using I = int64_t;
  static constexpr int kMantissa = 52, kBias = 1023;
};

// sum_{d <= 7} r^d / d! (float) and sum_{d <= 13} r^d / d! (double), Horner form.
inline float taylor_exp(float r) {
  return 1.f + r * (1.f + r * (1.f / 2 + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 +
         r * (1.f / 720 + r * (1.f / 5040)))))));
}
inline double taylor_exp(double r) {
  double p = 1.0 / 6227020800.0;  // 1 / 13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  return p * r + 1.0;
}

// exp(v) for v <= 0, and exactly 0 below kExpCutoff (and for -inf). Cody-Waite reduction
// v = n ln2 + r, |r| <= ln2 / 2, and the Taylor polynomial of exp(r) (degree 7 in float, 13
// in double: truncation below the unit roundoff) in Horner form. Branch-free, so that the
// loops below vectorise. (Also exact for 0 < v <= 80 in float, 700 in double.)
template <typename T>
inline T exp_one(T v) {
  using I = typename ExpConst<T>::I;
  const T log2e = T(1.4426950408889634), ln2_hi = T(0.693145751953125),
          ln2_lo = T(1.42860682030941723212e-6), lo = T(kExpCutoff);
  const T s = v < lo ? lo : v;
  const T nf = std::floor(s * log2e + T(0.5));
  const T r = (s - nf * ln2_hi) - nf * ln2_lo;
  const T p = taylor_exp(r);
  const I bits = (static_cast<I>(nf) + ExpConst<T>::kBias) << ExpConst<T>::kMantissa;
  return v < lo ? T(0) : p * __builtin_bit_cast(T, bits);
}

// x[j] <- exp_one(x[j]) for arguments x <= 0.
template <typename T>
void exp_nonpos(T* x, int n) {
  for (int j = 0; j < n; ++j) x[j] = exp_one(x[j]);
}

// Reductions with one accumulator per SIMD lane (vectorisable without reassociation flags).
// The max keeps two vectors' worth of lanes: with one, every step waits for the previous
// max's latency (measured at C = 128: a [128, 256] tile's row maxima 5.0 -> 2.1 us).
inline constexpr int kMaxLanes = 32, kSumLanes = 16;

template <typename T>
T row_max(const T* x, int n) {
  T part[kMaxLanes];
  for (int l = 0; l < kMaxLanes; ++l) part[l] = -std::numeric_limits<T>::infinity();
  int j = 0;
  for (; j + kMaxLanes <= n; j += kMaxLanes)
    for (int l = 0; l < kMaxLanes; ++l) part[l] = part[l] > x[j + l] ? part[l] : x[j + l];
  T mx = -std::numeric_limits<T>::infinity();
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  for (int l = 0; l < kMaxLanes; ++l) mx = std::max(mx, part[l]);
  return mx;
}

template <typename T>
T row_sum(const T* x, int n) {
  T part[kSumLanes] = {};
  int j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) part[l] += x[j + l];
  T sum = 0;
  for (; j < n; ++j) sum += x[j];
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// x[j] <- exp_one(x[j] - shift) (arguments <= 0) in one pass; returns row_sum of the
// results (the same lanes, so the same number as row_sum after exp_nonpos).
template <typename T>
T exp_shifted_sum(T* x, int n, T shift) {
  T part[kSumLanes] = {};
  int j = 0;
  for (; j + kSumLanes <= n; j += kSumLanes)
    for (int l = 0; l < kSumLanes; ++l) {
      const T e = exp_one(x[j + l] - shift);
      x[j + l] = e;
      part[l] += e;
    }
  T sum = 0;
  for (; j < n; ++j) {
    const T e = exp_one(x[j] - shift);
    x[j] = e;
    sum += e;
  }
  for (int l = 0; l < kSumLanes; ++l) sum += part[l];
  return sum;
}

// x[j] <- exp_one(x[j] - shift) (arguments <= 0) in one pass.
template <typename T>
void exp_shifted(T* x, int n, T shift) {
  for (int j = 0; j < n; ++j) x[j] = exp_one(x[j] - shift);
}

// f(float{}) for float32, f(double{}) otherwise (float64): a kernel's generic lambda run
// for its dtype, `using T = decltype(zero)` inside.
template <typename F>
void dispatch_float(at::ScalarType dt, F&& f) {
  if (dt == at::kFloat) {
    f(0.f);
  } else {
    f(0.0);
  }
}

// op's input `name`: a contiguous CPU tensor of `dim` dimensions and dtype dt.
inline void check_input(const char* op, const at::Tensor& x, const char* name, int64_t dim,
                        at::ScalarType dt) {
  TORCH_CHECK(x.device().is_cpu(), op, ": ", name, " must be a CPU tensor");
  TORCH_CHECK(x.dim() == dim, op, ": ", name, " must have ", dim, " dims, got ", x.dim());
  TORCH_CHECK(x.scalar_type() == dt, op, ": ", name, " has dtype ", x.scalar_type(),
              ", expected ", dt);
  TORCH_CHECK(x.is_contiguous(), op, ": ", name, " must be contiguous");
}

}  // namespace pathattn_cpu
