// Fused CPU backward scan of blockwise PaTH attention: blockwise.backward_scan in C++.
//
// Gradients of the key side (dK~, dV, dPt and the gate column sums) of a key block collect
// contributions from every later query block of its sequence, so a task owns one
// (sequence, KV head) pair: it is the only writer of that pair's key-side gradients and
// needs no atomics. Tasks go longest sequence first from an atomic counter. With fewer
// pairs than threads, each pair's query blocks are split over a few replicas with private
// key-side gradients, summed at the end. The chain is walked in the forward kernel's group
// steps (scan_common.h): the step at key block b reads kk[b][:n] (the keys of its blocks
// x_0 = b, ..., x_{n-1}) and pg[b]. For each query block a a task runs
//
//   diagonal:  P = exp(S_diag - lse), dV_a += P^T dO_a, dS = P * (dO_a V_a^T - delta)
//              (stored as ds_diag[a]; its column sums feed the gate gradient)
//   chain:     states st_1 = Q~_a, st_{k+1} = st_k @ pg_{b_k} along the steps (kept: one
//              [R, D] tile per step), then for k = n .. 1 (right to left in reverse):
//                P  = exp(st_k kk_b^T (+ gates) - lse),   dV_x += P_x^T dO_a (each x)
//                dS = P * (dO_a [V_x0 ; ...]^T - delta),  dkk_b += dS^T st_k
//                g_k = dS kk_b + g_{k+1} pg_b^T,          dpg_b += st_k^T g_{k+1}
//              dQ~_a = g_1.
//   last, the group tiles' gradients, back through kk[b][k] = K~_{x_k} M_k^T and the
//   products M_{k+1} = M_k Pt_{x_k}, pg[b] = M_n (group_grads): each step block x_k of b
//   receives dK~ (dkk_b[k] M_k) and dPt terms, gathered per block in a second pass.
//
// The tiles are recomputed in the forward kernel's order of operations, so that P here is
// the forward's P to the last bit where the forward's lse allows it.
//
// scan_bwd_tokens reads the values, dout, lse and delta from token tensors and accumulates
// dv in token values (rows.h): each task copies its query block's rows of dout, lse and
// delta in.

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
  // dout [NB, H, R, Dv], lse and delta [NB, H, R] as rows of the H Gr query heads, or
  // token tensors dout [N, H Gr, Dv], lse and delta [N, H Gr] (rows.h)
  Rows<T> dout, lse, delta;
  const T *kk, *pg;                 // group tiles [NB, H, g, C, D], [NB, H, D, D]
  T *dqt = nullptr, *ds_diag = nullptr;  // outputs, one writer per query block
  // key side, accumulated: dkk [NB, H, g, C, D], dpg [NB, H, D, D], dcol [NB, H, Gr, C]
  // (nullptr without gates), dv [NB, H, C, Dv] or token rows [N, H, Dv] (dv_numel entries)
  T *dkk = nullptr, *dpg = nullptr, *dcol = nullptr;
  Rows<T> dv;
  int64_t dv_numel = 0;
  BwdArgs(const ScanInputs<T>& in, Rows<T> dout_, Rows<T> lse_, Rows<T> delta_,
          const GroupTiles& tiles)
      : ScanInputs<T>(in), dout(dout_), lse(lse_), delta(delta_),
        kk(tiles.kk.data_ptr<T>()), pg(tiles.pg.data_ptr<T>()) {}
};

template <typename T>
struct Work {  // per-thread scratch
  std::vector<T> states, S, dP, g, g_next;
  std::vector<T> dout, lse, delta;  // a query block's rows, copied in (token inputs)
  std::vector<int64_t> chain;
};

// dS = P * (dP - delta_i) in place of dP, rows of W = n C entries; also the gate column
// sums of the k-th C columns into dcol[k] [Gr, C] (when dcol is not null).
template <typename T>
void tile_dS(const T* P, T* dP, const T* delta, int64_t R, int64_t C, int64_t W,
             T* const* dcol) {
  for (int64_t i = 0; i < R; ++i) {
    const T di = delta[i];
    const T* p = P + i * W;
    T* d = dP + i * W;
    for (int64_t j = 0; j < W; ++j) d[j] = p[j] * (d[j] - di);
    if (dcol != nullptr) {
      const int64_t off = (i / C) * C;
      for (int64_t k = 0; k * C < W; ++k)
        for (int64_t j = 0; j < C; ++j) dcol[k][off + j] += d[k * C + j];
    }
  }
}

