"""What a backend hands back: CUDA source texts, the launch contract, the resource budget and the census."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Budget:
    """Resources of a persistent kernel, all found before any text is printed."""

    smem_bytes: int  # bytes of the rings
    dynamic_opt_in: bool  # the dynamic block exceeds 48 KiB: cudaFuncSetAttribute is needed
    rings_dynamic: bool  # the rings left static memory (over 48 KiB) for the dynamic block
    dyn_bytes: int  # the dynamic block: epilogue scratch, plus the rings when they moved
    static_bytes: int  # static __shared__ (the rings when they stayed static)
    regs_est: int
    blocks_per_sm: int
    threads: int

    def to_dict(self) -> dict[str, int | bool]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class KernelParam:
    """One kernel argument: a device pointer to a tiled tensor (`tiles` = padded (rows_t, cols_t))."""

    name: str  # the tensor's name in the program ("A", "B", "C", "bias")
    c_type: str  # the pointee's C type
    role: str  # input / output / parameter
    elems: tuple[int, int]  # logical (rows, cols)
    tiles: tuple[int, int]  # padded tile grid


@dataclass(frozen=True, slots=True)
class Launch:
    """How to launch `kernel_cu`'s kernel from a host language."""

    kernel_name: str
    grid: int
    block: int
    dyn_smem: int
    params: tuple[KernelParam, ...]
    tile: tuple[int, int] = (16, 16)


@dataclass(frozen=True, slots=True)
class Census:
    """Count of each choreography op kind in the program, and the same counts recovered from the printed kernel."""

    program: dict[str, int]
    printed: dict[str, int]

    @property
    def agrees(self) -> bool:
        return self.program == self.printed


@dataclass(frozen=True, slots=True)
class CudaArtifact:
    target: str
    program_cu: str  # whole program: reads a.txt / b.txt, prints C row-major, one value per line
    bench_cu: str  # whole program: deterministic inputs, prints "GOPS <value>"
    kernel_cu: str  # the kernel alone, no host main, for launching from Python
    launch: Launch
    budget: Budget
    census: Census
    general: CudaArtifact | None = None
    notes: tuple[str, ...] = field(default=())
