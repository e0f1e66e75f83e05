// Fused CPU backward scan of blockwise PaTH attention: blockwise.backward_scan in C++.
//
// Gradients of the key side (dK~, dV, dPt and the gate column sums) of a key block collect
// contributions from every later query block of its sequence, so a task owns one
// (sequence, KV head) pair: it is the only writer of that pair's key-side gradients and
// needs no atomics. Tasks go longest sequence first from an atomic counter. With fewer
// pairs than threads, each pair's query blocks are split over a few replicas with private
// key-side gradients, summed at the end. The chain is walked in the forward kernel's pair
// steps (scan_common.h): step k at key block b_k reads kk_b = [K~_b ; kp_b] (2C keys,
// kp_b = K~_p Pt_b^T; C keys without predecessor p) and pp_b = Pt_b Pt_p. For each query
// block a a task runs
//
//   diagonal:  P = exp(S_diag - lse), dV_a += P^T dO_a, dS = P * (dO_a V_a^T - delta)
//              (stored as ds_diag[a]; its column sums feed the gate gradient)
//   chain:     states st_1 = Q~_a, st_{k+1} = st_k @ pp_{b_k} along the steps (kept: one
//              [R, D] tile per step), then for k = n .. 1 (right to left in reverse):
//                P  = exp(st_k kk_b^T (+ gates) - lse),   [dV_b ; dV_p] += P^T dO_a
//                dS = P * (dO_a [V_b ; V_p]^T - delta),   [dK~_b ; dkp_b] += dS^T st_k
//                g_k = dS kk_b + g_{k+1} pp_b^T,          dpp_b += st_k^T g_{k+1}
//              dQ~_a = g_1.
//   last, per key block x with successor s (pred[s] = x), the pair tiles' gradients:
//              dK~_x += dkp_s Pt_s
//              dPt_x  = dkp_x^T K~_p + dpp_x Pt_p^T + Pt_s^T dpp_s   (p = pred[x])
//
// The tiles are recomputed in the forward kernel's order of operations, so that P here is
// the forward's P to the last bit where the forward's lse allows it.

#include "scan_common.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <tuple>
#include <vector>

namespace {

using namespace pathattn_cpu;

template <typename T>
struct BwdArgs : ScanInputs<T> {
  const T *dout, *lse, *delta;      // [NB, H, R, Dv], [NB, H, R] x 2
  const T *kp, *pp;                 // pair tiles [NB, H, C, D], [NB, H, D, D]
  T *dqt = nullptr, *ds_diag = nullptr;  // outputs, one writer per query block
  // key side, accumulated: dkt and dkp [NB, H, C, D], dpp [NB, H, D, D], dv [NB, H, C, Dv],
  // dcol [NB, H, Gr, C] (nullptr without gates)
  T *dkt = nullptr, *dkp = nullptr, *dpp = nullptr, *dv = nullptr, *dcol = nullptr;
  BwdArgs(const ScanInputs<T>& in, const at::Tensor& dout_, const at::Tensor& lse_,
          const at::Tensor& delta_, const PairTiles& tiles)
      : ScanInputs<T>(in), dout(dout_.data_ptr<T>()), lse(lse_.data_ptr<T>()),
        delta(delta_.data_ptr<T>()), kp(tiles.kp.data_ptr<T>()),
        pp(tiles.pp.data_ptr<T>()) {}
};

template <typename T>
struct Work {  // per-thread scratch
  std::vector<T> states, S, dP, g, g_next;
  std::vector<int64_t> chain;
};

// dS = P * (dP - delta_i) in place of dP, rows of W entries; also the gate column sums of
// the first C columns into dcol_b [Gr, C] and of the next C into dcol_p (when W = 2C).
template <typename T>
void tile_dS(const T* P, T* dP, const T* delta, int64_t R, int64_t C, int64_t W,
             T* dcol_b, T* dcol_p) {
  for (int64_t i = 0; i < R; ++i) {
    const T di = delta[i];
    const T* p = P + i * W;
    T* d = dP + i * W;
    for (int64_t j = 0; j < W; ++j) d[j] = p[j] * (d[j] - di);
    if (dcol_b != nullptr) {
      const int64_t off = (i / C) * C;
      for (int64_t j = 0; j < C; ++j) dcol_b[off + j] += d[j];
      if (W > C)
        for (int64_t j = 0; j < C; ++j) dcol_p[off + j] += d[C + j];
    }
  }
}

template <typename T>
void query_block(const BwdArgs<T>& A, int64_t a, int64_t h, Work<T>& W) {
  const int64_t R = A.R, C = A.C, D = A.D, Dv = A.Dv, H = A.H, Gr = R / C;
  const bool gated = A.G != nullptr;
  const int64_t ah = a * H + h;
  const T* dO = A.dout + ah * R * Dv;
  const T* lse = A.lse + ah * R;
  const T* delta = A.delta + ah * R;
  T* S = W.S.data();
  T* dP = W.dP.data();

  // ---- diagonal block
  std::memcpy(S, A.s_diag + ah * R * C, sizeof(T) * R * C);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t p = i % C;
    T* row = S + i * C;
    if (gated) diag_gate_row(row, A.G + (ah * Gr + i / C) * C, p);
    for (int64_t j = 0; j <= p; ++j) row[j] -= lse[i];
    exp_nonpos(row, static_cast<int>(p + 1));
    for (int64_t j = p + 1; j < C; ++j) row[j] = 0;
  }
  gemm_rm<T>(C, Dv, R, S, C, true, dO, Dv, false, A.dv + ah * C * Dv, Dv, true);
  gemm_rm<T>(R, C, Dv, dO, Dv, false, A.vb + ah * C * Dv, Dv, true, dP, C, false);
  tile_dS<T>(S, dP, delta, R, C, C, gated ? A.dcol + ah * Gr * C : nullptr, nullptr);
  std::memcpy(A.ds_diag + ah * R * C, dP, sizeof(T) * R * C);