template <typename T>
void query_block(const BwdArgs<T>& A, int64_t a, int64_t h, Work<T>& W) {
  const int64_t R = A.R, C = A.C, D = A.D, Dv = A.Dv, H = A.H, Gr = R / C;
  const bool gated = A.G != nullptr;
  const int64_t ah = a * H + h;
  const T* dO = A.dout.tile(a, h * Gr, Gr, W.dout.data());  // [R, Dv]
  const T* lse = A.lse.tile(a, h * Gr, Gr, W.lse.data());     // [R]
  const T* delta = A.delta.tile(a, h * Gr, Gr, W.delta.data());
  T* S = W.S.data();
  T* dP = W.dP.data();

  // ---- diagonal block
  std::memcpy(S, A.s_diag + ah * R * C, sizeof(T) * R * C);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t p = i % C;
    T* row = S + i * C;
    if (gated) diag_gate_row(row, A.G + (ah * Gr + i / C) * C, p);
    exp_shifted(row, static_cast<int>(p + 1), lse[i]);
    for (int64_t j = p + 1; j < C; ++j) row[j] = 0;
  }
  diag_keys_times<T>(R, C, Dv, S, dO, A.dv.at(a, h), A.dv.ld());
  diag_rows_times_t<T>(R, C, Dv, dO, A.v.at(a, h), A.v.ld(), dP);
  T* dcol_a[1] = {gated ? A.dcol + ah * Gr * C : nullptr};
  tile_dS<T>(S, dP, delta, R, C, C, gated ? dcol_a : nullptr);
  std::memcpy(A.ds_diag + ah * R * C, dP, sizeof(T) * R * C);

  // ---- chain of group steps and the query states met along it
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
    const T* pgb = A.pg + (W.chain[k] * H + h) * D * D;
    gemm_rm<T>(R, D, D, st + k * R * D, D, false, pgb, D, false, st + (k + 1) * R * D, D,
               false);
  }
  const int64_t g_ = A.group;
  T* g = W.g.data();
  T* g_next = W.g_next.data();
  for (int64_t k = n - 1; k >= 0; --k) {
    const int64_t b = W.chain[k], bh = b * H + h;
    int64_t x[kMaxGroup];
    const int64_t nb = step_blocks(A, b, x);
    const T* sk = st + k * R * D;
    const T* kkb = A.kk + bh * g_ * C * D;
    const int64_t Wd = step_logits(A, A.kk, sk, a, h, x, nb, S);  // as the forward kernel
    for (int64_t i = 0; i < R; ++i) exp_shifted(S + i * Wd, static_cast<int>(Wd), lse[i]);
    T* dcol[kMaxGroup];
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t xh = x[j] * H + h;
      gemm_rm<T>(C, Dv, R, S + j * C, Wd, true, dO, Dv, false, A.dv.at(x[j], h), A.dv.ld(),
                 true);
      gemm_rm<T>(R, C, Dv, dO, Dv, false, A.v.at(x[j], h), A.v.ld(), true, dP + j * C, Wd,
                 false);
      dcol[j] = gated ? A.dcol + xh * Gr * C : nullptr;
    }
    tile_dS<T>(S, dP, delta, R, C, Wd, gated ? dcol : nullptr);
    gemm_rm<T>(Wd, D, R, dP, Wd, true, sk, D, false, A.dkk + bh * g_ * C * D, D, true);
    gemm_rm<T>(R, D, Wd, dP, Wd, false, kkb, D, false, g, D, false);
    if (k + 1 < n) {  // st_{k+1} = st_k @ pg_b
      const T* pgb = A.pg + bh * D * D;
      gemm_rm<T>(R, D, D, g_next, D, false, pgb, D, true, g, D, true);
      gemm_rm<T>(D, D, R, sk, D, true, g_next, D, false, A.dpg + bh * D * D, D, true);
    }
    std::swap(g, g_next);
  }
  std::memcpy(dq, g_next, sizeof(T) * R * D);
}

