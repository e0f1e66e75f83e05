// Fused CPU backward scan of blockwise PaTH attention: blockwise.backward_scan in C++.
//
// Gradients of the key side (dK~, dV, dPt and the gate column sums) of a key block collect
// contributions from every later query block of its sequence, so a task owns one
// (sequence, KV head) pair: it is the only writer of that pair's key-side gradients and
// needs no atomics. Tasks go longest sequence first from an atomic counter. With fewer
// pairs than threads, each pair's query blocks are split over a few replicas with private
// key-side gradients, summed at the end. For each query block a of its sequence, a task
//
//   diagonal:  P = exp(S_diag - lse), dV_a += P^T dO_a, dS = P * (dO_a V_a^T - delta)
//              (stored as ds_diag[a]; its column sums feed the gate gradient)
//   chain:     states st_1 = Q~_a, st_{k+1} = st_k @ Pt_{b_k} along the key blocks
//              b_1 = pred[a], b_2 = pred[b_1], ... (kept: one [R, D] tile per block), then
//              for k = n .. 1 (right to left in reverse):
//                P  = exp(st_k K~_b^T (+ gates) - lse),   dV_b += P^T dO_a
//                dS = P * (dO_a V_b^T - delta),           dK~_b += dS^T st_k
//                g_k = dS K~_b + g_{k+1} Pt_b^T,          dPt_b += st_k^T g_{k+1}
//              dQ~_a = g_1.
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
  const T *dout, *lse, *delta;              // [NB, H, R, Dv], [NB, H, R] x 2
  T *dqt, *dkt, *dpt, *ds_diag, *dv, *dcol;  // outputs; dcol nullptr without gates
  BwdArgs(const ScanInputs<T>& in, const at::Tensor& dout_, const at::Tensor& lse_,
          const at::Tensor& delta_, std::vector<at::Tensor>& outs)
      : ScanInputs<T>(in), dout(dout_.data_ptr<T>()), lse(lse_.data_ptr<T>()),
        delta(delta_.data_ptr<T>()), dqt(outs[0].data_ptr<T>()), dkt(outs[1].data_ptr<T>()),
        dpt(outs[2].data_ptr<T>()), ds_diag(outs[3].data_ptr<T>()), dv(outs[4].data_ptr<T>()),
        dcol(in.G != nullptr ? outs[5].data_ptr<T>() : nullptr) {}
};

template <typename T>
struct Work {  // per-thread scratch
  std::vector<T> states, S, dP, g, g_next;
  std::vector<int64_t> chain;
};

