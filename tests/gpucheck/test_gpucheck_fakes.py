"""Stand-ins for CuPy, cuBLAS, torch and Triton that keep the real libraries' rules, and the tests that they do.

The GPU check's device side runs in CI on these: numpy dressed as CuPy, with CUDA events on a simulated device
clock, stream capture that records launches and replays them, and a cublasGemmEx and a torch._int_mm that refuse
what the real ones refuse (cuBLAS's int8 GEMM: CUBLAS_COMPUTE_32I with leading dimensions or sizes that are not
multiples of 4, and any layout but TN; torch._int_mm: m ≤ 16, k or n not multiples of 8, B row-major), so every
fallback path the check has runs here. What they cannot show is that the real libraries behave as documented;
the GPU run itself shows that.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from types import SimpleNamespace as NS

import ml_dtypes
import numpy as np
import pytest

from spatialc.runtime.tilize import bf16_to_float32, poison_value, tilize, untilize

LAUNCH_S = 0.02  # simulated device time of one launch: a few launches fill a batch, so the tests stay quick


class FakeError(RuntimeError):
    """What CuPy's CUBLASError and torch's RuntimeError say: the status in words."""


# ---- the device clock, streams and graphs -----------------------------------------------------------------------


class FakeEvent:
    """A CUDA event on the simulated device clock: `now` moves with each launch the device runs."""

    now = 0.0
    hang = False

    def record(self, stream=None):
        FakeEvent.now += 1e-6
        self.t = FakeEvent.now

    @property
    def done(self):
        return not FakeEvent.hang

    def synchronize(self):
        pass


class FakeGraph:
    def __init__(self, launches):
        self.launches = launches

    def launch(self, stream=None):
        for run in self.launches:
            run()


class FakeStream:
    def __init__(self, cp, ptr=7):
        self.cp, self.ptr = cp, ptr

    def use(self):
        self.cp.current = self
        return self

    def begin_capture(self, mode=None):
        if self.cp.capture_refused:
            raise FakeError(self.cp.capture_refused)
        self.cp.captured = []

    def end_capture(self):
        launches, self.cp.captured = self.cp.captured, None
        return FakeGraph(launches)


class FakeRandomState:
    def __init__(self, seed):
        self.rs = np.random.RandomState(seed)

    def randint(self, low, high, size):
        return self.rs.randint(low, high, size=size)

    def uniform(self, low, high, size, dtype):
        return self.rs.uniform(low, high, size=size).astype(dtype)


# ---- cuBLAS ----------------------------------------------------------------------------------------------------


def _colmajor(ptr, rows, cols, ld, ctype):
    """The rows × cols column-major matrix at address `ptr` with leading dimension `ld`, as a numpy view."""
    if ld < max(1, rows):
        raise FakeError("CUBLAS_STATUS_INVALID_VALUE")
    flat = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(ld * cols,))
    return flat.reshape(cols, ld)[:, :rows].T


def gemm_ex_refusal(transa, transb, m, n, k, a, atype, lda, b, btype, ldb, ctype, ldc, compute):
    """Why cublasGemmEx refuses an int8 call ('' when it takes it): CUBLAS_COMPUTE_32I needs 4-byte aligned A and B
    with leading dimensions that are multiples of 4 (the cuBLAS guide, cublasGemmEx); its int8 (IMMA) kernels take
    TN only, with m, k and ldc multiples of 4 (ibid., cublasLtMatmul's IMMA requirements). The stand-in holds every
    call to all of these, so that only the path the check takes passes."""
    if (atype, btype, ctype, compute) != (3, 3, 10, 72):
        return "CUBLAS_STATUS_NOT_SUPPORTED: only CUDA_R_8I × CUDA_R_8I → CUDA_R_32I with CUBLAS_COMPUTE_32I here"
    if a % 4 or b % 4 or lda % 4 or ldb % 4:
        return "CUBLAS_STATUS_NOT_SUPPORTED: CUBLAS_COMPUTE_32I needs 4-byte aligned A, B and lda, ldb multiples of 4"
    if (transa, transb) != (1, 0):
        return "CUBLAS_STATUS_NOT_SUPPORTED: int8 GEMM takes the TN layout only"
    if m % 4 or k % 4 or ldc % 4:
        return "CUBLAS_STATUS_NOT_SUPPORTED: int8 GEMM needs m, k and ldc multiples of 4"
    return ""


def make_gemm_ex(cp):
    def gemm_ex(
        handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc, compute, algo
    ):
        if cp.captured is not None:  # CuPy's cuBLAS bindings refuse a call while the stream captures (CuPy 14)
            raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
        why = gemm_ex_refusal(transa, transb, m, n, k, a, atype, lda, b, btype, ldb, ctype, ldc, compute)
        if why:
            raise FakeError(why)
        one, zero = ctypes.c_int32.from_address(alpha).value, ctypes.c_int32.from_address(beta).value
        op_a = _colmajor(a, k, m, lda, ctypes.c_int8).T if transa == 1 else _colmajor(a, m, k, lda, ctypes.c_int8)
        op_b = _colmajor(b, n, k, ldb, ctypes.c_int8).T if transb == 1 else _colmajor(b, k, n, ldb, ctypes.c_int8)
        out = _colmajor(c, m, n, ldc, ctypes.c_int32)
        product = one * (op_a.astype(np.int64) @ op_b.astype(np.int64))

        def run():
            out[...] = product + zero * out

        cp.launch(run)

    return gemm_ex


# ---- CuPy --------------------------------------------------------------------------------------------------------


class FakeCupy(type(sys)):
    """numpy, with the parts of CuPy's API the check touches; `launch` runs device work (or records it while a
    stream captures) and moves the device clock."""

    def __init__(self):
        super().__init__("cupy")
        props = {
            "name": b"Fake H200",
            "multiProcessorCount": 132,
            "totalGlobalMem": 2**30,
            "l2CacheSize": 16 << 10,
            "clockRate": 1980000,
            "memoryClockRate": 2619000,
        }
        self.__version__ = "fake"
        self.props = props
        self.freed = 0
        self.launches = 0
        self.captured = None
        self.capture_refused = ""
        self.current = None
        self.modules = []
        self.cuda = NS(
            runtime=NS(
                getDeviceCount=lambda: 1,
                getDevice=lambda: 0,
                getDeviceProperties=lambda d: self.props,
                driverGetVersion=lambda: 13000,
            ),
            Device=lambda *a: NS(compute_capability="90"),
            Event=FakeEvent,
            Stream=lambda non_blocking=False: FakeStream(self),
            ExternalStream=lambda ptr, device_id=-1: FakeStream(self, ptr),
            get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
            cublas=NS(
                gemmEx=make_gemm_ex(self),
                setPointerMode=lambda h, mode: None,
                setStream=lambda h, ptr: None,
                CUBLAS_OP_N=0,
                CUBLAS_OP_T=1,
                CUBLAS_POINTER_MODE_HOST=0,
                CUBLAS_COMPUTE_32I=72,
                CUBLAS_GEMM_DEFAULT=-1,
            ),
            device=NS(get_cublas_handle=lambda: 1),
        )
        self.random = NS(RandomState=FakeRandomState)

    def launch(self, run):
        """Device work: recorded while a stream captures, else done now (and the clock moves)."""
        if self.captured is not None:
            self.captured.append(lambda: self.launch(run))
            return
        self.launches += 1
        FakeEvent.now += LAUNCH_S
        run()

    def copyto(self, dst, src):
        """A device-to-device copy: CuPy's is a kernel on the stream, captured into a graph like any other."""
        self.launch(lambda: np.copyto(dst, src))

    def asarray(self, x, dtype=None):
        """Host data to the device. Inside a stream capture CuPy stages it through a pinned buffer it recycles once
        the capture ends, so a replay copies whatever that buffer holds by then: the stand-in refuses it outright."""
        if self.captured is not None and isinstance(x, list | tuple):
            raise FakeError("a host-to-device copy captured into a graph replays from a recycled staging buffer")
        return np.asarray(x, dtype=dtype)

    def RawModule(self, path=None, **kw):  # noqa: N802 - CuPy's name
        self.modules.append(path)
        return NS(get_function=lambda symbol: NS(path=path, symbol=symbol))

    def get_default_memory_pool(self):
        return NS(free_all_blocks=lambda: setattr(self, "freed", self.freed + 1))

    def from_dlpack(self, t):
        return t.a

    def asnumpy(self, x):
        return np.asarray(x)

    def __getattr__(self, name):
        return getattr(np, name)


