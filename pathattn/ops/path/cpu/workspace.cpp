// The kernels' workspace (workspace.h) and its ops: workspace_empty, workspace_info,
// workspace_set_limit, workspace_release, and workspace_poison for tests.

#include "workspace.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <mutex>
#include <utility>
#include <vector>

namespace pathattn_cpu {
namespace {

struct Block {
  int64_t bytes;
  void* ptr;
};

struct Workspace {
  std::mutex mu;
  std::list<Block> free;             // most recently freed first
  int64_t cached = 0;                // bytes in `free`
  int64_t limit = int64_t{1} << 30;  // at most this many cached bytes (1 GiB)
  int64_t hits = 0, misses = 0;
  std::atomic<bool> poison{false};   // every block handed out NaN-filled (tests)

  // A block of at least `bytes`: the smallest cached one of at most twice that size (the
  // most recently freed among equals; the same shapes find their own blocks again, other
  // lengths reuse them), else a new one.
  Block take(int64_t bytes) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      auto best = free.end();
      for (auto it = free.begin(); it != free.end(); ++it) {
        if (it->bytes >= bytes && it->bytes <= 2 * bytes &&
            (best == free.end() || it->bytes < best->bytes))
          best = it;
      }
      if (best != free.end()) {
        const Block b = *best;
        free.erase(best);
        cached -= b.bytes;
        ++hits;
        return b;
      }
      ++misses;
    }
    constexpr int64_t kAlign = 64;  // a cache line (and an AVX-512 vector)
    const int64_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, static_cast<size_t>(padded));
    TORCH_CHECK(p != nullptr, "pathattn workspace: out of memory (", bytes, " bytes)");
    return {bytes, p};
  }

  void give(Block b) {
    int64_t keep;
    {
      const std::lock_guard<std::mutex> lock(mu);
      free.push_front(b);
      cached += b.bytes;
      keep = limit;
    }
    trim(keep);
  }

  void trim(int64_t keep) {  // free the oldest blocks until at most `keep` bytes are cached
    std::vector<void*> drop;
    {
      const std::lock_guard<std::mutex> lock(mu);
      while (cached > keep && !free.empty()) {
        drop.push_back(free.back().ptr);
        cached -= free.back().bytes;
        free.pop_back();
      }
    }
    for (void* q : drop) std::free(q);
  }
};

// Never destroyed: tensors freed during interpreter shutdown still find it.
Workspace& workspace() {
  static auto* w = new Workspace;
  return *w;
}

}  // namespace

at::Tensor workspace_empty(at::IntArrayRef sizes, const at::TensorOptions& opt) {
  int64_t n = 1;
  for (const int64_t s : sizes) n *= s;
  const int64_t bytes = n * static_cast<int64_t>(opt.dtype().itemsize());
  at::Tensor t;
  if (bytes < kMinPooledBytes) {
    t = at::empty(sizes, opt);
  } else {
    const Block b = workspace().take(bytes);
    t = at::from_blob(b.ptr, sizes, [b](void*) { workspace().give(b); },
                      opt.device(at::kCPU));
  }
  if (workspace().poison) t.fill_(std::numeric_limits<double>::quiet_NaN());
  return t;
}

at::Tensor workspace_zeros(at::IntArrayRef sizes, const at::TensorOptions& opt) {
  at::Tensor t = workspace_empty(sizes, opt);
  if (t.nbytes() > 0) std::memset(t.data_ptr(), 0, t.nbytes());
  return t;
}

}  // namespace pathattn_cpu

namespace {

using namespace pathattn_cpu;

at::Tensor workspace_empty_op(at::IntArrayRef sizes, at::ScalarType dtype) {
  return workspace_empty(sizes, at::TensorOptions().dtype(dtype));
}

// [cached bytes, limit, hits, misses]
std::vector<int64_t> workspace_info() {
  Workspace& w = workspace();
  const std::lock_guard<std::mutex> lock(w.mu);
  return {w.cached, w.limit, w.hits, w.misses};
}

void workspace_set_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "workspace limit must be >= 0 bytes, got ", bytes);
  {
    const std::lock_guard<std::mutex> lock(workspace().mu);
    workspace().limit = bytes;
  }
  workspace().trim(bytes);
}

void workspace_release() { workspace().trim(0); }

// Tests: every tensor handed out afterwards starts as NaN, so that a kernel reading memory
// it did not write shows up in its results. Returns the previous setting.
bool workspace_poison(bool on) {
  return workspace().poison.exchange(on);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("workspace_empty(int[] sizes, ScalarType dtype) -> Tensor", TORCH_FN(workspace_empty_op));
  m.def("workspace_info() -> int[]", TORCH_FN(workspace_info));
  m.def("workspace_set_limit(int bytes) -> ()", TORCH_FN(workspace_set_limit));
  m.def("workspace_release() -> ()", TORCH_FN(workspace_release));
  m.def("workspace_poison(bool on) -> bool", TORCH_FN(workspace_poison));
}
