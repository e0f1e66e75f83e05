"""The PTX emulator (`pathattn.ops.common.ptx_emulator`) on small hand-written kernels:
integer semantics, memory it reads values from, and every kind of access it must flag.
The compiled pathattn kernels are checked with it in
`tests/ops/path/triton/test_compiled_memory.py`."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pathattn.ops.common.ptx_emulator import Emulator, Unsupported
from pathattn.ops.common.ptx_memory import Region, tile_extent
from pathattn.ops.common.ptx_parse import entry_params, statements

TABLE, OUT = 1 << 40, 2 << 40  # fake device addresses of the two tensors


def _kernel(body: str) -> str:
    return f""".version 8.0
.target sm_90a
.address_size 64
.extern .shared .align 16 .b8 global_smem[];
.visible .entry probe(
	.param .u64 .ptr .global .align 1 probe_param_0,
	.param .u64 .ptr .global .align 1 probe_param_1,
	.param .u32 probe_param_2
)
{{
	.reg .pred %p<8>;
	.reg .b16 %rs<8>;
	.reg .b32 %r<40>;
	.reg .b64 %rd<20>;
	ld.param.b64 %rd1, [probe_param_0];
	ld.param.b64 %rd2, [probe_param_1];
	ld.param.b32 %r1, [probe_param_2];
	mov.u32 %r2, %tid.x;
	mov.u32 %r3, %ctaid.x;
{body}
	ret;
}}
"""


def _run(body: str, table=(3, 1, 0, 2), extra: int = 0, out_bytes: int = 4 * 128,
         shared: int = 1024, program: int = 0, warps: int = 1) -> Emulator:
    data = struct.pack(f"<{len(table)}i", *table)
    regions = [Region("table", TABLE, len(data), data), Region("out", OUT, out_bytes)]
    params = dict(zip(entry_params(_kernel("")), (TABLE, OUT, extra), strict=True))
    em = Emulator(_kernel(body), shared, warps, regions, params)
    em.run((program, 0, 0), (len(table), 1, 1))
    return em


def _reg(em: Emulator, name: str) -> np.ndarray:
    return em.r[name].astype(np.int64)


_WAITS = """	{
	.reg .pred complete;
	waitLoop:
	mbarrier.try_wait.parity.shared::cta.b64 complete, [%r2], 0;
	@!complete bra.uni waitLoop;
	}
	{
	.reg .pred complete;
	waitLoop:
	mbarrier.try_wait.parity.shared::cta.b64 complete, [%r2], 0;
	@!complete bra.uni waitLoop;
	}
	bra.uni $L__BB0_2;
$L__BB0_1:
	st.global.b32 [%rd2+4096], %r2;