// dK~ and dPt from the group tiles' gradients dkk and dpg, in two passes over the key
// blocks. First, per step block b (blocks x_0 = b, ..., x_{n-1}), back through
// pg[b] = M_n, M_{k+1} = M_k Pt_{x_k} and kk[b][k] = K~_{x_k} M_k^T (k >= 1):
//   dM_n = dpg_b (0 when no block precedes x_{n-1}), then for k = n-1 .. 1:
//     share_b[k] = M_k^T dM_{k+1} (0 when M_{k+1} was not formed),
//     dM_k = dM_{k+1} Pt_{x_k}^T + dkk_b[k]^T K~_{x_k},  dkk_b[k] <- dkk_b[k] M_k,
//   share_b[0] = dM_1.
// Then per block x, with s_k = succ^k(x) (s_0 = x; x is step block k of s_k's step):
//   dK~_x = sum_k dkk_{s_k}[k],   dPt_x = sum_k share_{s_k}[k].
template <typename T>
void group_grads(const BwdArgs<T>& A, const std::vector<int64_t>& succ, T* dkt, T* dpt,
                 T* share) {
  const int64_t H = A.H, C = A.C, D = A.D, g = A.group;
  at::parallel_for(0, A.NB * H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> Ms(g * D * D), dM(D * D), dM2(D * D), tmp(C * D);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / H, h = t % H;
      int64_t x[kMaxGroup];
      const int64_t n = step_blocks(A, b, x);
      const bool follows = A.pred[x[n - 1]] >= 0;
      T* sh = share + t * g * D * D;
      step_products(A, x, h, n - 1, Ms.data());  // M_k in Ms[k], k = 1 .. n - 1
      T* dm = dM.data();   // dM_{k+1}
      T* dm2 = dM2.data();
      if (follows) {
        std::memcpy(dm, A.dpg + t * D * D, sizeof(T) * D * D);
      } else {
        std::fill(dm, dm + D * D, T(0));
      }
      T* dkkb = A.dkk + t * g * C * D;
      for (int64_t k = n - 1; k >= 1; --k) {
        const int64_t xh = x[k] * H + h;
        const T* Mk = Ms.data() + k * D * D;
        const T* ptx = A.pt + xh * D * D;
        const bool formed = k + 1 < n || follows;  // M_{k+1} = M_k Pt_{x_k} was formed
        if (formed) {
          gemm_rm<T>(D, D, D, Mk, D, true, dm, D, false, sh + k * D * D, D, false);
          gemm_rm<T>(D, D, D, dm, D, false, ptx, D, true, dm2, D, false);
        } else {
          std::fill(sh + k * D * D, sh + (k + 1) * D * D, T(0));
          std::fill(dm2, dm2 + D * D, T(0));
        }
        T* dkx = dkkb + k * C * D;
        gemm_rm<T>(D, D, C, dkx, D, true, A.kt + xh * C * D, D, false, dm2, D, true);
        gemm_rm<T>(C, D, D, dkx, D, false, Mk, D, false, tmp.data(), D, false);
        std::memcpy(dkx, tmp.data(), sizeof(T) * C * D);
        std::swap(dm, dm2);
      }
      std::memcpy(sh, dm, sizeof(T) * D * D);  // dM_1 = dPt_b's share
    }
  });
  at::parallel_for(0, A.NB * H, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t x = t / H, h = t % H;
      T* dk = dkt + t * C * D;
      T* dp = dpt + t * D * D;
      std::memcpy(dk, A.dkk + t * g * C * D, sizeof(T) * C * D);
      std::memcpy(dp, share + t * g * D * D, sizeof(T) * D * D);
      int64_t s = succ[x];
      for (int64_t k = 1; k < g && s >= 0; ++k, s = succ[s]) {
        const int64_t sh = s * H + h;
        const T* src_k = A.dkk + (sh * g + k) * C * D;
        for (int64_t e = 0; e < C * D; ++e) dk[e] += src_k[e];
        const T* src_p = share + (sh * g + k) * D * D;
        for (int64_t e = 0; e < D * D; ++e) dp[e] += src_p[e];
      }
    }
  });
}

