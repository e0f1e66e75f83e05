// The op gemm_flops: the matrix FLOPs the fused kernels did while counting was on
// (common.h's FlopCounter), for benchmarks that set time against work.

#include "common.h"

#include <torch/library.h>

#include <vector>

namespace {

using namespace pathattn_cpu;

// Returns the FLOPs booked per kernel [scan_fwd, scan_bwd, ut_fwd, ut_bwd] since the last
// call, resets them, and turns counting on or off for what follows.
std::vector<int64_t> gemm_flops(bool count) {
  FlopCounter& f = flop_counter();
  std::vector<int64_t> out(kNumFlopKernels);
  for (int k = 0; k < kNumFlopKernels; ++k) out[k] = f.per_kernel[k].exchange(0);
  f.on.store(count);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pathattn_cpu, m) {
  m.def("gemm_flops(bool count) -> int[]", TORCH_FN(gemm_flops));
}
