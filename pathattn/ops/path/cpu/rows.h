// Where the kernels read or write the rows of a block: in block tensors, or straight in the
// caller's token tensors (no gather into blocks, no scatter back).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace pathattn_cpu {

// The C rows of F entries that block n holds for head `head`, either
//   - block tensors [NB, heads, C, F] (contiguous): the rows at ((n heads + head) C) F,
//     row stride F; or
//   - token tensors [N, heads, F] (any token and head strides, unit stride along F), where
//     block n holds the C consecutive tokens from start[n] on: the rows at
//     start[n] s_tok + head s_head, row stride s_tok.
// The second form needs layouts whose blocks are all whole (no padding slots), which
// blocks of one sequence always are except its last.
template <typename T>
struct Rows {
  T* base = nullptr;
  const int64_t* start = nullptr;  // nullptr: block tensors
  int64_t heads = 0, C = 0, F = 0, s_tok = 0, s_head = 0;

  Rows() = default;
  // block tensors
  Rows(T* base_, int64_t heads_, int64_t C_, int64_t F_)
      : base(base_), heads(heads_), C(C_), F(F_) {}
  // token rows: token t's row of head `head` at base + t s_tok + head s_head
  Rows(T* base_, const int64_t* start_, int64_t heads_, int64_t C_, int64_t F_,
       int64_t s_tok_, int64_t s_head_)
      : base(base_), start(start_), heads(heads_), C(C_), F(F_), s_tok(s_tok_),
        s_head(s_head_) {}
  // token tensor x [N, heads, F] with unit stride along F
  Rows(const at::Tensor& x, const int64_t* start_, int64_t C_)
      : Rows(static_cast<T*>(x.data_ptr()), start_, x.size(1), C_, x.size(2), x.stride(0),
             x.stride(1)) {}

  bool tokens() const { return start != nullptr; }
  // first row of block n, head `head`
  T* at(int64_t n, int64_t head) const {
    return tokens() ? base + start[n] * s_tok + head * s_head
                    : base + (n * heads + head) * C * F;
  }
  // stride between the rows of a block
  int64_t ld() const { return tokens() ? s_tok : F; }

  // Block n's rows of `count` consecutive heads from head0 as a contiguous [count, C, F]
  // tile: in place for block tensors, else copied into buf (count C F entries).
  const T* tile(int64_t n, int64_t head0, int64_t count, T* buf) const {
    if (!tokens()) return at(n, head0);
    for (int64_t j = 0; j < count; ++j) {
      const T* src = at(n, head0 + j);
      T* dst = buf + j * C * F;
      for (int64_t r = 0; r < C; ++r) std::memcpy(dst + r * F, src + r * s_tok, sizeof(T) * F);
    }
    return buf;
  }

  // Where to write block n's rows of `count` heads from head0 as a contiguous
  // [count, C, F] tile: in place for block tensors, else buf, which `flush` then copies
  // out to the tokens.
  T* out_tile(int64_t n, int64_t head0, T* buf) const { return tokens() ? buf : at(n, head0); }
  void flush(int64_t n, int64_t head0, int64_t count, const T* buf) const {
    if (!tokens()) return;
    for (int64_t j = 0; j < count; ++j) {
      const T* src = buf + j * C * F;
      T* dst = at(n, head0 + j);
      for (int64_t r = 0; r < C; ++r) std::memcpy(dst + r * s_tok, src + r * F, sizeof(T) * F);
    }
  }
};

// Token tensor `name` of a kernel taking token layouts: [N, heads, F] of dtype dt on the
// CPU, unit stride along F.
inline void check_token_input(const char* op, const at::Tensor& x, const char* name,
                              int64_t heads, int64_t F, at::ScalarType dt) {
  TORCH_CHECK(x.device().is_cpu(), op, ": ", name, " must be a CPU tensor");
  TORCH_CHECK(x.dim() == 3, op, ": ", name, " must be [N, heads, F], got ", x.dim(), " dims");
  TORCH_CHECK(x.scalar_type() == dt, op, ": ", name, " has dtype ", x.scalar_type(),
              ", expected ", dt);
  TORCH_CHECK(x.size(1) == heads && x.size(2) == F, op, ": ", name, " must be [N, ", heads,
              ", ", F, "], got ", x.sizes());
  TORCH_CHECK(x.stride(2) == 1 || F == 1, op, ": ", name,
              " must have unit stride along its last dim");
}

// start [NB] int64 (contiguous, CPU): block n covers tokens [start[n], start[n] + C) of N,
// and no two blocks share a token (the kernels write and accumulate per token).
inline void check_block_starts(const char* op, const at::Tensor& start, int64_t NB,
                               int64_t C, int64_t N) {
  TORCH_CHECK(start.device().is_cpu() && start.dim() == 1 &&
                  start.scalar_type() == at::kLong && start.is_contiguous(),
              op, ": start must be a contiguous int64 CPU tensor [NB]");
  TORCH_CHECK(start.size(0) == NB, op, ": start must have ", NB, " entries (one per block), got ",
              start.size(0));
  const int64_t* s = start.data_ptr<int64_t>();
  for (int64_t n = 0; n < NB; ++n)
    TORCH_CHECK(s[n] >= 0 && s[n] + C <= N, op, ": start[", n, "] = ", s[n],
                ": a block of ", C, " tokens must lie within the ", N, " tokens");
  std::vector<int64_t> sorted(s, s + NB);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t n = 1; n < NB; ++n)
    TORCH_CHECK(sorted[n] >= sorted[n - 1] + C, op, ": the blocks from tokens ",
                sorted[n - 1], " and ", sorted[n], " overlap (blocks of ", C, " tokens)");
}

}  // namespace pathattn_cpu
