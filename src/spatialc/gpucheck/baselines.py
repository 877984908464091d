"""The libraries spatialc is compared with, each in the layout it takes and by the rules it keeps.

Every contender computes C = A·B from the row's row-major A and B two ways. Kernel only: its operands already in
its own layout, its output preallocated — the call alone, which a CUDA graph can capture. End to end: what a caller
holding row-major A and B gets: whatever copies its layout needs, the call, and row-major C in torch's output type
(int32 for int8, fp16 / bf16 for fp16 / bf16).

The int8 paths, by their documented rules:
- `torch._int_mm(a, b)`: int8 × int8 → int32 through cuBLASLt; a.size(0) > 16, k and n positive multiples of 8
  (aten/src/ATen/native/cuda/Blas.cpp). cuBLASLt's int8 kernels take the "TN" layout, which for row-major C is A
  row-major and B column-major; with B row-major ("NN") it answers CUBLAS_STATUS_NOT_SUPPORTED on some GPUs and
  cuBLAS versions (PyTorch issues #169956, #113327). Both are tried; the preflight keeps what this device takes.
- `cublasGemmEx` with CUDA_R_8I operands, a CUDA_R_32I C and CUBLAS_COMPUTE_32I (int32 alpha and beta): A and B
  4-byte aligned with leading dimensions that are multiples of 4, and for its IMMA kernels the TN layout with m and
  k multiples of 4 too (the cuBLAS guide). So it runs TN on operands zero-padded to multiples of 4 (extra zero rows
  and columns leave the product's corner unchanged), and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import blockscaled, fp8
from .cases import ELEM_OF, TORCH_OUT, Case

TORCH_MATMUL = "torch.matmul"
INT_MM_COL = "torch._int_mm (B column-major)"
INT_MM_ROW = "torch._int_mm (B row-major)"
GEMM_EX = "cublasGemmEx TN"
TRITON = "Triton matmul"
# The contenders that are one torch call: the function, and whether it takes B column-major (kernel only: B copied
# so beforehand; end to end: the copy is part of the call).
TORCH_CALLS = {TORCH_MATMUL: ("matmul", False), INT_MM_COL: ("_int_mm", True), INT_MM_ROW: ("_int_mm", False)}

# cuBLAS's enumerations (cublas_api.h, library_types.h), for where CuPy's module lacks a name.
OP_N, OP_T = 0, 1
POINTER_MODE_HOST = 0
CUDA_R_8I, CUDA_R_32I = 3, 10
COMPUTE_32I = 72
GEMM_DEFAULT = -1


def baselines_for(precision: str) -> list[tuple[str, str]]:
    """The (name, family) of each library contender of a precision, in the report's order."""
    if precision == "int8":
        return [(INT_MM_COL, "cublas"), (GEMM_EX, "cublas"), (INT_MM_ROW, "cublas"), (TRITON, "triton")]
    if fp8.is_fp8(precision):  # cuBLASLt's fp8 GEMM through torch, two ways of scaling (fp8.py)
        return [(name, "cublas") for name in fp8.SCALED_MM]
    return [(TORCH_MATMUL, "cublas"), (TRITON, "triton")]


def baselines_of(case: Case) -> list[tuple[str, str]]:
    """The library contenders of a case's row: a fused row's is torch's GEMM followed by the same epilogue (Triton's
    matmul has none), every other's its precision's (`baselines_for`)."""
    if case.fused:
        from .fused import TORCH_EPILOGUE

        return [(TORCH_EPILOGUE, "cublas")]
    if case.blockscaled:  # _scaled_mm per-tensor (the bar) and, where torch has it, blockwise (blockscaled.py)
        return [(name, "cublas") for name in blockscaled.CONTESTANTS]
    return baselines_for(case.precision)


def int_mm_refusal(m: int, n: int, k: int) -> str:
    """Why torch._int_mm refuses a shape ('' when it takes it)."""
    if m > 16 and k > 0 and k % 8 == 0 and n > 0 and n % 8 == 0:
        return ""
    return f"torch._int_mm needs m > 16 and k, n multiples of 8 (m={m}, n={n}, k={k})"


