"""The general CUDA form: each engine on warps of its own, handing pages over on mbarriers."""