template <typename T>
void run_all(BwdArgs<T> A, T* dkt, T* dpt, T* share) {
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
  constexpr int kAcc = 4;  // accumulators: dkk, dpg, dv, dcol
  const int64_t sizes[kAcc] = {NB * H * A.group * C * D, NB * H * D * D, A.dv_numel,
                               A.dcol != nullptr ? NB * R : 0};
  std::vector<std::vector<T>> extra(reps > 1 ? (reps - 1) * kAcc : 0);
  std::vector<BwdArgs<T>> args(reps, A);
  for (int64_t j = 1; j < reps; ++j) {  // replicas: dv's rows where A.dv's are, in buf
    T** dst[kAcc] = {&args[j].dkk, &args[j].dpg, &args[j].dv.base, &args[j].dcol};
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
    W.S.resize(R * A.group * C);
    W.dP.resize(R * A.group * C);
    W.g.resize(R * D);
    W.g_next.resize(R * D);
    if (A.dout.tokens()) {
      W.dout.resize(R * Dv);
      W.lse.resize(R);
      W.delta.resize(R);
    }
    for (int64_t t = counter++; t < n_tasks; t = counter++) {
      const int64_t pair = t / reps, j = t % reps, h = pair % H;
      int64_t idx = 0;  // position of a in its sequence's chain, from the last block
      for (int64_t a = lasts[pair / H]; a >= 0; a = A.pred[a], ++idx)
        if (idx % reps == j) query_block<T>(args[j], a, h, W);
    }
  });
  if (reps > 1) {  // accumulators += replicas
    T* outs[kAcc] = {A.dkk, A.dpg, A.dv.base, A.dcol};
    at::parallel_for(0, kAcc, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q)
        for (int64_t j = 1; j < reps; ++j) {
          const T* src = extra[(j - 1) * kAcc + q].data();
          for (int64_t e = 0; e < sizes[q]; ++e) outs[q][e] += src[e];
        }
    });
  }
  group_grads<T>(A, succ, dkt, dpt, share);
}

// The outputs of both backward ops (dv: block values [NB, H, C, Dv] or token values
// [N, H, Dv], zero-filled) and their run.
struct BwdOutputs {
  at::Tensor dqt, dkt, dkk, dpg, dpt, share, ds_diag, dv, dcol;
  BwdOutputs(const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
             const at::Tensor& s_diag, const std::optional<at::Tensor>& G, at::Tensor dv_,
             int64_t group)
      : dqt(workspace_like(qt)), dkt(workspace_like(kt)),
        dkk(workspace_zeros({qt.size(0), qt.size(1), group, kt.size(2), kt.size(3)},
                            qt.options())),
        dpg(workspace_zeros_like(pt)), dpt(workspace_like(pt)),
        share(workspace_empty({qt.size(0), qt.size(1), group, pt.size(2), pt.size(3)},
                              qt.options())),
        ds_diag(workspace_like(s_diag)), dv(std::move(dv_)),
        dcol(G.has_value() ? workspace_zeros(G->sizes(), qt.options())
                           : at::empty({0}, qt.options())) {}

  template <typename T>
  void run(BwdArgs<T> A, bool gated) {
    A.dqt = dqt.data_ptr<T>();
    A.ds_diag = ds_diag.data_ptr<T>();
    A.dkk = dkk.data_ptr<T>();
    A.dpg = dpg.data_ptr<T>();
    A.dv_numel = dv.numel();
    A.dcol = gated ? dcol.data_ptr<T>() : nullptr;
    run_all<T>(A, dkt.data_ptr<T>(), dpt.data_ptr<T>(), share.data_ptr<T>());
  }

  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tuple()
      const {
    return std::make_tuple(dqt, dkt, dpt, ds_diag, dv, dcol);
  }
};

