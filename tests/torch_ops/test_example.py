"""examples/torch_mlp.py runs as the README says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_mlp.py"


def test_the_torch_example_runs(capsys):
    spec = importlib.util.spec_from_file_location("torch_mlp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "activation=silu" in out and "of the magnitudes summed" in out


def test_the_readmes_torch_example_runs():
    import re

    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "spatialc.torch" in b]
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert tuple(scope["c"].shape) == (32, 64) and tuple(scope["y"].shape) == (32, 64)
    assert [e.sizes for e in scope["layer"].compiled()] == [(32, 64, 48)]


def test_the_tutorials_pytorch_chapter_runs(tmp_path, monkeypatch):
    import re

    import spatialc
    from tests.lang.test_lang import TUTORIAL, tutorial_program

    monkeypatch.chdir(tmp_path)
    chapter = TUTORIAL.read_text().split("## 14. From PyTorch\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", chapter, re.S)
    assert len(blocks) == 3
    scope: dict = {}
    exec(compile(tutorial_program(5) + "\n" + "\n".join(blocks), "docs/tutorial.md", "exec"), scope)
    [entry] = scope["my_op"].compiled()
    assert entry.sizes == (64, 128, 128) and str(entry).startswith("my_gemm 64x128x128 on cpu: built in")
    assert scope["my_op"].schema == "(Tensor A, Tensor B) -> Tensor"
    o, lse = scope["o"], scope["lse"]  # the attention block: the shapes, dtypes and the one build it says
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == ((2, 8, 128, 64), scope["torch"].bfloat16, (2, 8, 128),
                                                        scope["torch"].float32)  # fmt: skip
    op = scope["sct"].attention_op("bf16", causal=True, out="bf16")
    built = [e.program for e in op.compiled() if e.sizes == (16, 128, 128, 64, 4)]
    assert [p.name for p in built] == [
        spatialc.attention(1, 16, 128, 128, 64, kv_heads=4, causal=True, out="bf16").name
    ]


def test_the_torch_attention_example_runs(capsys):
    path = EXAMPLE.parent / "torch_attention.py"
    spec = importlib.util.spec_from_file_location("torch_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    out = capsys.readouterr().out
    assert "of spatialc's bound" in out and "spatialc::attention_bf16_causal" in out