# ---- torch -----------------------------------------------------------------------------------------------------


class FakeDtype:
    def __init__(self, name, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)

    def __repr__(self):
        return f"torch.{self.name}"


class FakeTensor:
    """A torch tensor on the fake GPU: a numpy array (a view, strides kept) and a dtype."""

    def __init__(self, torch, a):
        self.torch, self.a = torch, a
        self.device = NS(type="cuda")

    @property
    def dtype(self):
        return self.torch.dtype_of(self.a.dtype)

    @property
    def shape(self):
        return self.a.shape

    def size(self, dim):
        return self.a.shape[dim]

    def dim(self):
        return self.a.ndim

    def stride(self, dim=None):
        strides = tuple(s // self.a.itemsize for s in self.a.strides)
        return strides if dim is None else strides[dim]

    def t(self):
        return FakeTensor(self.torch, self.a.T)

    def contiguous(self):
        return FakeTensor(self.torch, np.ascontiguousarray(self.a))

    def view(self, dtype):
        return FakeTensor(self.torch, self.a.view(dtype.np))

    def reshape(self, *shape):
        return FakeTensor(self.torch, self.a.reshape(shape))

    def transpose(self, i, j):
        return FakeTensor(self.torch, self.a.swapaxes(i, j))

    def __getitem__(self, index):
        return FakeTensor(self.torch, self.a[index])

    def __add__(self, other):
        return self.torch.add(self, other)

    def __mul__(self, other):
        return self.torch.mul(self, other)

    def abs(self):
        return self.torch._elementwise(np.abs, (self,), None)

    def amax(self, dim, keepdim=False):
        return self.torch._reduced(lambda v: np.max(v, axis=dim, keepdims=keepdim), self)

    def sum(self, dim, keepdim=False):
        return self.torch._reduced(lambda v: np.sum(v, axis=dim, keepdims=keepdim, dtype=np.float32), self)

    def copy_(self, src):
        """A device-to-device copy, as torch's copy_ of a tensor of the same dtype and shape is (a memcpy)."""
        if src.a.dtype != self.a.dtype or src.a.shape != self.a.shape:
            raise FakeError("the stand-in copies between tensors of one dtype and shape")
        target = self.a
        self.torch.cp.launch(lambda: np.copyto(target, src.a))
        return self


class FakeTorch(type(sys)):
    """torch's CUDA matmul and _int_mm as the real ones take them: _int_mm refuses what aten's _int_mm_out_cuda
    refuses (m ≤ 16, k or n not positive multiples of 8, a result that is not int32, contiguous and m × n) and what
    cuBLASLt refuses on GPUs without the NN int8 kernels (B row-major: CUBLAS_STATUS_NOT_SUPPORTED)."""

    def __init__(self, cp):
        super().__init__("torch")
        self.cp = cp
        self.__version__ = "fake"
        for name, dt in [
            ("uint8", np.uint8),
            ("int8", np.int8),
            ("int16", np.int16),
            ("int32", np.int32),
            ("float16", np.float16),
        ]:
            setattr(self, name, FakeDtype(name, dt))
        self.float32 = FakeDtype("float32", np.float32)
        self.bfloat16 = FakeDtype("bfloat16", ml_dtypes.bfloat16)
        self.float8_e4m3fn = FakeDtype("float8_e4m3fn", ml_dtypes.float8_e4m3fn)
        self.float8_e5m2 = FakeDtype("float8_e5m2", ml_dtypes.float8_e5m2)
        self.nn_int8 = False  # whether cuBLASLt here takes B row-major
        self.capture_refused = ""  # what torch says when its calls are captured (nothing: they are captured)
        self.wrong_above = None  # matmul results of more rows than this come back off by one (a planted fault)
        # torch's elementwise ops and norms (F.silu, F.gelu, softmax, log_softmax, F.rms_norm and the aten out= forms
        # there are): computed in float32, as torch's kernels compute fp16, bf16 and float32, and rounded once to the
        # inputs' type.
        self.nn = NS(
            functional=NS(
                silu=self._silu,
                gelu=self._gelu,
                rms_norm=self._rms_norm,
                layer_norm=self._layer_norm,
                scaled_dot_product_attention=self._sdpa,
            ),
            attention=NS(
                SDPBackend=NS(FLASH_ATTENTION="flash", EFFICIENT_ATTENTION="efficient", CUDNN_ATTENTION="cudnn"),
                sdpa_kernel=self._sdpa_kernel,
            ),
        )
        self.sdpa_backend = None  # the backend sdpa_kernel holds SDPA to
        self.sdpa_missing = {"cudnn"}  # backends with no kernel here: SDPA under them fails as torch's does
        self.sdpa_skew = 0.0  # added to every element of SDPA's O (a planted fault)
        self.ops = NS(
            aten=NS(
                silu=NS(out=self._silu),
                gelu=NS(out=self._gelu),
                _softmax=NS(out=self._softmax_out),
                _log_softmax=NS(out=self._log_softmax_out),
            )
        )
        self.cuda = NS(
            is_available=lambda: True,
            Stream=lambda: NS(cuda_stream=7),
            set_stream=lambda s: None,
            current_stream=lambda: NS(cuda_stream=7),
            empty_cache=lambda: None,
        )

    def dtype_of(self, np_dtype):
        kinds = (self.float8_e4m3fn, self.float8_e5m2)
        for d in (self.uint8, self.int8, self.int16, self.int32, self.float16, self.float32, self.bfloat16, *kinds):
            if d.np == np_dtype:
                return d
        raise TypeError(f"no torch dtype for {np_dtype}")

    def from_dlpack(self, x):
        return FakeTensor(self, x)

    def cat(self, tensors):
        return FakeTensor(self, np.concatenate([t.a for t in tensors]))

    def tensor(self, values, dtype, device=None):
        return FakeTensor(self, np.array(values, dtype=dtype.np))

    def _grouped_mm(self, a, b, offs):
        """torch's grouped GEMM: A's rows packed group after group (ends at `offs`), B one matrix a group."""
        ends = [int(x) for x in offs.a]
        product = np.concatenate(
            [
                a.a[s:e].astype(np.float64) @ b.a[g].astype(np.float64)
                for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True))
            ]
        )
        return self._result(product.astype(np.float32), None, a.dtype)

    def empty(self, shape, dtype, device=None):
        return FakeTensor(self, np.empty(shape, dtype=dtype.np))

    def _result(self, value, out, dtype):
        if self.cp.captured is not None and (out is None or self.capture_refused):
            raise FakeError(self.capture_refused or "CUDA error: operation not permitted when stream is capturing")
        if out is None:
            out = self.empty(value.shape, dtype)
        target = out.a

        def run():
            target[...] = value.astype(dtype.np)

        self.cp.launch(run)
        return out

    def _elementwise(self, f, tensors, out):
        """f of the tensors' float32 values, computed when the device runs it (a captured graph replays it on the
        values then), rounded once to the first tensor's type; into `out`, or a tensor it allocates (refused while
        a stream captures, as the caching allocator's cudaMalloc is)."""
        dtype = tensors[0].dtype
        if any(t.dtype is not dtype for t in tensors) or dtype not in (self.float16, self.bfloat16, self.float32):
            raise FakeError(f"the stand-in maps float tensors of one type, not {[t.dtype for t in tensors]}")
        if self.cp.captured is not None and out is None:
            raise FakeError("CUDA error: operation not permitted when stream is capturing")
        out = self.empty(tensors[0].shape, dtype) if out is None else out
        target = out.a

        def run():
            target[...] = f(*(t.a.astype(np.float32) for t in tensors)).astype(np.float32).astype(dtype.np)

        self.cp.launch(run)
        return out

    def _reduced(self, f, x):
        """f (a reduction along a dimension) of x's float32 values, in float32 as torch reduces fp16 and bf16,
        rounded once to x's type, into a tensor it allocates (refused while a stream captures)."""
        if x.dtype not in (self.float16, self.bfloat16, self.float32):
            raise FakeError(f"the stand-in reduces float tensors, not {x.dtype}")
        if self.cp.captured is not None:
            raise FakeError("CUDA error: operation not permitted when stream is capturing")
        out = self.empty(f(np.zeros(x.shape, np.float32)).shape, x.dtype)
        target = out.a

        def run():
            target[...] = f(x.a.astype(np.float32)).astype(np.float32).astype(x.dtype.np)

        self.cp.launch(run)
        return out

    def add(self, a, b, out=None):
        return self._elementwise(np.add, (a, b), out)

    def mul(self, a, b, out=None):
        return self._elementwise(np.multiply, (a, b), out)

    def _silu(self, x, out=None):
        return self._elementwise(lambda v: v / (np.float32(1) + np.exp(-v)), (x,), out)

    def _gelu(self, x, approximate="none", out=None):
        if approximate != "tanh":
            raise FakeError("the stand-in's gelu is the tanh form only")
        c = np.float32(0.7978845608028654)
        return self._elementwise(lambda v: 0.5 * v * (1 + np.tanh(c * (v + np.float32(0.044715) * v**3))), (x,), out)

    def softmax(self, x, dim):
        return self._softmax_out(x, dim, False)

    def _softmax_out(self, x, dim, half_to_float, out=None):
        if dim != -1 or half_to_float:
            raise FakeError("the stand-in's softmax is along the last dimension, in the input's type")
        return self._elementwise(_softmax_rows, (x,), out)

    def log_softmax(self, x, dim):
        return self._log_softmax_out(x, dim, False)

    def _log_softmax_out(self, x, dim, half_to_float, out=None):
        if dim != -1 or half_to_float:
            raise FakeError("the stand-in's log_softmax is along the last dimension, in the input's type")
        return self._elementwise(_log_softmax_rows, (x,), out)

    def logsumexp(self, x, dim, keepdim=False):
        """torch.logsumexp: max + log Σ exp(x − max) of each row, in float32, rounded once to x's type."""
        if dim != -1:
            raise FakeError("the stand-in's logsumexp is along the last dimension")

        def f(v):
            peak = np.max(v, axis=-1, keepdims=True)
            return peak + np.log(np.sum(np.exp(v - peak), axis=-1, keepdims=True))

        return self._reduced(lambda v: f(v) if keepdim else f(v)[..., 0], x)

    def _rms_norm(self, x, normalized_shape, weight, eps):
        if tuple(normalized_shape) != x.shape[-1:]:
            raise FakeError("the stand-in's rms_norm normalises the last dimension")
        return self._elementwise(
            lambda v, w: v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * w, (x, weight), None
        )

    def _layer_norm(self, x, normalized_shape, weight, bias, eps):
        if tuple(normalized_shape) != x.shape[-1:]:
            raise FakeError("the stand-in's layer_norm normalises the last dimension")

        def f(v, w, b):
            mean = np.mean(v, axis=-1, keepdims=True)
            return (v - mean) / np.sqrt(np.mean((v - mean) ** 2, axis=-1, keepdims=True) + eps) * w + b

        return self._elementwise(f, (x, weight, bias), None)

    def matmul(self, a, b, out=None):
        if a.dtype is not b.dtype or a.dtype not in (self.float16, self.bfloat16):
            raise FakeError(f"the stand-in multiplies fp16 or bf16, not {a.dtype} and {b.dtype}")
        product = a.a.astype(np.float64) @ b.a.astype(np.float64)
        if self.wrong_above is not None and a.size(0) > self.wrong_above:
            product += 1.0
        return self._result(product.astype(np.float32), out, a.dtype)

    def mm(self, a, b, out=None):
        """torch.mm: the 2-D matmul (the W4A16 rows' baseline)."""
        return self.matmul(a, b, out)

    def _scaled_mm(
        self, a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False, out=None
    ):
        """cuBLASLt's fp8 GEMM as aten's _scaled_mm takes it: the float64 product of the 8-bit values times the
        scales (scalar or rowwise), rounded once to out_dtype."""
        why = scaled_mm_refusal(self, a, b, scale_a, scale_b, out_dtype, out)
        if why:
            raise FakeError(why)
        product = a.a.astype(np.float64) @ b.a.astype(np.float64)
        product = product * scale_a.a.astype(np.float64) * scale_b.a.astype(np.float64)
        return self._result(product.astype(np.float32), out, out_dtype or self.float32)

    @contextlib.contextmanager
    def _sdpa_kernel(self, backend):
        self.sdpa_backend = backend
        try:
            yield
        finally:
            self.sdpa_backend = None

    def _sdpa(self, q, k, v, is_causal=False):
        """F.scaled_dot_product_attention of (b, h, s, d) tensors: softmax attention in float64 (causal aligned top
        left, as torch's), rounded once to the inputs' type; under a backend with no kernel here, torch's error."""
        if self.sdpa_backend in self.sdpa_missing:
            raise FakeError("No available kernel. Aborting execution.")
        q64, k64, v64 = (x.a.astype(np.float64) for x in (q, k, v))
        s = q64 @ k64.swapaxes(-1, -2) / np.sqrt(q64.shape[-1])
        if is_causal:
            s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        o = (p / p.sum(axis=-1, keepdims=True)) @ v64 + self.sdpa_skew
        return self._result(o.astype(np.float32), None, q.dtype)

    def _int_mm(self, a, b, out=None):
        why = int_mm_refusal(self, a, b, out)
        if why:
            raise FakeError(why)
        product = a.a.astype(np.int64) @ b.a.astype(np.int64)
        return self._result(product, out, self.int32)