$L__BB0_2:"""


def test_parse_params_labels_and_scoped_inline_labels():
    ptx = _kernel(_WAITS)
    assert entry_params(ptx) == ["probe_param_0", "probe_param_1", "probe_param_2"]
    stmts, labels = statements(ptx)
    waits = [s for s in stmts if s.op == "bra.uni" and "waitLoop" in s.args[-1]]
    assert [s.guard for s in waits] == [("complete", True)] * 2
    assert len({s.args[-1] for s in waits}) == 2  # one label per scope
    assert {"$L__BB0_1", "$L__BB0_2"} <= set(labels)
    em = _run(_WAITS)  # waits complete; the store past the end is jumped over
    assert em.faults == [] and em.global_accesses == 0


def test_integer_semantics():
    em = _run("""	mov.b32 %r10, -8;
	shr.s32 %r11, %r10, 1;
	shr.u32 %r12, %r10, 28;
	bfe.s32 %r13, 224, 5, 3;
	bfe.u32 %r14, 224, 5, 3;
	mad.wide.s32 %rd10, %r10, 3, 100;
	div.s32 %r15, %r10, 3;
	rem.s32 %r16, %r10, 3;
	setp.lt.s32 %p1, %r10, 0;
	setp.lt.u32 %p2, %r10, 0;
	selp.b32 %r17, 7, 9, %p1;
	prmt.b32 %r18, 0x44332211, 0, 0x7701U;
	cvt.s64.s32 %rd11, %r10;
	cvt.u32.u64 %r19, %rd11;
	min.s32 %r20, %r10, %r2;
	shl.b32 %r21, -1, 31;
	cvt.u16.u32 %rs1, %r2;
	mov.b16 %rs2, 5;
	mov.b32 %r22, {%rs1, %rs2};
	mov.b32 {%rs3, %rs4}, %r22;""")
    assert _reg(em, "%r11")[0] == 0xFFFFFFFC and _reg(em, "%r12")[0] == 0xF
    assert _reg(em, "%r13")[0] == 0xFFFFFFFF and _reg(em, "%r14")[0] == 7
    assert _reg(em, "%rd10")[0] == 76  # -24 + 100
    assert _reg(em, "%r15")[0] == 0xFFFFFFFE and _reg(em, "%r16")[0] == 0xFFFFFFFE  # -2, -2
    assert _reg(em, "%p1")[0] == 1 and _reg(em, "%p2")[0] == 0 and _reg(em, "%r17")[0] == 7
    assert _reg(em, "%r18")[0] == 0x1122  # bytes 1, 0, 7, 7 of {0, 0x44332211}
    assert em.r["%rd11"][0] == np.uint64(2**64 - 8) and _reg(em, "%r19")[0] == 0xFFFFFFF8
    assert _reg(em, "%r20")[5] == 0xFFFFFFF8 and _reg(em, "%r21")[0] == 0x80000000
    assert _reg(em, "%r22")[3] == 0x50003 and _reg(em, "%rs4")[3] == 5
    assert list(_reg(em, "%rs3")[:4]) == [0, 1, 2, 3]


# the address of out[table[program] * 32 + tid + extra] (4-byte elements)
_INDEXED = """	mul.wide.u32 %rd3, %r3, 4;
	add.s64 %rd4, %rd1, %rd3;
	ld.global.b32 %r4, [%rd4];
	shl.b32 %r5, %r4, 5;
	add.s32 %r6, %r5, %r2;
	add.s32 %r7, %r6, %r1;
	mul.wide.s32 %rd5, %r7, 4;
	add.s64 %rd6, %rd2, %rd5;
"""


def test_global_accesses_from_table_values():
    em = _run(_INDEXED + "\tst.global.b32 [%rd6], %r2;", program=0)  # table[0] = 3: last row
    assert em.faults == [] and em.global_accesses == 2 and _reg(em, "%r4")[0] == 3
    em = _run(_INDEXED + "\tst.global.b32 [%rd6], %r2;", program=0, extra=1)
    (f,) = em.faults
    assert (f.space, f.threads, f.near) == ("global", 1, ("out", 512, 512))
    assert f.op == "st.global.b32"


def test_guards_select_threads():
    body = _INDEXED + """	setp.lt.u32 %p1, %r2, 31;
	@%p1 st.global.b32 [%rd6], %r2;
	setp.lt.u32 %p2, %r2, 0;
	@%p2 st.global.b32 [%rd6+4096], %r2;"""
    assert _run(body, extra=1).faults == []  # thread 31 (out of range) is masked off


def test_shared_values_cross_threads_and_bounds():
    body = """	shl.b32 %r8, %r2, 2;
	mov.b32 %r9, global_smem;
	add.s32 %r10, %r9, %r8;
	mul.lo.s32 %r11, %r2, 3;
	st.shared.b32 [%r10], %r11;
	bar.sync 0;
	xor.b32 %r12, %r8, 4;
	add.s32 %r13, %r9, %r12;
	ld.shared.b32 %r14, [%r13];
	shfl.sync.idx.b32 %r15, %r14, 0, 31, -1;"""
    em = _run(body)
    assert list(_reg(em, "%r14")[:4]) == [3, 0, 9, 6] and (_reg(em, "%r15") == 3).all()
    em = _run(body, shared=64)  # 32 threads x 4 bytes do not fit in 64 bytes
    assert [f.space for f in em.faults] == ["shared", "shared"]
    assert em.faults[0].threads == 16


def test_cp_async_reads_only_threads_with_a_source_size():
    body = _INDEXED + """	mov.b32 %r20, global_smem;
	shl.b32 %r21, %r2, 4;
	add.s32 %r22, %r20, %r21;
	setp.lt.u32 %p1, %r2, 28;
	selp.b32 %r23, 16, 0, %p1;
	cp.async.cg.shared.global [%r22], [%rd6], 0x10, %r23;
	cp.async.commit_group;
	cp.async.wait_group 0;"""
    assert _run(body).faults == []  # the last 4 threads read nothing (their 16 B would not fit)
    assert len(_run(body.replace("selp.b32 %r23, 16, 0, %p1", "mov.b32 %r23, 16")).faults) == 1


def test_unknown_addresses_are_reported():
    body = """	ld.global.b32 %r8, [%rd2];
	mul.wide.u32 %rd7, %r8, 4;
	add.s64 %rd8, %rd2, %rd7;
	st.global.b32 [%rd8], %r2;"""  # an address from float data (no bytes kept)
    em = _run(body)
    assert em.faults == [] and list(em.unknown.values()) == [("", "st.global.b32")]


_SIDES = """	setp.lt.u32 %p1, %r2, 4;
	@%p1 bra $L__BB0_1;
	mov.b32 %r8, 100;
	bra.uni $L__BB0_2;
