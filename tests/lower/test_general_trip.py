"""Loop counts read from data (`Trip`) in the general form: every engine thread reads the count from its int32
parameter at run time, a count beyond the loop's bound runs the loop no times and is reported by the host — never an
access out of bounds.

verify's rule 8 does not yet accept such programs (it cannot state what C is when a count comes from data), so these
tests call the general backend directly on a hand-written program marked verified, and hold it to the reference
interpreter, which runs `Trip` loops by the same rule."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import spatialc
from spatialc.interp.errors import TripError
from spatialc.ir.ids import LV_K, TensorId
from spatialc.ir.nodes import DType, Engine, Tensor, TensorRole
from spatialc.ir.ops import Loop, Trip
from spatialc.lower.cuda.general import kernel as general
from spatialc.lower.errors import Unsupported
from spatialc.runtime import launch as L
from spatialc.runtime.emulate import EmulationFault

from ..rewrite import edit, map_ops
from ..stand_in import StandInDevice, product

emulation = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")
RNG = np.random.default_rng(9)
A = RNG.integers(-128, 128, (64, 64)).astype(np.int8)
B = RNG.integers(-128, 128, (64, 64)).astype(np.int8)


def trip_program(bound: int = 4, dtype: DType = DType.INT32):
    """64³ int8, 1×1-tile blocks on 2 sites, whose reader's and compute engine's K loops run `ksteps[0][0]` times
    (at most `bound`): the product over the first ksteps·16 columns of A."""
    p = spatialc.build(spatialc.gemm(64, 64, 64, "int8"), "sm_86", block=(1, 1, 1), sites=2)
    t = TensorId(len(p.tensors))
    p = p.evolve(tensors=(*p.tensors, Tensor(t, "ksteps", TensorRole.PARAMETER, (1, 1), (1, 1), dtype)))

    def trip(ops):
        return map_ops(
            ops,
            lambda op: (
                (Loop(op.var, Trip(t, 0, bound), map_ops(op.body, lambda _: None)),)
                if isinstance(op, Loop) and op.var == LV_K
                else None
            ),
        )

    for engine in (Engine.READER, Engine.COMPUTE):
        p = edit(p, engine, trip)
    return p.evolve(verified=True)  # rule 8 refuses Trip: held to the interpreter instead


def lowered(p):
    return general.lower(p, spatialc.target("sm_86"))


def test_a_trip_loop_reads_its_count_in_every_engine_thread_and_bounds_it():
    art = lowered(trip_program())
    text = art.kernel_cu
    assert text.count("const int trip_k = spatialc_trip(t3[0], 4, spatialc_sync + 0);  // ksteps[0]") == 2
    assert text.count("for (int k = 0; k < trip_k; ++k) {  // op:Loop") == 2
    assert art.launch.sync == (0, 0) and art.launch.trip_error == 0 and not art.launch.cooperative
    assert "int* __restrict__ spatialc_sync)" in text and art.census.agrees
    assert "beyond its bound; the loop ran no" in art.program_cu


def test_a_count_from_anything_but_an_int32_parameter_is_refused():
    with pytest.raises(Unsupported, match="a loop count read from ksteps: trip counts are read from an int32"):
        lowered(trip_program(dtype=DType.FLOAT32))


@emulation
@pytest.mark.emulation
@pytest.mark.parametrize(("steps", "mode"), [(4, "late"), (2, "early"), (1, "late"), (0, "early")])
def test_the_kernel_runs_the_count_it_reads_as_the_interpreter_does(steps, mode):
    p = trip_program()
    x = {"A": A, "B": B, "ksteps": np.array([[steps]], np.int32)}
    c = spatialc.emulate(lowered(p), x, mode=mode, timeout=60)
    ref = spatialc.evaluate(p, x)
    np.testing.assert_array_equal(c, ref)
    k = 16 * steps
    np.testing.assert_array_equal(ref, A[:, :k].astype(np.int64) @ B[:k].astype(np.int64))


@emulation
@pytest.mark.emulation
def test_a_count_beyond_its_bound_runs_nothing_and_is_reported():
    p = trip_program()
    x = {"A": A, "B": B, "ksteps": np.array([[5]], np.int32)}
    with pytest.raises(TripError, match="the trip count is 5, not a whole number in 0..4"):
        spatialc.evaluate(p, x)
    with pytest.raises(EmulationFault, match="a loop count read from data is 5, beyond its bound; the loop ran no"):
        spatialc.emulate(lowered(p), x, timeout=60)


def test_the_launcher_sets_the_error_words_and_reports_a_count_beyond_its_bound():
    art = lowered(trip_program())
    dev = StandInDevice(art, product)
    prep = L.prepare(art, dev)
    assert prep.sync is not None and list(prep.sync) == [0, 0]
    prep.sync[:] = [1, 9]  # as a kernel leaves them when it read 9
    with pytest.raises(L.LaunchError, match="a loop count read from data is 9, beyond its bound"):
        prep.check()
    prep.sync[:] = [0, 0]
    prep.check()  # a count within its bound leaves the flag down


@emulation
@pytest.mark.emulation
def test_the_bench_runs_a_trip_loop_at_its_bound_and_checks_the_count():
    from spatialc.runtime.emulate import compile_program, run_program

    art = lowered(trip_program())
    assert "h3[0] = 4;" in art.bench_cu and art.bench_cu.count("trip_error[0]") == 1
    assert run_program(compile_program(art.bench_cu, "early"), {}, 60).stdout.startswith("GOPS ")