def _softmax_rows(v):
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_softmax_rows(v):
    shifted = v - v.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def int_mm_refusal(torch, a, b, out):
    """Why torch._int_mm refuses its arguments ('' when it takes them), in aten's words."""
    if a.dim() != 2 or b.dim() != 2:
        return "Expected self and mat2 to be of dimension 2"
    if a.dtype is not torch.int8 or b.dtype is not torch.int8:
        return f"Expected self and mat2 to be int8, got {a.dtype} and {b.dtype}"
    if a.size(0) <= 16:
        return f"self.size(0) needs to be greater than 16, but got {a.size(0)}"
    if a.size(1) <= 0 or a.size(1) % 8:
        return f"self.size(1) needs to be greater than 0 and a multiple of 8, but got {a.size(1)}"
    if a.size(1) != b.size(0):
        return f"self.size(1) needs to match mat2.size(0) but got {a.size(1)} and {b.size(0)}"
    if b.size(1) <= 0 or b.size(1) % 8:
        return f"mat2.size(1) needs to be greater than 0 and a multiple of 8, but got {b.size(1)}"
    if out is not None and (out.dtype is not torch.int32 or out.shape != (a.size(0), b.size(1))):
        return "Expected result of dtype int32 and shape m × n"
    if out is not None and not out.a.flags.c_contiguous:
        return "Expected result to be contiguous."
    if b.stride(1) == 1 and b.size(1) > 1 and not torch.nn_int8:
        return "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul(ltHandle, computeDesc...)"
    return ""