  // ---- chain of pair steps and the query states met along it
  W.chain.clear();
  for (int64_t b = A.pred[a]; b >= 0; b = next_step(A, b)) W.chain.push_back(b);
  const int64_t n = static_cast<int64_t>(W.chain.size());
  T* dq = A.dqt + ah * R * D;
  if (n == 0) {
    std::fill(dq, dq + R * D, T(0));
    return;
  }
  if (static_cast<int64_t>(W.states.size()) < n * R * D) W.states.resize(n * R * D);
  T* st = W.states.data();
  std::memcpy(st, A.qt + ah * R * D, sizeof(T) * R * D);
  for (int64_t k = 0; k + 1 < n; ++k) {
    const T* ppb = A.pp + (W.chain[k] * H + h) * D * D;
    gemm_rm<T>(R, D, D, st + k * R * D, D, false, ppb, D, false, st + (k + 1) * R * D, D,
               false);
  }
  T* g = W.g.data();
  T* g_next = W.g_next.data();
  for (int64_t k = n - 1; k >= 0; --k) {
    const int64_t b = W.chain[k], bh = b * H + h, p = A.pred[b], ph = p * H + h;
    const T* sk = st + k * R * D;
    const T* ktb = A.kt + bh * C * D;
    const T* kpb = A.kp + bh * C * D;
    const int64_t Wd = step_logits(A, A.kp, sk, a, b, h, S);  // as the forward kernel
    for (int64_t i = 0; i < R; ++i) {
      T* row = S + i * Wd;
      for (int64_t j = 0; j < Wd; ++j) row[j] -= lse[i];
      exp_nonpos(row, static_cast<int>(Wd));
    }
    gemm_rm<T>(C, Dv, R, S, Wd, true, dO, Dv, false, A.dv + bh * C * Dv, Dv, true);
    gemm_rm<T>(R, C, Dv, dO, Dv, false, A.vb + bh * C * Dv, Dv, true, dP, Wd, false);
    if (p >= 0) {
      gemm_rm<T>(C, Dv, R, S + C, Wd, true, dO, Dv, false, A.dv + ph * C * Dv, Dv, true);
      gemm_rm<T>(R, C, Dv, dO, Dv, false, A.vb + ph * C * Dv, Dv, true, dP + C, Wd, false);
    }
    tile_dS<T>(S, dP, delta, R, C, Wd, gated ? A.dcol + bh * Gr * C : nullptr,
               gated && p >= 0 ? A.dcol + ph * Gr * C : nullptr);
    gemm_rm<T>(C, D, R, dP, Wd, true, sk, D, false, A.dkt + bh * C * D, D, true);
    gemm_rm<T>(R, D, C, dP, Wd, false, ktb, D, false, g, D, false);
    if (p >= 0) {
      gemm_rm<T>(C, D, R, dP + C, Wd, true, sk, D, false, A.dkp + bh * C * D, D, true);
      gemm_rm<T>(R, D, C, dP + C, Wd, false, kpb, D, false, g, D, true);
    }
    if (k + 1 < n) {  // st_{k+1} = st_k @ pp_b
      const T* ppb = A.pp + bh * D * D;
      gemm_rm<T>(R, D, D, g_next, D, false, ppb, D, true, g, D, true);
      gemm_rm<T>(D, D, R, sk, D, true, g_next, D, false, A.dpp + bh * D * D, D, true);
    }
    std::swap(g, g_next);
  }
  std::memcpy(dq, g_next, sizeof(T) * R * D);
}

