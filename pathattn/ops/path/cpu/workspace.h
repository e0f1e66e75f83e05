// Workspace of the fused CPU kernels: tensors whose memory is kept for reuse when freed.
//
// The kernels allocate the same large temporaries at every call (the UT transform's outputs,
// the group tiles, the scans' outputs and accumulators). From the system allocator each is
// fresh memory: glibc maps a large block anew and returns it to the kernel when freed, so
// every page is faulted in (and zeroed by the kernel) again at each call, which costs about
// as much as a pass over the data. Blocks of at least kMinPooledBytes freed by such tensors
// go to a cache instead and serve later requests of their size or up to half of it (every
// layer of a model asks for the same sizes; other sequence lengths reuse them too). The
// cache holds at most `limit` bytes of free blocks (oldest freed dropped first);
// `workspace_release` frees them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pathattn_cpu {

inline constexpr int64_t kMinPooledBytes = int64_t{1} << 17;  // 128 KiB: glibc's mmap size

// An uninitialised tensor of the given sizes (contiguous, CPU) from the workspace.
at::Tensor workspace_empty(at::IntArrayRef sizes, const at::TensorOptions& opt);

// The same, filled with zeros.
at::Tensor workspace_zeros(at::IntArrayRef sizes, const at::TensorOptions& opt);

// Shaped as x (contiguous): uninitialised, or zeros.
inline at::Tensor workspace_like(const at::Tensor& x) {
  return workspace_empty(x.sizes(), x.options());
}
inline at::Tensor workspace_zeros_like(const at::Tensor& x) {
  return workspace_zeros(x.sizes(), x.options());
}

}  // namespace pathattn_cpu