// Inputs as ScanInputs (scan_common.h), group (key blocks per step) plus dout
// [NB, H, R, Dv], lse and delta = rowsum(dO * O) [NB, H, R].
// Returns dqt, dkt, dpt, ds_diag, dv and dcol ([NB, H, Gr, C] column sums of dS; empty
// [0] without gates).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> scan_bwd(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& vb, const at::Tensor& pred,
    const std::optional<at::Tensor>& G,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta, int64_t group) {
  const FlopScope flops(kScanBwd);
  const char* op = "scan_bwd";
  check_scan_inputs(op, qt, kt, pt, s_diag, vb, pred, G, group);
  const auto dt = qt.scalar_type();
  check_input(op, dout, "dout", 4, dt);
  check_input(op, lse, "lse", 3, dt);
  check_input(op, delta, "delta", 3, dt);
  const int64_t NB = qt.size(0), H = qt.size(1), R = qt.size(2), Dv = vb.size(3);
  const int64_t C = kt.size(2), HQ = H * (R / C);
  TORCH_CHECK(dout.sizes() == at::IntArrayRef({NB, H, R, Dv}), op, ": dout shape");
  TORCH_CHECK(lse.sizes() == at::IntArrayRef({NB, H, R}), op, ": lse shape");
  TORCH_CHECK(delta.sizes() == lse.sizes(), op, ": delta shape");
  BwdOutputs out(qt, kt, pt, s_diag, G, workspace_zeros_like(vb), group);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const ScanInputs<T> in(qt, kt, pt, s_diag, vb, pred, G, group);
    const GroupTiles tiles = group_tiles(in, qt.options());  // alive while A runs
    BwdArgs<T> A(in, Rows<T>(dout.data_ptr<T>(), HQ, C, Dv), Rows<T>(lse.data_ptr<T>(), HQ, C, 1),
                 Rows<T>(delta.data_ptr<T>(), HQ, C, 1), tiles);
    A.dv = Rows<T>(out.dv.data_ptr<T>(), H, C, Dv);
    out.run<T>(A, G.has_value());
  };
  dispatch_float(dt, run);
  return out.tuple();
}

// scan_bwd with token values and rows, as scan_fwd_tokens: v [N, H, Dv], dout [N, HQ, Dv],
// lse and delta [N, HQ] (unit stride along the last dim; HQ = H R / C), start [NB] int64
// (block n holds tokens [start[n], start[n] + C)). Returns scan_bwd's outputs, dv as token
// values [N, H, Dv] (zero at tokens no block holds).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
scan_bwd_tokens(const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
                const at::Tensor& s_diag, const at::Tensor& v, const at::Tensor& start,
                const at::Tensor& pred, const std::optional<at::Tensor>& G,
                const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta,
                int64_t group) {
  const FlopScope flops(kScanBwd);
  const char* op = "scan_bwd_tokens";
  check_scan_inputs(op, qt, kt, pt, s_diag, v, pred, G, group, &start);
  const auto dt = qt.scalar_type();
  const int64_t H = qt.size(1), R = qt.size(2), C = kt.size(2);
  const int64_t N = v.size(0), Dv = v.size(2), HQ = H * (R / C);
  TORCH_CHECK(dout.dim() == 3 && lse.dim() == 2 && delta.dim() == 2, op,
              ": dout must be [N, HQ, Dv], lse and delta [N, HQ]");
  check_token_input(op, dout, "dout", HQ, Dv, dt);
  check_token_input(op, lse.unsqueeze(2), "lse", HQ, 1, dt);
  check_token_input(op, delta.unsqueeze(2), "delta", HQ, 1, dt);
  TORCH_CHECK(dout.size(0) == N && lse.size(0) == N && delta.size(0) == N, op,
              ": v, dout, lse and delta must have the same N tokens");
  BwdOutputs out(qt, kt, pt, s_diag, G, workspace_zeros({N, H, Dv}, qt.options()), group);
  const int64_t* st = start.data_ptr<int64_t>();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const ScanInputs<T> in(qt, kt, pt, s_diag, v, pred, G, group, st);
    const GroupTiles tiles = group_tiles(in, qt.options());  // alive while A runs
    BwdArgs<T> A(in, Rows<T>(dout, st, C), Rows<T>(lse.unsqueeze(2), st, C),
                 Rows<T>(delta.unsqueeze(2), st, C), tiles);
    A.dv = Rows<T>(out.dv, st, C);
    out.run<T>(A, G.has_value());
  };
  dispatch_float(dt, run);
  return out.tuple();
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("scan_bwd(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor vb, Tensor pred, "
        "Tensor? G, Tensor dout, Tensor lse, Tensor delta, int group=4) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.impl("scan_bwd", c10::DispatchKey::CPU, TORCH_FN(scan_bwd));
  m.def("scan_bwd_tokens(Tensor qt, Tensor kt, Tensor pt, Tensor s_diag, Tensor v, "
        "Tensor start, Tensor pred, Tensor? G, Tensor dout, Tensor lse, Tensor delta, "
        "int group=4) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.impl("scan_bwd_tokens", c10::DispatchKey::CPU, TORCH_FN(scan_bwd_tokens));
}