// dK~ and dPt from the pair tiles' gradients (the last formula of the header), one key
// block per task. succ[x]: the block whose predecessor is x, or -1.
template <typename T>
void pair_grads(const BwdArgs<T>& A, const std::vector<int64_t>& succ, T* dpt) {
  const int64_t H = A.H, C = A.C, D = A.D;
  at::parallel_for(0, A.NB * H, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t x = t / H, h = t % H, p = A.pred[x], s = succ[x];
      T* dp = dpt + t * D * D;
      std::fill(dp, dp + D * D, T(0));
      if (p >= 0) {
        const int64_t ph = p * H + h;
        gemm_rm<T>(D, D, C, A.dkp + t * C * D, D, true, A.kt + ph * C * D, D, false, dp, D,
                   true);
        gemm_rm<T>(D, D, D, A.dpp + t * D * D, D, false, A.pt + ph * D * D, D, true, dp, D,
                   true);
      }
      if (s >= 0) {
        const int64_t sh = s * H + h;
        const T* pts = A.pt + sh * D * D;
        gemm_rm<T>(C, D, D, A.dkp + sh * C * D, D, false, pts, D, false, A.dkt + t * C * D,
                   D, true);
        gemm_rm<T>(D, D, D, pts, D, true, A.dpp + sh * D * D, D, false, dp, D, true);
      }
    }
  });
}

template <typename T>
void run_all(BwdArgs<T> A, T* dpt) {
  const int64_t NB = A.NB, H = A.H, R = A.R, C = A.C, D = A.D, Dv = A.Dv;
  // the last block of every sequence: no block has it as predecessor; in scan order the
  // last blocks of longer sequences come first
  std::vector<int64_t> succ(NB, -1);
  for (int64_t a = 0; a < NB; ++a)
    if (A.pred[a] >= 0) succ[A.pred[a]] = a;
  std::vector<int64_t> lasts;
  for (int64_t a = 0; a < NB; ++a)
    if (succ[a] < 0) lasts.push_back(a);
  int64_t longest = 0;  // blocks in the longest sequence
  for (int64_t a = lasts.empty() ? -1 : lasts[0]; a >= 0; a = A.pred[a]) ++longest;
  // Fewer (sequence, head) pairs than threads: split each pair's query blocks over `reps`
  // replicas, each with private key-side gradients, summed at the end.
  const int64_t n_pairs = static_cast<int64_t>(lasts.size()) * H;
  const int64_t n_threads = at::get_num_threads();
  const int64_t reps = n_pairs >= n_threads ? 1
      : std::max<int64_t>(1, std::min<int64_t>((n_threads + n_pairs - 1) / n_pairs, longest));
  constexpr int kAcc = 5;  // accumulators: dkt, dkp, dpp, dv, dcol
  const int64_t sizes[kAcc] = {NB * H * C * D, NB * H * C * D, NB * H * D * D,
                               NB * H * C * Dv, A.dcol != nullptr ? NB * R : 0};
  std::vector<std::vector<T>> extra(reps > 1 ? (reps - 1) * kAcc : 0);
  std::vector<BwdArgs<T>> args(reps, A);
  for (int64_t j = 1; j < reps; ++j) {
    T** dst[kAcc] = {&args[j].dkt, &args[j].dkp, &args[j].dpp, &args[j].dv, &args[j].dcol};
    for (int q = 0; q < kAcc; ++q) {
      auto& buf = extra[(j - 1) * kAcc + q];
      buf.assign(sizes[q], T(0));
      *dst[q] = sizes[q] ? buf.data() : nullptr;
    }
  }
  const int64_t n_tasks = n_pairs * reps;
  std::atomic<int64_t> counter{0};
  const int64_t n_workers = std::max<int64_t>(1, std::min<int64_t>(n_threads, n_tasks));
  at::parallel_for(0, n_workers, 1, [&](int64_t, int64_t) {
    Work<T> W;
    W.S.resize(R * 2 * C);
    W.dP.resize(R * 2 * C);
    W.g.resize(R * D);
    W.g_next.resize(R * D);
    for (int64_t t = counter++; t < n_tasks; t = counter++) {
      const int64_t pair = t / reps, j = t % reps, h = pair % H;
      int64_t idx = 0;  // position of a in its sequence's chain, from the last block
      for (int64_t a = lasts[pair / H]; a >= 0; a = A.pred[a], ++idx)
        if (idx % reps == j) query_block<T>(args[j], a, h, W);
    }
  });
  if (reps > 1) {  // accumulators += replicas
    T* outs[kAcc] = {A.dkt, A.dkp, A.dpp, A.dv, A.dcol};
    at::parallel_for(0, kAcc, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q)
        for (int64_t j = 1; j < reps; ++j) {
          const T* src = extra[(j - 1) * kAcc + q].data();
          for (int64_t e = 0; e < sizes[q]; ++e) outs[q][e] += src[e];
        }
    });
  }
  pair_grads<T>(A, succ, dpt);
}

