"""The sm_90a CUDA form: the general form's engines with a TMA producer and wgmma consumers."""