def scaled_mm_refusal(torch, a, b, scale_a, scale_b, out_dtype, out):
    """Why torch._scaled_mm refuses its arguments ('' when it takes it), in aten's words (aten/src/ATen/native/cuda/
    Blas.cpp): 8-bit float operands, not both e5m2; mat1 row-major, mat2 column-major; sides multiples of 16; float32
    scales, both scalars (tensorwise) or (M, 1) and (1, N) (rowwise, bf16 out only); out of out_dtype and m × n."""
    kinds = (torch.float8_e4m3fn, torch.float8_e5m2)
    if a.dtype not in kinds or b.dtype not in kinds:
        return f"Expected both inputs to be fp8 types but got self.dtype={a.dtype} and mat2.dtype={b.dtype}"
    if a.dtype is torch.float8_e5m2 and b.dtype is torch.float8_e5m2:
        return "Multiplication of two Float8_e5m2 matrices is not supported"
    if a.stride(1) != 1 or b.stride(0) != 1:
        return "mat1 must be row_major and mat2 must be col_major"
    if a.size(0) % 16 or a.size(1) % 16 or b.size(1) % 16:
        return f"Expected both dimensions of mat1 and mat2 to be divisble by 16, got {a.shape} and {b.shape}"
    if scale_a.dtype is not torch.float32 or scale_b.dtype is not torch.float32:
        return "Both scale_a and scale_b must be float (fp32) tensors."
    sizes = (scale_a.a.size, scale_b.a.size)
    rowwise = scale_a.shape == (a.size(0), 1) and scale_b.shape == (1, b.size(1))
    if sizes != (1, 1) and not rowwise:
        return "Invalid scaling configuration: tensorwise scales of one element, or rowwise (M, 1) and (1, N)"
    if rowwise and out_dtype is not torch.bfloat16:
        return "Only bf16 high precision output types are supported for row-wise scaling."
    if out is not None and (out.dtype is not out_dtype or out.shape != (a.size(0), b.size(1))):
        return "Expected out of out_dtype and shape m × n"
    return ""


class FakeTriton:
    """The Triton matmul: row-major in, C in `out`'s type; `refuse` is what its compiler says, if anything."""

    VERSION = "fake"

    def __init__(self, cp):
        self.cp, self.refuse = cp, ""

    def matmul(self, a, b, out, precision):
        if self.refuse:
            raise FakeError(self.refuse)
        product = a.a.astype(np.float64) @ b.a.astype(np.float64)
        target = out.a

        def run():
            target[...] = product.astype(np.float32).astype(target.dtype) if precision != "int8" else product

        self.cp.launch(run)
        return out


# ---- spatialc's kernel -------------------------------------------------------------------------------------------


