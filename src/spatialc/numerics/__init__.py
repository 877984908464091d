"""Numerics: what a program's values mean, and how far a kernel's may stray from them.

`rounding` rounds operands and results to their element types; `elementwise` defines every elementwise op once (the
interpreter, the reference, verify and the printers read it), `intervals` bounds its values, `cexpr` spells it in C
and `reductions` defines the row reductions; `epilogue` applies a program's epilogue stages; `quant` is int8
requantisation; `reference` is the numpy reference of a program's declared function; `tolerance` is the one error
bound a result is checked against.
"""