// dS = P * (dP - delta_i) in place of dP; also the gate column sums into dcol_b [Gr, C].
template <typename T>
void tile_dS(const T* P, T* dP, const T* delta, int64_t R, int64_t C, T* dcol_b) {
  for (int64_t i = 0; i < R; ++i) {
    const T di = delta[i];
    const T* p = P + i * C;
    T* d = dP + i * C;
    for (int64_t j = 0; j < C; ++j) d[j] = p[j] * (d[j] - di);
    if (dcol_b != nullptr) {
      T* col = dcol_b + (i / C) * C;
      for (int64_t j = 0; j < C; ++j) col[j] += d[j];
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
  tile_dS<T>(S, dP, delta, R, C, gated ? A.dcol + ah * Gr * C : nullptr);
  std::memcpy(A.ds_diag + ah * R * C, dP, sizeof(T) * R * C);

  // ---- chain of key blocks and the query states met along it
  W.chain.clear();
  for (int64_t b = A.pred[a]; b >= 0; b = A.pred[b]) W.chain.push_back(b);
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
    const T* ptb = A.pt + (W.chain[k] * H + h) * D * D;
    gemm_rm<T>(R, D, D, st + k * R * D, D, false, ptb, D, false, st + (k + 1) * R * D, D,
               false);
  }
  T* g = W.g.data();
  T* g_next = W.g_next.data();
  for (int64_t k = n - 1; k >= 0; --k) {
    const int64_t b = W.chain[k], bh = b * H + h;
    const T* sk = st + k * R * D;
    const T* ktb = A.kt + bh * C * D;
    gemm_rm<T>(R, C, D, sk, D, false, ktb, D, true, S, C, false);
    for (int64_t i = 0; i < R; ++i) {
      T* row = S + i * C;
      if (gated) {  // as the forward kernel
        const int64_t gi = i / C;
        cross_gate_row(row, A.G + (bh * Gr + gi) * C, C, A.G[(ah * Gr + gi) * C + i % C]);
      }
      for (int64_t j = 0; j < C; ++j) row[j] -= lse[i];
      exp_nonpos(row, static_cast<int>(C));
    }
    gemm_rm<T>(C, Dv, R, S, C, true, dO, Dv, false, A.dv + bh * C * Dv, Dv, true);
    gemm_rm<T>(R, C, Dv, dO, Dv, false, A.vb + bh * C * Dv, Dv, true, dP, C, false);
    tile_dS<T>(S, dP, delta, R, C, gated ? A.dcol + bh * Gr * C : nullptr);
    gemm_rm<T>(C, D, R, dP, C, true, sk, D, false, A.dkt + bh * C * D, D, true);
    gemm_rm<T>(R, D, C, dP, C, false, ktb, D, false, g, D, false);
    if (k + 1 < n) {  // st_{k+1} = st_k @ Pt_b
      const T* ptb = A.pt + bh * D * D;
      gemm_rm<T>(R, D, D, g_next, D, false, ptb, D, true, g, D, true);
      gemm_rm<T>(D, D, R, sk, D, true, g_next, D, false, A.dpt + bh * D * D, D, true);
    }
    std::swap(g, g_next);
  }
  std::memcpy(dq, g_next, sizeof(T) * R * D);
}

template <typename T>
void run_all(const BwdArgs<T>& A) {
  const int64_t NB = A.NB, H = A.H, R = A.R, C = A.C, D = A.D, Dv = A.Dv;
  // the last block of every sequence: no block has it as predecessor; in scan order the
  // last blocks of longer sequences come first
  std::vector<char> has_next(NB, 0);
  for (int64_t a = 0; a < NB; ++a)
    if (A.pred[a] >= 0) has_next[A.pred[a]] = 1;
  std::vector<int64_t> lasts;
  for (int64_t a = 0; a < NB; ++a)
    if (!has_next[a]) lasts.push_back(a);
  int64_t longest = 0;  // blocks in the longest sequence
  for (int64_t a = lasts.empty() ? -1 : lasts[0]; a >= 0; a = A.pred[a]) ++longest;
  // Fewer (sequence, head) pairs than threads: split each pair's query blocks over `reps`
  // replicas, each with private key-side gradients, summed at the end.
  const int64_t n_pairs = static_cast<int64_t>(lasts.size()) * H;
  const int64_t n_threads = at::get_num_threads();
  const int64_t reps = n_pairs >= n_threads ? 1
      : std::max<int64_t>(1, std::min<int64_t>((n_threads + n_pairs - 1) / n_pairs, longest));
  const int64_t sizes[4] = {NB * H * C * D, NB * H * D * D, NB * H * C * Dv,
                            A.dcol != nullptr ? NB * R : 0};
  std::vector<std::vector<T>> extra(reps > 1 ? (reps - 1) * 4 : 0);
  std::vector<BwdArgs<T>> args(reps, A);
  for (int64_t j = 1; j < reps; ++j) {
    T** dst[4] = {&args[j].dkt, &args[j].dpt, &args[j].dv, &args[j].dcol};
    for (int q = 0; q < 4; ++q) {
      auto& buf = extra[(j - 1) * 4 + q];
      buf.assign(sizes[q], T(0));
      *dst[q] = sizes[q] ? buf.data() : nullptr;
    }
  }
  const int64_t n_tasks = n_pairs * reps;
  std::atomic<int64_t> counter{0};
  const int64_t n_workers = std::max<int64_t>(1, std::min<int64_t>(n_threads, n_tasks));
  at::parallel_for(0, n_workers, 1, [&](int64_t, int64_t) {
    Work<T> W;
    W.S.resize(R * C);
    W.dP.resize(R * C);
    W.g.resize(R * D);
    W.g_next.resize(R * D);
    for (int64_t t = counter++; t < n_tasks; t = counter++) {
      const int64_t pair = t / reps, j = t % reps, h = pair % H;
      int64_t idx = 0;  // position of a in its sequence's chain, from the last block
      for (int64_t a = lasts[pair / H]; a >= 0; a = A.pred[a], ++idx)
        if (idx % reps == j) query_block<T>(args[j], a, h, W);
    }
  });
  if (reps > 1) {  // outputs += replicas
    T* outs[4] = {A.dkt, A.dpt, A.dv, A.dcol};
    at::parallel_for(0, 4, 1, [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q)
        for (int64_t j = 1; j < reps; ++j) {
          const T* src = extra[(j - 1) * 4 + q].data();
          for (int64_t e = 0; e < sizes[q]; ++e) outs[q][e] += src[e];
        }
    });
  }
}

// Inputs as ScanInputs (scan_common.h) plus dout [NB, H, R, Dv], lse and delta = rowsum(dO * O) [NB, H, R].
// Returns dqt, dkt, dpt, ds_diag, dv and dcol ([NB, H, Gr, C] column sums of dS; empty
// [0] without gates).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> scan_bwd(
    const at::Tensor& qt, const at::Tensor& kt, const at::Tensor& pt,
    const at::Tensor& s_diag, const at::Tensor& vb, const at::Tensor& pred,
    const std::optional<at::Tensor>& G,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta) {
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
  auto dqt = at::empty_like(qt);
  auto dkt = at::zeros_like(kt);
  auto dpt = at::zeros_like(pt);
  auto ds_diag = at::empty_like(s_diag);
  auto dv = at::zeros_like(vb);
  auto dcol = gated ? at::zeros(G->sizes(), qt.options()) : at::empty({0}, qt.options());
  std::vector<at::Tensor> outs = {dqt, dkt, dpt, ds_diag, dv, dcol};
  if (dt == at::kFloat) {
    run_all<float>(BwdArgs<float>(ScanInputs<float>(qt, kt, pt, s_diag, vb, pred, G), dout,
                                  lse, delta, outs));
  } else {
    run_all<double>(BwdArgs<double>(ScanInputs<double>(qt, kt, pt, s_diag, vb, pred, G),
                                    dout, lse, delta, outs));
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
