"""Fused C++ kernels for the CPU: the forward and backward scans and the UT transform with
its gradient (built just in time; see `build`), and the memory they keep for reuse
(`workspace`)."""

from .build import kernel_enabled, load_kernels
from .scan import (
           LONG_BLOCK_FROM,
           fused_backward_scan,
           fused_forward_scan,
           fused_scan_applies,
           fused_token_backward_scan,
           fused_token_scan,
           kernel_block_size,
           predecessors,
           scan_backward,
           scan_forward,
           scan_group,
)
from .ut import (
           fused_block_ut,
           fused_token_ut,
           fused_ut_applies,
           token_ut_backward,
           ut_backward,
           ut_forward,
)
from .workspace import WorkspaceInfo, release_workspace, set_workspace_limit, workspace_info

__all__ = ["kernel_enabled", "load_kernels", "fused_forward_scan", "fused_backward_scan",
           "fused_scan_applies", "fused_token_scan", "fused_token_backward_scan",
           "kernel_block_size", "LONG_BLOCK_FROM",
           "scan_group",
           "predecessors", "scan_forward", "scan_backward",
           "fused_block_ut", "fused_token_ut", "fused_ut_applies", "ut_forward", "ut_backward",
           "token_ut_backward",
           "WorkspaceInfo", "workspace_info", "set_workspace_limit", "release_workspace"]
