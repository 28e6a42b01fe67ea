// cudaStream_t for launcher declarations: the real type when CUDA is built, an identical opaque
// pointer otherwise, so the op layer can name CUDA launchers in code that only runs on GPU tensors.
#pragma once
#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif
