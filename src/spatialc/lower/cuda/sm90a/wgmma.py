"""The wgmma instructions the sm_90a kernels print, specialised by width and operand type as inline PTX."""

from __future__ import annotations

from ...errors import Unsupported

# The PTX type of a wgmma's 8-bit float operands, by their C type.
FP8_PTX = {"__nv_fp8_e4m3": "e4m3", "__nv_fp8_e5m2": "e5m2"}


# The wgmma variants the kernels print, by name: both operands from shared memory with B as a GEMM's (16-bit
# MN-major, imm-trans-b 1; 8-bit K-major), 16-bit B K-major (imm-trans-b 0: attention's K, whose rows are S's
# columns), and A from registers with B MN-major (the RS form: attention's P · V).
# "sd" is "ss" with scale-d an operand: 0 makes D = A · B, the accumulators not read (a block-scaled group's first).
WGMMA_VARIANTS = {
    "ss": "spatialc_wgmma",
    "kb": "spatialc_wgmma_kb",
    "rs": "spatialc_wgmma_rs",
    "sd": "spatialc_wgmma_sd",
}


def wgmma_specialisations(n: int, operand: str, integer: bool, variant: str = "ss") -> list[str]:
    """The wgmma of width `n` for the kernel's operand type, as inline PTX: its accumulator list is `n / 2` registers
    long, which is why it is printed rather than written out in sm90a.cuh. In the "ss" variant A and B both come
    from shared memory; 16-bit B is N-major (transposed), 8-bit operands (int8, e4m3, e5m2) are K-major — the only
    way the PTX ISA lets a wgmma of them read B (its transposes are the 16-bit types' alone). The 8-bit floats' wgmma
    (k32, float32 accumulators) takes the floating-point variants' operand scales, here 1 and 1 (no negation). "kb"
    reads 16-bit B K-major; "rs" takes A from four registers a thread (mma.m16n8k16's A fragment, of the warp's 16
    rows), B N-major; "sd" is the 8-bit floats' "ss" with scale-d an operand (0: D = A · B, a block-scaled K group's
    first wgmma into its fresh partial accumulators) (`WGMMA_VARIANTS`)."""
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    if integer:
        shape, dtype, tail, out = f"m64n{n}k32", "s32.s8.s8", "p", '"+r"'
    elif operand in FP8_PTX:
        ty = FP8_PTX[operand]
        shape, dtype, tail, out = f"m64n{n}k32", f"f32.{ty}.{ty}", "p, 1, 1", '"+f"'
    else:
        ty = "bf16" if "bfloat16" in operand else "f16"
        trans_b = {"ss": "1", "kb": "0", "rs": "1"}[variant]
        tail = f"p, 1, 1, {trans_b}" if variant == "rs" else f"p, 1, 1, 0, {trans_b}"
        shape, dtype, out = f"m64n{n}k16", f"f32.{ty}.{ty}", '"+f"'
    if variant == "sd" and operand not in FP8_PTX:
        raise Unsupported(f"a {variant} wgmma of {operand}", "only the 8-bit floats' GEMMs are block-scaled")
    if variant not in ("ss", "sd") and (integer or operand in FP8_PTX):
        raise Unsupported(f"a {variant} wgmma of {operand}", "only 16-bit operands are transposed or held in registers")
    accum = "int" if integer else "float"
    name = WGMMA_VARIANTS[variant]
    outs = ", ".join(f"{out}(d[{i // 8}].x[{i % 8}])" for i in range(regs))
    if variant == "rs":
        a_param, a_ops = "const spatialc_frag<T>& a", f"{{%{regs}, %{regs + 1}, %{regs + 2}, %{regs + 3}}}"
        ins, b_at = '"r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(b)', regs + 4
        a_spec = f"const spatialc_frag<{operand}>& a"
    else:
        a_param, a_ops, ins, b_at = "unsigned long long a", f"%{regs}", '"l"(a), "l"(b)', regs + 1
        a_spec = "unsigned long long a"
    b_param, scale_d = "unsigned long long b", "1"
    if variant == "sd":
        b_param, scale_d, ins = "unsigned long long b, int scale_d", f"%{b_at + 1}", f'{ins}, "r"(scale_d)'
    return [
        "#ifndef SPATIALC_SM90A_EMULATED",
        "template <int N, class T, class A>",
        f"__device__ void {name}(spatialc_acc<A> (&d)[N / 16], {a_param}, {b_param});",
        "template <>",
        f"__device__ __forceinline__ void {name}<{n}, {operand}, {accum}>(",
        f"    spatialc_acc<{accum}> (&d)[{n // 16}], {a_spec}, {b_param})",
        "{",
        "    asm volatile(",
        f'        "{{\\n.reg .pred p;\\nsetp.ne.b32 p, {scale_d}, 0;\\n"',
        f'        "wgmma.mma_async.sync.aligned.{shape}.{dtype} {{{acc}}}, {a_ops}, %{b_at}, {tail};\\n}}"',
        f"        : {outs}",
        f"        : {ins});",
        "}",
        "#endif",
    ]