$L__BB0_1:
	mov.b32 %r8, 200;
	st.global.b32 [%rd2+{offset}], %r2;
$L__BB0_2:
	add.s32 %r9, %r8, %r2;"""


def test_divergent_branches_run_each_side_with_its_threads():
    em = _run(_SIDES.format(offset=496))  # threads 0-3 store at 496 + 0: inside 512 bytes
    assert list(_reg(em, "%r9")[:6]) == [200, 201, 202, 203, 104, 105] and em.faults == []
    (f,) = _run(_SIDES.format(offset=512)).faults
    assert f.threads == 4  # only the threads of that side


def test_branches_on_float_data_run_both_sides():
    body = _SIDES.format(offset=512).replace(
        "	setp.lt.u32 %p1, %r2, 4;", """	ld.global.b32 %r7, [%rd2];
	setp.lt.u32 %p1, %r7, 4;""")  # a predicate from float data: unknown
    em = _run(body)
    assert em.r["%r9"] is None  # 100 + tid or 200 + tid
    assert [f.threads for f in em.faults] == [32]  # the store is checked for every thread
    with pytest.raises(Unsupported, match="unknown predicate"):
        _run(body.replace("	st.global.b32 [%rd2+512], %r2;", "	ret;"))


def test_wgmma_tiles():
    # K-major 128-byte swizzle: 64 rows of 32 bytes, 8-row groups 1024 bytes apart
    desc = (1 << 62) | (64 << 32) | (2048 >> 4)
    assert tile_extent(desc, 64, 16, 2, False) == (2048, 2048 + 8 * 1024)
    body = f"""	mov.b32 %r8, global_smem;
	add.s32 %r9, %r8, 2048;
	bfe.u32 %r10, %r9, 4, 14;
	cvt.u64.u32 %rd9, %r10;
	or.b64 %rd10, %rd9, {(1 << 62) | (64 << 32)};
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{%r30, %r31}}, %rd10, %rd10,
		0, 1, 1, 0, 0;
	wgmma.commit_group.sync.aligned;
	wgmma.wait_group.sync.aligned 0;"""
    assert _run(body, shared=2048 + 8192, warps=4).faults == []
    (a, b) = _run(body, shared=2048 + 8192 - 16, warps=4).faults
    assert (a.space, b.space, a.address) == ("wgmma A", "wgmma B", 2048 + 8192)