class FakeKernel:
    """The product a correct kernel computes, stored in C's type and layout; `fault` plants a missed element, a hang, an
    illegal address or a plain failure — in every kernel, or (a tuple: the fault, then where) only in the kernels
    that match each of where: the `MxN` of their C, their name (`spatialc_general`) or their dynamic shared memory
    (`smem181248`: one plan of a sweep)."""

    def __init__(
        self,
        cp,
        args,
        fault,
        name="spatialc_persistent",
        dyn_smem=0,
        sync=(),
        trip_error=-1,
        mapped=None,
        rows=None,
        fused=None,
        attention=None,
        w4=False,
        narrowed=False,
    ):
        if isinstance(fault, tuple):
            c = next(a for a in args if a.role == "output")
            here = {"x".join(map(str, c.elems)), name, f"smem{dyn_smem}"}
            fault = fault[0] if set(fault[1:]) <= here else None
        self.cp, self.args, self.fault, self.sync, self.trip_error = cp, args, fault, tuple(sync), trip_error
        self.mapped = mapped  # a map kernel's formula (`map_formula`): it computes that, with no matmul
        self.rows = rows  # a row program's (`row_program`): it computes that, as the reference does
        self.fused = fused  # a GEMM whose epilogue reads tensors of its own (`fused_program`): likewise
        self.attention = attention  # an attention kernel's causal flag (`attention_of`): it computes O and LSE
        self.w4 = w4  # a W4A16 kernel (packed 4-bit weights): it decodes their bytes and dequantises (`_w4`)
        # Its text loads a page element through bf16 (NARROWED_LOAD): a float32 input's values rounded to bf16.
        self.narrowed = narrowed

    def __call__(self, buffers):
        self.cp.launch(lambda: self._compute(buffers))

    def _handshake(self, buffers):
        """A kernel whose sites hand over by sync words (passed after its tensors and work list) waits for ever on
        words not reset to their initial values; it leaves them moved on, as arrival counts and semaphores do."""
        if not self.sync:
            return
        words = buffers[len(self.args) + 1]
        if not np.array_equal(words, self.sync):
            FakeEvent.hang = True
        moved = np.ones_like(words)
        if self.trip_error >= 0:  # the flag and count of a loop bound read from data: left as the run found them
            moved[self.trip_error : self.trip_error + 2] = 0
        words += moved

    def _compute(self, buffers):
        from spatialc.runtime.tilize import bf16_bits

        self._handshake(buffers)
        if self.mapped is not None:
            self._map(buffers)
            return
        if self.rows is not None:
            self._rows(buffers)
            return
        if self.fused is not None:
            self._fused(buffers)
            return
        if self.attention is not None:
            self._attention(buffers)
            return
        if self.w4:
            self._w4(buffers)
            return
        if self.args[0].groups > 1:
            self._grouped(buffers)
            return
        a_arg, b_arg, c_arg = self.args[:3]
        vals = []
        for arg, buf in zip((a_arg, b_arg), buffers[:2], strict=True):
            x = untilize(buf, arg.tiles, (arg.tiles[0] * 16, arg.tiles[1] * 16), np, order=arg.order)
            vals.append(bf16_to_float32(x, np).astype(np.float64) if arg.storage == "uint16" else x.astype(np.float64))
        c = vals[0] @ vals[1]
        c = bf16_bits(c.astype(np.float32), np) if c_arg.storage == "uint16" else c.astype(c_arg.storage)
        out = buffers[2]
        out[:] = tilize(c, c_arg.tiles, np, order=c_arg.order)
        if self.fault == "miss":
            out[17] = poison_value(c_arg.storage)
        if self.fault == "hang":
            FakeEvent.hang = True
        if self.fault == "illegal":
            raise FakeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
        if self.fault == "fails":
            raise FakeError("CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")

    def _map(self, buffers):
        """A map's kernel: its formula as the table defines it (each op in float64 from float32 operands, rounded
        once to float32: `numerics.elementwise.evaluate`) on every element of its tiled inputs, padding included, C
        rounded to its type; `fault` "miss" leaves element 17 poisoned, "skew" makes element 5 half as large again."""
        from spatialc.numerics.elementwise import evaluate
        from spatialc.runtime.tilize import bf16_bits

        at, c_arg = next((i, a) for i, a in enumerate(self.args) if a.role == "output")
        full = (c_arg.tiles[0] * 16, c_arg.tiles[1] * 16)
        pages = []
        for arg, buf in zip(self.args, buffers, strict=False):  # buffers in parameter order, the work list after
            if arg.role != "input":
                continue
            x = untilize(buf, arg.tiles, full, np, order=arg.order)
            pages.append(self._read(x, arg))
        with np.errstate(all="ignore"):
            c = np.asarray(evaluate(self.mapped, pages, False), np.float32)
        if self.fault == "skew":
            c.reshape(-1)[5] *= np.float32(1.5)
        c = bf16_bits(c, np) if c_arg.storage == "uint16" else c.astype(c_arg.storage)
        out = buffers[at]
        out[:] = tilize(c, c_arg.tiles, np, order=c_arg.order)
        if self.fault == "miss":
            out[17] = poison_value(c_arg.storage)
        if self.fault == "hang":
            FakeEvent.hang = True

    def _read(self, x, arg):
        """An input's page values as the kernel's loads read them: float32 (bf16 from its bits), a float32 input's
        rounded to bf16 where the text narrows its page loads (`narrowed`)."""
        from spatialc.runtime.tilize import bf16_bits

        v = _float32_of(x, arg)
        return bf16_to_float32(bf16_bits(v, np), np) if self.narrowed and arg.storage == "float32" else v

    def _rows(self, buffers):
        """A row program's kernel (softmax, log_softmax, RMSNorm, LayerNorm, a row reduction): the program its text
        computes (`row_program`) as the reference computes it (each op rounded to float32, each row sum exactly
        rounded: `numerics.reference.reference`) on its inputs and parameters, each output rounded to its type and
        its padding zero; `fault` as in `_map` (on the first
        output), or "swap": a program of several outputs' second and third stored in each other's buffers, or
        "rstd": its last output's element 3 off by a part in a thousand, or "first": its second output stored from
        the first's values (fused add + RMSNorm's residual_out from out's)."""
        from spatialc.numerics.reference import reference
        from spatialc.runtime.tilize import bf16_bits

        values = {}
        for arg, buf in zip(self.args, buffers, strict=False):  # buffers in parameter order, the work list after
            if arg.role in ("input", "parameter"):
                x = untilize(buf, arg.tiles, arg.elems, np, order=arg.order)
                values[arg.name] = self._read(x, arg) if arg.role == "input" else _float32_of(x, arg).reshape(-1)
        with np.errstate(all="ignore"):
            got = reference(self.rows, values)
        outs = [(i, a) for i, a in enumerate(self.args) if a.role == "output"]
        got = got if isinstance(got, dict) else {outs[0][1].name: got}
        if self.fault == "swap":
            (_, second), (_, third) = outs[1:3]
            got = {**got, second.name: got[third.name], third.name: got[second.name]}
        if self.fault == "first":
            got = {**got, outs[1][1].name: got[outs[0][1].name]}
        for n, (at, c_arg) in enumerate(outs):
            c = np.array(got[c_arg.name], np.float32)
            if self.fault == "skew" and n == 0:
                c.reshape(-1)[5] *= np.float32(1.5)
            if self.fault == "rstd" and n == len(outs) - 1:
                c.reshape(-1)[3] *= np.float32(1.001)
            c = bf16_bits(c, np) if c_arg.storage == "uint16" else c.astype(c_arg.storage)
            buffers[at][:] = tilize(c, c_arg.tiles, np, order=c_arg.order)
        if self.fault == "miss":
            buffers[outs[0][0]][17] = poison_value(outs[0][1].storage)
        if self.fault == "hang":
            FakeEvent.hang = True

    def _fused(self, buffers):
        """A GEMM with scales and a residual in its epilogue: the program as the reference computes it (the float64
        product, the epilogue in float32) on its tiled tensors, C rounded to its type; `fault` "residual" leaves the
        residual out, "col_scale" the column scale, "miss" leaves element 17 poisoned, "hang" never finishes."""
        from spatialc.numerics.reference import reference
        from spatialc.runtime.tilize import bf16_bits

        values = {}
        for arg, buf in zip(self.args, buffers, strict=False):  # buffers in parameter order, the work list after
            if arg.role in ("input", "parameter"):
                x = untilize(buf, arg.tiles, arg.elems, np, order=arg.order)
                values[arg.name] = _float32_of(x, arg)
        if self.fault == "residual":
            values["residual"] = np.zeros_like(values["residual"])
        if self.fault == "col_scale":  # an fp8 row's dequant scale left out
            values["col_scale"] = np.ones_like(values["col_scale"])
        if self.fault == "scale_b":  # a block-scaled row's B scales of the wrong K group
            values["scale_b"] = values["scale_b"][::-1].copy()
        c = np.asarray(reference(self.fused, values), np.float32)
        at, c_arg = next((i, a) for i, a in enumerate(self.args) if a.role == "output")
        c = bf16_bits(c, np) if c_arg.storage == "uint16" else c.astype(c_arg.storage)
        buffers[at][:] = tilize(c, c_arg.tiles, np, order=c_arg.order)
        if self.fault == "miss":
            buffers[at][17] = poison_value(c_arg.storage)
        if self.fault == "hang":
            FakeEvent.hang = True

    def _attention(self, buffers):
        """An attention kernel: O and LSE of each head as numerics.attention's declaration computes them (float64,
        scale 1/√head_dim), each rounded to its type; `fault` "miss" leaves O's element 17 poisoned, "skew" moves
        every element of O by 0.05."""
        from spatialc.numerics.attention import softmax_attention
        from spatialc.runtime.tilize import bf16_bits

        q, k, v = (
            _float32_of(untilize(buf, a.tiles, a.elems, np, order=a.order, groups=a.groups), a).astype(np.float64)
            for a, buf in zip(self.args[:3], buffers[:3], strict=True)
        )
        o, lse = softmax_attention(q, k, v, q.shape[-1] ** -0.5, self.attention)
        o = o + (0.05 if self.fault == "skew" else 0.0)
        for arg, buf, x in zip(self.args[3:5], buffers[3:5], (o, lse), strict=True):
            x32 = x.astype(np.float32)
            stored = bf16_bits(x32, np) if arg.storage == "uint16" else x32.astype(arg.storage)
            buf[:] = tilize(stored, arg.tiles, np, order=arg.order, groups=arg.groups)
        if self.fault == "miss":
            buffers[3][17] = poison_value(self.args[3].storage)

    def _w4(self, buffers):
        """A W4A16 kernel: its packed weights' bytes decoded by the launcher's layout (runtime/w4_args.py, read
        backwards), dequantised by numerics.w4.dequant with its scales and zero points, A @ B in float64, C rounded
        to its type; `fault` "zeros" leaves the zero points out, "miss" leaves element 17 poisoned."""
        from spatialc.numerics import w4
        from spatialc.runtime.tilize import quantize
        from spatialc.runtime.w4_args import PACKED_TILE, TILE_ORDER

        by = {a.name: (a, buffers[i]) for i, a in enumerate(self.args)}
        (ka, a), (kb, b), (ks, s), (kc, c) = by["A"], by["B"], by["scale"], by["C"]
        (k, n), tiles = kb.elems, kb.tiles
        row_major = np.empty((b.size // 128, 128), np.uint8)
        row_major[:, TILE_ORDER] = b.reshape(-1, 128)  # each tile's bytes back in row-major order
        pairs = untilize(row_major.reshape(-1), tiles, (tiles[0] * 8, tiles[1] * 16), np, PACKED_TILE)
        codes = np.empty((tiles[0] * 16, tiles[1] * 16), np.uint8)
        codes[0::2], codes[1::2] = pairs & 15, pairs >> 4
        fmt = {"int4": "int4", "uint4": "uint4"}.get(kb.elem, "mxfp4")
        q = w4.from_codes(codes[:k, :n], w4.format_dtype(fmt)).astype(np.float64)
        scale = untilize(s, ks.tiles, ks.elems, np)
        if ks.elem == "bfloat16":
            scale = bf16_to_float32(scale, np)
        elif ks.elem == "float8_e8m0fnu":
            scale = 2.0 ** (scale.astype(np.float64) - 127)
        zero = None
        if "zeros" in by and self.fault != "zeros":
            kz, z = by["zeros"]
            zero = untilize(z, kz.tiles, kz.elems, np)
            zero = (zero.view(np.int8) if kz.elem == "int4" else zero).astype(np.float64)
        d = w4.dequant_matrix(q, scale.astype(np.float64), zero, k // ks.elems[0], "bf16")
        av = bf16_to_float32(untilize(a, ka.tiles, ka.elems, np, order=ka.order), np).astype(np.float64)
        c[:] = tilize(quantize(av @ d, kc.elem, np), kc.tiles, np, order=kc.order)
        if self.fault == "miss":
            c[17] = poison_value(kc.storage)

    def _grouped(self, buffers):
        """A grouped GEMM's kernel: each group's rows below its count (the `sizes` buffer) written, the rest left
        alone (`fault` "spill": one row past a count written too)."""
        from spatialc.runtime.tilize import bf16_bits

        a_arg, b_arg, c_arg, s_arg = self.args[:4]
        vals = []
        for arg, buf in zip((a_arg, b_arg), buffers[:2], strict=True):
            full = (arg.tiles[0] // arg.groups * 16, arg.tiles[1] * 16)
            x = untilize(buf, arg.tiles, full, np, order=arg.order, groups=arg.groups)
            vals.append(_float32_of(x, arg).astype(np.float64))
        counts = untilize(buffers[3], s_arg.tiles, (1, s_arg.elems[1]), np)[0]
        full_c = (c_arg.tiles[0] // c_arg.groups * 16, c_arg.tiles[1] * 16)
        c_now = untilize(buffers[2], c_arg.tiles, full_c, np, groups=c_arg.groups)
        c = vals[0] @ vals[1]
        scales = {a.name: (a, buf) for a, buf in zip(self.args, buffers, strict=False) if a.name.startswith("scale_")}
        if scales:  # a block-scaled grouped GEMM (gpucheck/groupedbs.py): each group's block-scaled sum
            from spatialc.gpucheck.blockscaled import reference as scaled_sum

            more = {}
            for name, (arg, buf) in scales.items():
                full = (arg.tiles[0] // arg.groups * 16, arg.tiles[1] * 16)
                x = untilize(buf, arg.tiles, full, np, groups=arg.groups)[:, : arg.elems[0], : arg.elems[1]]
                more[name] = x.astype(np.float64)
            (m, k), n = a_arg.elems, b_arg.elems[1]
            c = np.zeros_like(c)
            for g in range(a_arg.groups):
                each = {name: x[g] for name, x in more.items()}
                c[g, :m, :n] = scaled_sum(vals[0][g, :m, :k], vals[1][g, :k, :n], each, np)
        c = bf16_bits(c.astype(np.float32), np) if c_arg.storage == "uint16" else c.astype(c_arg.storage)
        for g, m in enumerate(counts):
            keep = m + 1 if self.fault == "spill" else m
            c_now[g, :keep] = c[g, :keep]
        buffers[2][:] = tilize(c_now, c_arg.tiles, np, groups=c_arg.groups)


def map_formula(kernel_cu):
    """The formula of a map kernel (a kernel with no matmul) from the word its Compute marker names its Map by
    (`// op:Compute:Map_mul_silu_x1_x0`: the ops and inputs in prefix order, `lower.census.stage_kind`); None for a
    kernel with a matmul. The stand-in kernel computes what the kernel's own text says it does (`printed_formula`)."""
    import re

    from spatialc.ir.ops import Apply, Arg
    from spatialc.numerics.elementwise import OPS

    if "op:Compute:MatmulTiles" in kernel_cu:
        return None
    found = re.search(r"// op:Compute:Map_(\w+)", kernel_cu)
    if found is None:
        return None
    words, at = found.group(1).split("_"), [0]

    def parse():
        word = words[at[0]]
        if word.startswith("x") and word[1:].isdigit():
            at[0] += 1
            return Arg(int(word[1:]))
        for name in sorted(OPS, key=len, reverse=True):  # gelu_tanh before gelu: the longest name that fits
            parts = name.split("_")
            if words[at[0] : at[0] + len(parts)] == parts:
                at[0] += len(parts)
                return Apply(name, tuple(parse() for _ in range(OPS[name].arity)))
        raise ValueError(f"the stand-in reads no formula {found.group(1)!r}")

    return printed_formula(parse(), kernel_cu, found.group(1))


NARROWED_LOAD = "(__nv_bfloat16)SPATIALC_PAGE_LD("  # a page element's load rounded through bf16 (a planted fault)


def printed_formula(expr, kernel_cu, word):
    """`expr`, a Map's formula, as the line of kernel text that computes it (`const float v = …;` in the block
    its marker `// op:Compute:Map_<word>` opens) takes it: a one-operand op whose call (`spatialc_log(`) the line
    lacks is not taken, its operand passing through — so a log printed away is computed without it. A map the text
    has no marker of (an online pass's exp, which the passes rewrite) is taken as declared."""
    from spatialc.ir.ops import Apply
    from spatialc.numerics.elementwise import OPS

    at = kernel_cu.find(f"// op:Compute:Map_{word}\n")
    if at < 0:
        return expr
    start = kernel_cu.index("const float v = ", at)
    line = kernel_cu[start : kernel_cu.index("\n", start)]

    def walk(e):
        if not isinstance(e, Apply):
            return e
        args = tuple(walk(a) for a in e.args)
        call = OPS[e.op].c.split("{")[0]
        if len(args) == 1 and call.startswith("spatialc_") and call not in line:
            return args[0]
        return Apply(e.op, args, e.params)

    return walk(expr)


def as_printed(program, kernel_cu):
    """A row program with each map's formula as its kernel's text computes it (`printed_formula`)."""
    import dataclasses

    from spatialc.ir.nodes import ComputeStage
    from spatialc.ir.ops import Map
    from spatialc.lower.census import stage_kind

    stages = []
    for stage in program.stages:
        op = stage.kind.op if isinstance(stage.kind, ComputeStage) else None
        if isinstance(op, Map):
            expr = printed_formula(op.expr, kernel_cu, stage_kind(op).removeprefix("Map_"))
            stage = dataclasses.replace(stage, kind=ComputeStage(Map(expr)))
        stages.append(stage)
    return dataclasses.replace(program, stages=tuple(stages))


def row_program(kernel_cu, args):
    """The program of a kernel that reduces rows, as its text computes it (`as_printed`): `_row_program`'s."""
    program = _row_program(kernel_cu, args)
    return None if program is None else as_printed(program, kernel_cu)


def _row_program(kernel_cu, args):
    """The program of a kernel that reduces rows — spatialc.softmax, spatialc.log_softmax, spatialc.rmsnorm,
    spatialc.layernorm or spatialc.row_reduce, told apart by the Map its last Compute marker names
    (`Map_div_exp_sub_x0_row1_row2`: softmax's quotient) or by its three outputs (LayerNorm's) or its one m × 1
    output (a row reduction's), the eps read from its text — at its arguments' shape and types; None for any other
    kernel."""
    import re

    import spatialc

    if "// op:Compute:RowReduce" not in kernel_cu:
        return None
    x, c = (next(a for a in args if a.role == role) for role in ("input", "output"))
    m, n = x.elems
    if c.elems == (m, 1) and sum(a.role == "output" for a in args) == 1:
        return spatialc.row_reduce(m, n, _row_op(kernel_cu), SPATIALC_TYPE[x.elem], out=SPATIALC_TYPE[c.elem])
    if "// op:Compute:Map_div_exp_sub_x0_row1_row2" in kernel_cu:
        return spatialc.softmax(m, n, SPATIALC_TYPE[x.elem], out=SPATIALC_TYPE[c.elem])
    if "// op:Compute:Map_sub_sub_x0_row1_row2" in kernel_cu and "// op:Compute:Map_log_row0" in kernel_cu:
        return spatialc.log_softmax(m, n, SPATIALC_TYPE[x.elem], out=SPATIALC_TYPE[c.elem])
    if sum(a.role == "output" for a in args) == 3:
        eps = re.search(r"spatialc_rsqrt\(spatialc_fadd\(spatialc_div\(v0, [^)]*\), ([-+.e0-9]+)f\)", kernel_cu)
        if eps is None:
            raise ValueError("the stand-in reads no LayerNorm eps from this kernel")
        names = {a.name for a in args if a.role == "parameter"}
        return spatialc.layernorm(
            m, n, SPATIALC_TYPE[x.elem], eps=float(eps.group(1)), weight="weight" in names, bias="bias" in names
        )
    eps = re.search(r"spatialc_div\(v1, [^)]*\), ([-+.e0-9]+)f\)", kernel_cu)
    if eps is None:
        raise ValueError("the stand-in reads no row program from this kernel")
    weight = any(a.role == "parameter" for a in args)
    residual = any(a.role == "input" and a.name == "residual" for a in args)  # fused add + RMSNorm
    return spatialc.rmsnorm(
        m,
        n,
        SPATIALC_TYPE[x.elem],
        eps=float(eps.group(1)),
        weight=weight,
        residual=residual,
        out=SPATIALC_TYPE[c.elem],
    )


def _row_op(kernel_cu):
    """A row reduction's op, as its kernel folds each value into a row's accumulator (a mean: a sum, then divided;
    a log-sum-exp: its max and sum kept running, then the map of the two)."""
    import re

    if "// op:Compute:Map_add_row0_log_row1" in kernel_cu:  # max + log Σ exp(x − max): the log-sum-exp's
        return "logsumexp"
    fold = re.search(r"racc_\d+\[q\] = (spatialc_\w+)\(racc_\d+\[q\], (.*)\);", kernel_cu)
    if fold is None:
        raise ValueError("the stand-in reads no row reduction from this kernel")
    if "// op:Compute:Map_div_row0_lit" in kernel_cu:
        return "mean"
    ops = {
        ("spatialc_fadd", "x"): "sum",
        ("spatialc_fadd", "spatialc_fmul(x, x)"): "sumsq",
        ("spatialc_max", "x"): "max",
        ("spatialc_min", "x"): "min",
        ("spatialc_max", "spatialc_abs(x)"): "absmax",
    }
    return ops[fold.groups()]


# Element types (the launcher's names) as spatialc names them.
SPATIALC_TYPE = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float32": "float32",
    "float8_e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
}


def _float32_of(x, arg):
    """A tiled tensor's values as float32: bf16 bits, 8-bit float bits (uint8 storage of an fp8 element) or numbers."""
    from spatialc.runtime.tilize import FP8_ELEMS, fp8_values

    if arg.storage == "uint16":
        return bf16_to_float32(x, np)
    if arg.elem == "float8_e8m0fnu":  # an MX scale's code e + 127
        return (2.0 ** (x.astype(np.float64) - 127)).astype(np.float32)
    if arg.elem in FP8_ELEMS:
        return fp8_values(x, arg.elem, np)
    return x.astype(np.float32)


def attention_of(kernel_cu, args):
    """An attention kernel's causal flag (its program's name, which heads its text, ends `_causal` where it is one);
    None for any other kernel (one whose arguments are not q, k, v, o and lse)."""
    if [a.name for a in args] != ["q", "k", "v", "o", "lse"]:
        return None
    return kernel_cu.split(":", 1)[0].endswith("_causal")


def fused_program(args):
    """The GEMM a kernel computes whose epilogue reads tensors of its own (row and column scales, a residual), from
    its arguments' names in parameter order, shapes and types; None for any other kernel."""
    import spatialc

    stages = {"row_scale": spatialc.row_scale, "col_scale": spatialc.col_scale, "residual": spatialc.residual}
    named = [a for a in args if a.name in stages]
    scaled = any(a.name == "scale_a" for a in args)  # a block-scaled GEMM (gpucheck/blockscaled.py)
    if not (named or scaled) or args[0].name != "A" or args[0].groups > 1:  # (grouped: `_grouped` scales it)
        return None
    a, b, c = args[:3]
    if scaled:
        kind, out = SPATIALC_TYPE[a.elem], SPATIALC_TYPE[c.elem]
        mx = next(x for x in args if x.name == "scale_a").elem == "float8_e8m0fnu"  # MXFP8's e8m0 scales
        return spatialc.gemm(
            a.elems[0], b.elems[1], a.elems[1], kind, out=out, scales="mx" if mx else ("1x128", "128x128")
        )
    epilogue = [stages[x.name]() for x in named]
    return spatialc.gemm(
        a.elems[0], b.elems[1], a.elems[1], SPATIALC_TYPE[a.elem], epilogue=epilogue, out=SPATIALC_TYPE[c.elem]
    )


class FakeDevice:
    """The launcher's device on the stand-in: its multiprocessors from the properties, each launch recorded."""

    def __init__(self, cp, state):
        self.cp, self.xp, self.state = cp, cp, state

    def upload(self, x):
        """Host bytes to the device (`launch.uploaded`'s 4-bit arguments laid out on the host), as they are."""
        return np.array(x), False

    @property
    def sms(self):
        return self.cp.props["multiProcessorCount"]

    def launch(self, kernel, grid, block, dyn_smem, args):
        self.state["grids"].append(grid)
        kernel(args)

    def occupancy(self, kernel, block, dyn_smem):
        """Blocks of a kernel one multiprocessor holds: `state["per_sm"]` (None: the device cannot say), else 1."""
        return self.state.get("per_sm", 1)

    def launch_cooperative(self, kernel, grid, block, dyn_smem, args):
        self.state.setdefault("cooperative", []).append(grid)
        self.launch(kernel, grid, block, dyn_smem, args)

    def tensor_map(self, buffer, dims, strides, box, elem, swizzle):
        """An sm_90a kernel's tensor map, refused where cuTensorMapEncodeTiled would refuse it (cuda.h: strides
        multiples of 16 bytes, box sides 1 to 256, the inner box a multiple of 16 bytes and within the swizzle's
        span of 32, 64 or 128 bytes) and where its last element lies past the buffer; the 128 bytes are the
        stand-in's zeros."""
        from spatialc.runtime.launch import TENSOR_MAP_DTYPE

        inner = box[0] * elem
        last = (dims[0] - 1) * elem + sum((d - 1) * s for d, s in zip(dims[1:], strides, strict=True)) + elem
        if any(s % 16 for s in strides) or not all(1 <= b <= 256 for b in box) or inner % 16:
            raise FakeError("CUDA_ERROR_INVALID_VALUE: cuTensorMapEncodeTiled")
        if swizzle not in (0, 32, 64, 128) or (swizzle and inner > swizzle) or last > buffer.nbytes:
            raise FakeError("CUDA_ERROR_INVALID_VALUE: cuTensorMapEncodeTiled")
        self.state.setdefault("tensor_maps", []).append((tuple(dims), tuple(strides), tuple(box), swizzle))
        return np.zeros(1, dtype=TENSOR_MAP_DTYPE)[0]


class _Loading:
    """A device whose `load` gives the fake kernel, the rest passed on (what `launch.prepare` is handed)."""

    def __init__(self, device, kernel):
        self.device, self.kernel, self.xp = device, kernel, device.xp
        self.sms = getattr(device, "sms", None)

    def load(self, kernel_cu, kernel_name, dyn_smem):
        return self.kernel

    def upload(self, x):
        return self.device.upload(x)

    def launch(self, *args):
        self.device.launch(*args)

    def occupancy(self, *args):
        return self.device.occupancy(*args)

    def launch_cooperative(self, *args):
        self.device.launch_cooperative(*args)

    def tensor_map(self, *spec):
        return self.device.tensor_map(*spec)


def install_fake_gpu(monkeypatch):
    """CuPy, torch and Triton replaced by the stand-ins, kernels by FakeKernel (what the `fake_gpu` fixture does);
    returns a dict: `cp`, `torch`, `triton` and the `fault` the kernels obey."""
    from spatialc.gpucheck import baselines as BL
    from spatialc.gpucheck import device as D
    from spatialc.runtime import launch as L
    from spatialc.runtime import nvcc as N

    monkeypatch.setattr(D, "BUILD_IN_PROCESSES", False)  # builds a test patches here would not be patched there
    cp = FakeCupy()
    torch, triton = FakeTorch(cp), FakeTriton(cp)
    state = {"fault": None, "cp": cp, "torch": torch, "triton": triton, "grids": []}
    device = FakeDevice(cp, state)
    real_prepare = L.prepare

    def prepare(artifact, dev):
        """The launcher's own prepare (the work list for the device's SMs, the grid), with FakeKernel loaded."""
        ls = artifact.launch
        args = L.kernel_args(ls)
        attention = attention_of(artifact.kernel_cu, args)  # its row maxima are no row program's
        rows = row_program(artifact.kernel_cu, args) if attention is None else None
        mapped = map_formula(artifact.kernel_cu) if rows is None and attention is None else None
        fused = fused_program(args)
        fault = state["fault"]
        w4 = any(getattr(a, "packed", False) for a in args)  # packed 4-bit weights: a W4A16 kernel
        kernel = FakeKernel(
            cp,
            args,
            fault,
            ls.kernel_name,
            ls.dyn_smem,
            ls.sync,
            ls.trip_error,
            mapped,
            rows,
            fused,
            attention,
            w4,
            narrowed=NARROWED_LOAD in artifact.kernel_cu,
        )
        return real_prepare(artifact, _Loading(dev, kernel))

    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setattr(L, "_DEVICE", None)
    monkeypatch.setattr(L, "cupy_device", lambda: device)
    monkeypatch.setattr(N, "find_nvcc", lambda: None)  # no cubins: the fake kernel needs none
    monkeypatch.setattr(L, "prepare", prepare)
    monkeypatch.setattr(D, "_import_torch", lambda: state["torch"])
    monkeypatch.setattr(D, "_import_triton", lambda t: (state["triton"], "") if t else (None, "needs torch"))
    monkeypatch.setattr(D, "_clocks", lambda props: "SM 1980/1980 MHz (fake)")
    monkeypatch.setattr(BL, "device_ptr", lambda x: x.ctypes.data)
    monkeypatch.setattr(D, "HANG_MIN_S", 0.05)
    monkeypatch.setattr(D, "HANG_S", 0.05)
    monkeypatch.setattr(FakeEvent, "hang", False)
    return state


@pytest.fixture
def fake_gpu(monkeypatch):
    """The stand-ins installed (`install_fake_gpu`); a test module takes it with
    `from .test_gpucheck_fakes import fake_gpu as fake_gpu`."""
    return install_fake_gpu(monkeypatch)


def lowered_as(monkeypatch, change):
    """spatialc.lower, as the GPU check's builds call it for a case's artifact, replaced by `change(lower, program,
    target)` (`lower`: the real one): artifacts without a general form, or in the general form alone. A call that
    names its form (the sm90a contestant's, `lower(program, "sm_90a", form="sm90a")`) is a kernel of its own, built
    apart from the case's artifact: the real lower prints it, untouched by the change."""
    import spatialc
    from spatialc.gpucheck import builds

    real = spatialc.lower

    def lower(program, target, **form):
        return real(program, target, **form) if form else change(real, program, target)

    monkeypatch.setattr(spatialc, "lower", lower)
    # What lower returns is all there is: no plan of the general form's own where the case's leaves it no room.
    monkeypatch.setattr(builds, "general_planned", lambda gemm, target: None)


def without_general(why):
    """A `change` for `lowered_as`: lower's artifact as when the general form could not print it (`why`)."""
    import dataclasses

    return lambda lower, program, target: dataclasses.replace(lower(program, target), general=None, notes=(why,))


def exit_raises(monkeypatch):
    """os._exit, with which the driver ends a lost or interrupted run, raising SystemExit (for pytest.raises)."""
    from spatialc.gpucheck import driver as G

    def exit_(code):
        raise SystemExit(code)

    monkeypatch.setattr(G.os, "_exit", exit_)


# ---- the stand-ins keep the rules ----------------------------------------------------------------------------------


def _gemm_ex_call(cp, a, bt, m, n, k, lda, ldb, ldc, transa=1, transb=0):
    c = np.zeros((m, n), dtype=np.int32)
    one, zero = np.array(1, np.int32), np.array(0, np.int32)
    cp.cuda.cublas.gemmEx(
        1, transa, transb, n, m, k, one.ctypes.data, bt.ctypes.data, 3, lda, a.ctypes.data, 3, ldb,
        zero.ctypes.data, c.ctypes.data, 10, ldc, 72, -1,
    )  # fmt: skip
    return c


def test_the_cublas_stand_in_computes_tn_and_refuses_what_cublas_refuses():
    cp = FakeCupy()
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (8, 12), dtype=np.int8)
    b = rng.integers(-128, 128, (12, 4), dtype=np.int8)
    bt = np.ascontiguousarray(b.T)
    assert np.array_equal(_gemm_ex_call(cp, a, bt, 8, 4, 12, 12, 12, 4), a.astype(np.int64) @ b)
    odd_a = rng.integers(-128, 128, (8, 13), dtype=np.int8)
    odd_bt = rng.integers(-128, 128, (4, 13), dtype=np.int8)
    with pytest.raises(FakeError, match="lda, ldb multiples of 4"):
        _gemm_ex_call(cp, odd_a, odd_bt, 8, 4, 13, 13, 13, 4)  # k = 13: the leading dimensions are 13
    with pytest.raises(FakeError, match="TN layout only"):
        _gemm_ex_call(cp, a, np.ascontiguousarray(b), 8, 4, 12, 4, 12, 4, transa=0)  # NN
    with pytest.raises(FakeError, match="m, k and ldc multiples of 4"):
        _gemm_ex_call(cp, a, rng.integers(-128, 128, (6, 12), dtype=np.int8), 8, 6, 12, 12, 12, 6)  # n = 6


def test_the_torch_stand_in_refuses_what_int_mm_refuses():
    cp = FakeCupy()
    torch = FakeTorch(cp)
    a = torch.from_dlpack(np.ones((32, 16), np.int8))
    b = torch.from_dlpack(np.ones((16, 8), np.int8))
    b_cm = b.t().contiguous().t()
    assert b_cm.stride() == (1, 16) and b_cm.shape == (16, 8)
    assert np.array_equal(torch._int_mm(a, b_cm).a, np.full((32, 8), 16))
    with pytest.raises(FakeError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
        torch._int_mm(a, b)  # B row-major
    torch.nn_int8 = True
    assert torch._int_mm(a, b).a.dtype == np.int32  # a GPU whose cuBLASLt has the NN kernels
    small = torch.from_dlpack(np.ones((16, 16), np.int8))
    with pytest.raises(FakeError, match=r"self.size\(0\) needs to be greater than 16, but got 16"):
        torch._int_mm(small, b_cm)
    with pytest.raises(FakeError, match=r"self.size\(1\) needs to be greater than 0 and a multiple of 8"):
        torch._int_mm(torch.from_dlpack(np.ones((32, 12), np.int8)), torch.from_dlpack(np.ones((12, 8), np.int8)))
    with pytest.raises(FakeError, match=r"mat2.size\(1\) needs to be greater than 0 and a multiple of 8"):
        torch._int_mm(a, torch.from_dlpack(np.ones((16, 12), np.int8)).t().contiguous().t())


def test_stream_capture_records_launches_and_replays_them():
    cp = FakeCupy()
    seen = []
    stream = cp.cuda.Stream(non_blocking=True)
    stream.begin_capture()
    cp.launch(lambda: seen.append(1))
    graph = stream.end_capture()
    assert seen == [] and cp.launches == 0
    graph.launch(stream)
    graph.launch(stream)
    assert seen == [1, 1] and cp.launches == 2


def test_the_triton_contender_compiles_for_hopper_in_every_precision():
    # Triton 3's dot takes fp32 unless told otherwise and refused the int8 kernel's int32 accumulator ("at 43:14"),
    # which cost the first GPU run every Triton column. Needs Triton itself (not a dependency): compiled ahead of
    # time for sm_90, which needs no GPU.
    import pytest

    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from spatialc.gpucheck import triton_ref

    ints = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
    for precision, operand, out in (("int8", "*i8", "*i32"), ("fp16", "*fp16", "*fp16"), ("bf16", "*bf16", "*bf16")):
        config = dict(triton_ref.CONFIGS[precision])
        options = {"num_warps": config.pop("num_warps"), "num_stages": config.pop("num_stages")}
        constexprs = {**config, "ACC_INT": precision == "int8"}
        signature = {"a_ptr": operand, "b_ptr": operand, "c_ptr": out, **dict.fromkeys(ints, "i32")}
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        source = ASTSource(fn=triton_ref._matmul_kernel, signature=signature, constexprs=constexprs)
        assert triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).metadata.name
