"""Imported at the start of every Python process whose path holds this folder (tests/gpucheck/test_gpucheck_restart.py
puts it on PYTHONPATH for the real `python -m spatialc.gpucheck` it runs): with SPATIALC_FAKE_GPU set, the process gets
the stand-in GPU of tests/gpucheck/test_gpucheck_fakes.py, so the supervisor and its worker processes run as they would
on a GPU. SPATIALC_FAKE_GPU holds one fault a worker, `;`-separated (`hang,48x48,spatialc_hopper;` — the first worker's
kernel hangs, the second runs clean); a worker finds its number in the restarts its resume lists."""

import os
import sys

if os.environ.get("SPATIALC_FAKE_GPU") is not None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import pytest
    from tests.gpucheck.test_gpucheck_fakes import install_fake_gpu

    from spatialc.gpucheck import restart

    state = install_fake_gpu(pytest.MonkeyPatch())
    faults = os.environ["SPATIALC_FAKE_GPU"].split(";")
    worker = sys.argv[sys.argv.index("--worker") + 1] if "--worker" in sys.argv else None
    n = len(restart.load_resume(worker).restarts) if worker else 0
    fault = faults[n] if n < len(faults) else ""
    state["fault"] = tuple(fault.split(",")) if "," in fault else (fault or None)
