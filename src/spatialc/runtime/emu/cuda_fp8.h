// Stands in for the CUDA header of this name in the spatialc host emulation.
#include "cuda_emu.h"
