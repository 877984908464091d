"""What the CUDA forms share: the C writer, what every form reads of a verified program, rings, tiles, the fused
epilogue, maps and row reductions, the hand-over and cluster printers, the host program, and the checked-in device
and host C they inline (*.cuh)."""
