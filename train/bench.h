// `tilegrad bench`: performance figures compared, in the same run, with the PyTorch references.
#pragma once
#include "train/cli.h"

namespace tg {
int bench_train(const cli::Args& a);      // tilegrad bench train CONFIG
int bench_attention(const cli::Args& a);  // tilegrad bench attention
int bench_memory(const cli::Args& a);     // tilegrad bench memory CONFIG
int bench_allreduce(const cli::Args& a);  // tilegrad bench allreduce (under mpirun or srun)
}  // namespace tg
