"""What every CUDA backend prints with: a writer of indented C lines with census markers, C expressions over loop
variables, the C types of the IR's element types and the error-check macro the host code uses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources

from ....ir.ids import LoopVar, loop_var_name
from ....ir.nodes import DType
from ....ir.ops import Span, TileAddr
from ...errors import Unsupported

C_TYPES = {
    DType.INT8: "signed char",
    DType.INT32: "int",
    DType.INT64: "long long",
    DType.FP16: "__half",
    DType.BF16: "__nv_bfloat16",
    DType.FLOAT32: "float",
}
INCLUDES = ("cuda_pipeline.h", "mma.h", "cuda_bf16.h", "cuda_fp16.h", "cstdio", "cstdlib", "vector", "cstring")
FP8_TYPES = ("__nv_fp8_e4m3", "__nv_fp8_e5m2")  # cuda_fp8.h's, included only by the kernels that take them
RING_MACROS = """#ifndef SPATIALC_SHARED_RING
#define SPATIALC_SHARED_RING(T, name, depth, page) __shared__ __align__(32) T name[(depth) * (page)]
#define SPATIALC_DYNAMIC_RING(T, name, base, off, depth, page) T* name = reinterpret_cast<T*>((base) + (off))
#endif"""
# A plain store to an output tensor, and a paired one (two adjacent elements as one store of twice their width): an
# assignment for nvcc; the emulation, which defines its own, checks each against the tensor's allocation, for a second
# write of an element, and the pair for its alignment (runtime/emu/emu_global.h).
STORE_MACRO = """#ifndef SPATIALC_OUT_ST
#define SPATIALC_OUT_ST(p, v) (*(p) = (v))
#endif
#ifndef SPATIALC_OUT_ST2
// Two adjacent output elements as one store of twice their width, their bits packed into one word (p aligned to two
// elements): a struct of two 16-bit members is stored as two 16-bit stores.
template <int N> struct spatialc_word;
template <> struct spatialc_word<1> { typedef unsigned char t; };
template <> struct spatialc_word<2> { typedef unsigned short t; };
template <> struct spatialc_word<4> { typedef unsigned int t; };
template <> struct spatialc_word<8> { typedef unsigned long long t; };
template <class T>
__device__ __forceinline__ void spatialc_out_st2(T* p, T a, T b) {
    typedef typename spatialc_word<sizeof(T)>::t U;
    U lo, hi;
    memcpy(&lo, &a, sizeof(T));
    memcpy(&hi, &b, sizeof(T));
    if constexpr (sizeof(T) == 8) {
        *reinterpret_cast<ulonglong2*>(p) = make_ulonglong2(lo, hi);
    } else {
        typedef typename spatialc_word<2 * sizeof(T)>::t W;
        *reinterpret_cast<W*>(p) = (W)((W)lo | ((W)hi << (8 * sizeof(T))));
    }
}
#define SPATIALC_OUT_ST2(p, a, b) spatialc_out_st2((p), (OUT_T)(a), (OUT_T)(b))
#endif"""
# Plain reads and writes of page elements (the writer's, and the epilogue stages'), so that the emulation, which
# defines its own, can check them for races as it checks cp.async landings and fragment loads; and plain stores to
# global memory other sites read in the same launch (split-K's workspace), which the emulation keeps invisible at
# device scope until the storing thread (or one that crossed a barrier with it) releases them.
PAGE_MACROS = """#ifndef SPATIALC_PAGE_LD
#define SPATIALC_PAGE_LD(p) (*(p))
#define SPATIALC_PAGE_ST(p, v) (*(p) = (v))
#endif
#ifndef SPATIALC_GLOBAL_ST
#define SPATIALC_GLOBAL_ST(p, v) (*(p) = (v))
#endif"""
# For a kernel whose lanes move split-K's partial sums themselves (the sm_90a form: `direct_partials`): two adjacent
# accumulator elements stored as one 8-byte store (SPATIALC_GLOBAL_ST2), and loaded and added as one
# (SPATIALC_GLOBAL_ADD2, through L2 — `__ldcg`: an SM's L1 is not coherent with other SMs' stores), which the
# emulation holds and checks as SPATIALC_GLOBAL_ST's stores and a cp.async's reads (emu_global.h).
PAIRED_GLOBAL_MACROS = """#ifndef SPATIALC_GLOBAL_ST2
__device__ __forceinline__ void spatialc_global_st2(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void spatialc_global_st2(int* p, int a, int b) {
    *reinterpret_cast<int2*>(p) = make_int2(a, b);
}
__device__ __forceinline__ void spatialc_global_add2(const float* p, float& a, float& b) {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
    a += v.x;
    b += v.y;
}
__device__ __forceinline__ void spatialc_global_add2(const int* p, int& a, int& b) {
    const int2 v = __ldcg(reinterpret_cast<const int2*>(p));
    a += v.x;
    b += v.y;
}
#define SPATIALC_GLOBAL_ST2(p, a, b) spatialc_global_st2((p), (a), (b))
#define SPATIALC_GLOBAL_ADD2(p, a, b) spatialc_global_add2((p), (a), (b))
#endif"""
CHECK_MACRO = (
    "#define SPATIALC_CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "
    '"CUDA error: %s (%s)\\n", cudaGetErrorString(e_), #x); exit(1); } } while (0)'
)