def pad4(x: int) -> int:
    return -(-x // 4) * 4


def gemm_ex_shape(m: int, n: int, k: int) -> tuple[int, int, int]:
    """The (m, n, k) cublasGemmEx's int8 TN path runs: each padded up to a multiple of 4."""
    return pad4(m), pad4(n), pad4(k)


def padding(case: Case) -> str:
    """What cublasGemmEx's int8 path does to this case's operands."""
    shape = gemm_ex_shape(case.m, case.n, case.k)
    if shape == (case.m, case.n, case.k):
        return "no padding needed"
    return "operands zero-padded to {}×{}×{}".format(*shape)


def refusal(name: str, case: Case) -> str:
    """Why a contender cannot take this case's shape ('' when it can)."""
    if name in (INT_MM_COL, INT_MM_ROW):
        return int_mm_refusal(case.m, case.n, case.k)
    if case.blockscaled and name in blockscaled.CONTESTANTS:
        return blockscaled.refusal(name, case)
    if name in fp8.SCALED_MM:
        return fp8.refusal(name, case)
    return ""


def describe(name: str, case: Case) -> str:
    """What a contender's two timings hold, for the report."""
    if name == GEMM_EX:
        pad = padding(case)
        extra = "" if pad == "no padding needed" else ", the padding copies and C's copy out of the padded result"
        return f"TN, int8 → int32, {pad} (int8 cuBLAS needs multiples of 4); end to end adds B's transposed copy{extra}"
    if name == INT_MM_COL:
        return "B column-major (cuBLASLt's TN); end to end adds B's transposed copy and the allocation of C"
    if name == INT_MM_ROW:
        return "B row-major as given (cuBLASLt's NN); end to end adds the allocation of C"
    if case.blockscaled and name in blockscaled.CONTESTANTS:
        return blockscaled.describe(name)
    if name in fp8.SCALED_MM:
        return fp8.describe(name)
    return "row-major A, B and C; end to end adds the allocation of C"


def device_ptr(x: Any) -> int:
    """A CuPy array's device address."""
    return int(x.data.ptr)


@dataclass
class Contender:
    """A library's two ways to compute the product of input set i, and where each leaves its result (row-major
    m × n, element type `elem`; bf16 as its bits in uint16)."""

    kernel: Callable[[int], None]
    kernel_result: Callable[[], Any]
    end_to_end: Callable[[int], None]
    e2e_result: Callable[[], Any]
    elem: str
    detail: str


class Libraries:
    """CuPy, torch and the Triton matmul (each None where missing) and how to make each contender from them."""

    def __init__(self, cp: Any, torch: Any, triton: Any, triton_note: str = "not installed"):
        self.cp, self.torch, self.triton, self.triton_note = cp, torch, triton, triton_note

    def missing(self, name: str) -> str:
        """Why a contender cannot run here at all ('' when its library is here)."""
        from .fused import TORCH_EPILOGUE

        scaled_mm = name in fp8.SCALED_MM or name == blockscaled.BLOCKWISE
        if (name in TORCH_CALLS or name == TORCH_EPILOGUE or scaled_mm) and self.torch is None:
            return "torch is not installed (or sees no GPU)"
        if scaled_mm and not hasattr(self.torch, "_scaled_mm"):
            return f"torch {self.torch.__version__} has no _scaled_mm"
        if name == blockscaled.BLOCKWISE:
            return blockscaled.missing(self.torch, name)
        if name == TRITON and self.triton is None:
            return f"Triton: {self.triton_note}"
        return ""

    def make(
        self, name: str, case: Case, a: list[Any], b: list[Any], more: list[dict[str, Any]] | None = None
    ) -> Contender:
        """The contender `name` for `case` on the input sets `a`, `b` and each set's other tensors `more` (a fused
        epilogue's, by name), CuPy arrays in storage dtype."""
        from .fused import TORCH_EPILOGUE

        if name == TORCH_EPILOGUE:
            return self._torch_epilogue(case, a, b, more or [])
        if case.blockscaled and name in blockscaled.CONTESTANTS:
            kernel, c, e2e, box = blockscaled.scaled_mm(self.torch, name, case, a, b, more or [])
            return self._contender(name, case, kernel, c, e2e, box)
        if name in fp8.SCALED_MM:
            kernel, c, e2e, box = fp8.scaled_mm(self.torch, name, case, a, b, more or [])
            return self._contender(name, case, kernel, c, e2e, box)
        if name in TORCH_CALLS:
            function, b_col_major = TORCH_CALLS[name]
            return self._torch_call(name, case, a, b, getattr(self.torch, function), b_col_major)
        makers = {GEMM_EX: self._gemm_ex, TRITON: self._triton}
        return makers[name](case, a, b)

    # ---- torch ---------------------------------------------------------------------------------------------

    def to_torch(self, x: Any, precision: str) -> Any:
        """A torch view (DLPack, no copy) of a CuPy operand; bf16 bits become torch.bfloat16."""
        if precision == "bf16":
            return self.torch.from_dlpack(x.view(self.cp.int16)).view(self.torch.bfloat16)
        return self.torch.from_dlpack(x)

    def from_torch(self, t: Any) -> Any:
        """A CuPy view of a torch result; bf16 as its bits in uint16 (CuPy has no bfloat16)."""
        if t.dtype == self.torch.bfloat16:
            return self.cp.from_dlpack(t.view(self.torch.int16)).view(self.cp.uint16)
        return self.cp.from_dlpack(t)

    def _empty(self, case: Case, like: Any) -> Any:
        dtype = self.torch.int32 if case.precision == "int8" else like.dtype
        return self.torch.empty((case.m, case.n), dtype=dtype, device=like.device)

    def _contender(self, name: str, case: Case, kernel: Any, c: Any, e2e: Any, box: list[Any]) -> Contender:
        return Contender(
            kernel,
            lambda: self.from_torch(c),
            e2e,
            lambda: self.from_torch(box[0]),
            ELEM_OF[TORCH_OUT[case.precision]],
            describe(name, case),
        )

    def _torch_call(
        self, name: str, case: Case, a: list[Any], b: list[Any], call: Callable[..., Any], b_col_major: bool
    ) -> Contender:
        """torch.matmul or torch._int_mm (`call`) on the operands, B row-major as given or column-major."""
        ta, tb = [self.to_torch(x, case.precision) for x in a], [self.to_torch(x, case.precision) for x in b]
        c, box = self._empty(case, ta[0]), [None]
        if b_col_major:
            tb_kernel = [t.t().contiguous().t() for t in tb]  # the same (k, n) matrix, column-major

            def e2e(i: int) -> None:
                box[0] = call(ta[i], tb[i].t().contiguous().t())

        else:
            tb_kernel = tb

            def e2e(i: int) -> None:
                box[0] = call(ta[i], tb[i])

        def kernel(i: int) -> None:
            call(ta[i], tb_kernel[i], out=c)

        return self._contender(name, case, kernel, c, e2e, box)

    def _torch_epilogue(self, case: Case, a: list[Any], b: list[Any], more: list[dict[str, Any]]) -> Contender:
        """torch.matmul followed by the fused row's epilogue in the inputs' type (`fused.torch_epilogue`)."""
        from .fused import EPILOGUE_TEXT, TORCH_EPILOGUE, torch_epilogue

        ta, tb = [self.to_torch(x, case.precision) for x in a], [self.to_torch(x, case.precision) for x in b]
        tm = [{name: self.to_torch(x, case.precision) for name, x in m.items()} for m in more]
        c, box = self._empty(case, ta[0]), [None]

        def kernel(i: int) -> None:
            torch_epilogue(self.torch, ta[i], tb[i], tm[i], c)

        def e2e(i: int) -> None:
            box[0] = torch_epilogue(self.torch, ta[i], tb[i], tm[i])

        made = self._contender(TORCH_EPILOGUE, case, kernel, c, e2e, box)
        made.detail = (
            f"torch.matmul, then {EPILOGUE_TEXT} in {case.precision}, each op rounding to it; kernel only: into C"
            " through the ops' out= forms (four kernels); end to end allocating, as a caller writes it"
        )
        return made

    def _triton(self, case: Case, a: list[Any], b: list[Any]) -> Contender:
        ta, tb = [self.to_torch(x, case.precision) for x in a], [self.to_torch(x, case.precision) for x in b]
        c, box = self._empty(case, ta[0]), [None]
        matmul = self.triton.matmul

        def kernel(i: int) -> None:
            matmul(ta[i], tb[i], c, case.precision)

        def e2e(i: int) -> None:
            box[0] = matmul(ta[i], tb[i], self._empty(case, ta[i]), case.precision)

        return self._contender(TRITON, case, kernel, c, e2e, box)

    # ---- cuBLAS through CuPy ---------------------------------------------------------------------------------

    def _gemm_ex(self, case: Case, a: list[Any], b: list[Any]) -> Contender:
        cp, (m, n, k) = self.cp, (case.m, case.n, case.k)
        mp, np_, kp = gemm_ex_shape(m, n, k)
        padded = (mp, np_, kp) != (m, n, k)
        call = GemmExTN(cp, mp, np_, kp)
        ap = [padded_copy(cp, x, mp, kp) for x in a]
        btp = [padded_copy(cp, x.T, np_, kp) for x in b]  # Bᵀ stored row-major: B column-major
        c, box = cp.empty((mp, np_), dtype=cp.int32), [None]

        def kernel(i: int) -> None:
            call(ap[i], btp[i], c)

        def e2e(i: int) -> None:
            cc = cp.empty((mp, np_), dtype=cp.int32)
            call(padded_copy(cp, a[i], mp, kp), padded_copy(cp, b[i].T, np_, kp), cc)
            box[0] = cp.ascontiguousarray(cc[:m, :n]) if padded else cc

        return Contender(kernel, lambda: c[:m, :n], e2e, lambda: box[0], "int32", describe(GEMM_EX, case))


def padded_copy(cp: Any, x: Any, rows: int, cols: int) -> Any:
    """`x` as a C-contiguous rows × cols array, zero-padded; no copy when it already is one."""
    if tuple(x.shape) == (rows, cols):
        return cp.ascontiguousarray(x)
    z = cp.zeros((rows, cols), dtype=x.dtype)
    z[: x.shape[0], : x.shape[1]] = x
    return z


class GemmExTN:
    """cublasGemmEx for row-major int8 A (m × k) and Bᵀ (n × k) into row-major int32 C (m × n); m, n, k multiples of 4.

    cuBLAS is column-major: row-major C is column-major Cᵀ = Bᵀ·Aᵀ, so B goes first. Row-major Bᵀ (n × k) is a
    column-major k × n matrix with leading dimension k, transposed by OP_T into the n × k operand; row-major A is a
    column-major k × m matrix taken as it is (OP_N): the TN form, every leading dimension k or n."""

    def __init__(self, cp: Any, m: int, n: int, k: int):
        self.m, self.n, self.k = m, n, k
        self.cublas = cp.cuda.cublas
        self.handle = cp.cuda.device.get_cublas_handle()
        self.one, self.zero = np.array(1, dtype=np.int32), np.array(0, dtype=np.int32)  # host scalars, kept alive

    def __call__(self, a: Any, bt: Any, c: Any) -> None:
        cublas, m, n, k = self.cublas, self.m, self.n, self.k
        cublas.setPointerMode(self.handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", POINTER_MODE_HOST))
        cublas.gemmEx(  # CuPy sets the handle's stream to its current stream
            self.handle,
            getattr(cublas, "CUBLAS_OP_T", OP_T),
            getattr(cublas, "CUBLAS_OP_N", OP_N),
            n,
            m,
            k,
            self.one.ctypes.data,
            device_ptr(bt),
            CUDA_R_8I,
            k,
            device_ptr(a),
            CUDA_R_8I,
            k,
            self.zero.ctypes.data,
            device_ptr(c),
            CUDA_R_32I,
            n,
            getattr(cublas, "CUBLAS_COMPUTE_32I", COMPUTE_32I),
            getattr(cublas, "CUBLAS_GEMM_DEFAULT", GEMM_DEFAULT),
        )