// Inputs as ScanInputs (scan_common.h) plus dout [NB, H, R, Dv], lse and delta = rowsum(dO * O) [NB, H, R].
// Returns dqt, dkt, dpt, ds_diag, dv and dcol ([NB, H, Gr, C] column sums of dS; empty
// [0] without gates).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> scan_bwd(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& vb, const at::Tensor& pred,
    const std::optional<at::Tensor>& G,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta) {
  const FlopScope flops(kScanBwd);
  const char* op = "scan_bwd";
  check_scan_inputs(op, qt, kt, pt, s_diag, vb, pred, G);
  const auto dt = qt.scalar_type();
  check_input(op, dout, "dout", 4, dt);
  check_input(op, lse, "lse", 3, dt);
  check_input(op, delta, "delta", 3, dt);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), Dv = vb.size(3);
  TORCH_CHECK(dout.sizes() == at::IntArrayRef({NB, H, R, Dv}), op, ": dout shape");
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({NB, H, R}), op, ": lse shape");
  TORCH_CHECK(delta.sizes() == lse.sizes(), op, ": delta shape");
  const bool gated = G.has_value();
  auto dqt = workspace_like(qt);
  auto dkt = workspace_zeros_like(kt);
  auto dkp = workspace_zeros_like(kt);
  auto dpp = workspace_zeros_like(pt);
  auto dpt = workspace_like(pt);
  auto ds_diag = workspace_like(s_diag);
  auto dv = workspace_zeros_like(vb);
  auto dcol = gated ? workspace_zeros(G->sizes(), qt.options()) : at::empty({0}, qt.options());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const ScanInputs<T> in(qt, kt, pt, s_diag, vb, pred, G);
    const PairTiles tiles = pair_tiles(in, qt.options());
    BwdArgs<T> A(in, dout, lse, delta, tiles);
    A.dqt = dqt.data_ptr<T>();
    A.ds_diag = ds_diag.data_ptr<T>();
    A.dkt = dkt.data_ptr<T>();
    A.dkp = dkp.data_ptr<T>();
    A.dpp = dpp.data_ptr<T>();
    A.dv = dv.data_ptr<T>();
    A.dcol = gated ? dcol.data_ptr<T>() : nullptr;
    run_all<T>(A, dpt.data_ptr<T>());
  };
  if (dt == at::kFloat) {
    run(0.f);
  } else {
    run(0.0);
  }
  return std::make_tuple(dqt, dkt, dpt, ds_diag, dv, dcol);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("scan_bwd(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor vb, Tensor pred, "
        "Tensor? G, Tensor dout, Tensor lse, Tensor delta) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.impl("scan_bwd", c10::DispatchKey::CPU, TORCH_FN(scan_bwd));
}