def includes(operand: str) -> tuple[str, ...]:
    """The headers a kernel of `operand` values (a C type) includes: with cuda_fp8.h where they are 8-bit floats."""
    return (*INCLUDES, "cuda_fp8.h") if operand in FP8_TYPES else INCLUDES


class Writer:
    """Lines of C with an indent, each optionally ending in a census marker."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def line(self, text: str = "", mark: str = "") -> None:
        """One line at the current indent; `mark` (a census marker) ends it."""
        body = f"{text}  {mark}" if text and mark else (text or mark)
        self.lines.append(("    " * self.depth + body) if body else "")

    @contextmanager
    def block(self, head: str = "", mark: str = "") -> Iterator[None]:
        """`head {`, an indented body, `}`."""
        self.line(f"{head} {{" if head else "{", mark)
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    def text(self) -> str:
        """The lines written so far, as one text."""
        return "\n".join(self.lines) + "\n"


def c_sum(*terms: str) -> str:
    """C terms joined by `+`, the empty ones left out."""
    return " + ".join(t for t in terms if t) or "0"


def c_mul(e: str, n: int) -> str:
    """`e · n` as C ("" when `e` is absent)."""
    return "" if not e else e if n == 1 else f"{e} * {n}"


def c_div(e: str, n: int) -> str:
    return e if n == 1 else f"{e} / {n}"


def c_mod(e: str, n: int) -> str:
    """`e mod n` as C ("" when n is 1: it is zero)."""
    return "" if n == 1 else f"{e} % {n}"


def addr_expr(at: TileAddr, env: dict[LoopVar, str]) -> str:
    """A tile address as C over the loop variables bound in `env` (variable → C expression)."""
    terms = [str(at.base)] if at.base else []
    for var, stride in at.steps:
        if stride == 0:
            continue
        if var not in env:
            raise Unsupported(
                f"an address over {loop_var_name(var)} outside any loop that binds it",
                "the kernel has no value for that variable there",
            )
        if env[var] != "0":
            terms.append(f"{env[var]} * {stride}" if stride != 1 else env[var])
    return c_sum(*terms)


def span_count(span: Span, env: dict[LoopVar, str], name: str) -> list[str]:
    """The C statements that set int `name` to a per-item loop count (`Span`: min(bound, max(0, ceil(v / per))),
    v = base + Σ stride·var over the item's coordinates bound in `env`), the count `Span.at` gives: v in 64 bits,
    ceilinged by truncation where it is positive."""
    terms = [str(span.base)]
    for var, stride in span.steps:
        if var not in env:
            raise Unsupported(
                f"a loop count over {loop_var_name(var)} outside any loop that binds it",
                "the kernel has no value for that variable there",
            )
        terms.append(f"(long long)({env[var]}) * {stride}")
    blocks = f"({name}_v + {span.per - 1}) / {span.per}"
    return [
        f"const long long {name}_v = {' + '.join(terms)};",
        f"const int {name} = {name}_v <= 0 ? 0 : (int)({blocks} < {span.bound} ? {blocks} : {span.bound});",
    ]


def site_prologue(w: Writer, cluster: int = 1) -> None:
    """The thread's coordinates and its site's share of the work list (docs/kernel-abi.md), which is an argument
    built at launch for the sites the device has: each site's offset into the item list, each site's count, then
    the items. A site with no items returns at once — in a kernel of thread-block clusters of `cluster` sites, only
    when every site of its cluster has none: the cluster then leaves together, and otherwise each of its blocks
    reaches the cluster barriers its peers wait at (the launcher refuses a list that leaves a site of a busy cluster
    idle, whose peers would wait for its pages' arrivals too: tilize.work_list)."""
    w.line("const int tid = threadIdx.x;")
    w.line("const int warp = tid / 32;")
    w.line("const int site = blockIdx.x;")
    w.line("const int item_off = spatialc_work[site];")
    w.line("const int n_items = spatialc_work[gridDim.x + site];")
    w.line("const int* ITEM_LIST = spatialc_work + 2 * gridDim.x;")
    if cluster <= 1:
        w.line("if (n_items == 0) { return; }")
        return
    w.line(f"const int cluster_first = site - site % {cluster};  // the cluster leaves together or not at all")
    w.line("int cluster_items = 0;")
    with w.block(f"for (int s = cluster_first; s < cluster_first + {cluster}; ++s)"):
        w.line("cluster_items += spatialc_work[gridDim.x + s];")
    w.line("if (cluster_items == 0) { return; }")


# The package the checked-in C files are found under, each form's in its own folder (`general/mbarrier.cuh`).
CUDA_PACKAGE = __package__.rpartition(".")[0]


@cache
def inlined(*names: str) -> str:
    """The checked-in C files `names` (`*.cuh`, paths under `lower/cuda/`), joined: text a printed program inlines,
    read once."""
    root = resources.files(CUDA_PACKAGE)
    return "\n".join(root.joinpath(*name.split("/")).read_text() for name in names)


def inlined_lines(*names: str) -> list[str]:
    """`inlined(*names)` as the lines of a preamble."""
    return inlined(*names).rstrip("\n").split("\n")
