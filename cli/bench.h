// `tilegrad bench`: performance figures compared, in the same run, with the PyTorch references
// (bench/reference/). One file per benchmark: bench_train.cpp, bench_memory.cpp,
// bench_attention.cpp, bench_allreduce.cpp; bench_steps.h the timed training steps that train and
// memory share.
#pragma once
#include "cli/cli.h"

namespace tg {
int bench_train(const cli::Args& a);      // tilegrad bench train CONFIG
int bench_attention(const cli::Args& a);  // tilegrad bench attention
int bench_memory(const cli::Args& a);     // tilegrad bench memory CONFIG
int bench_allreduce(const cli::Args& a);  // tilegrad bench allreduce (under mpirun or srun)
}  // namespace tg
