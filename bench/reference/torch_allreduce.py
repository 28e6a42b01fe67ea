"""NCCL's own collective bandwidth through torch.distributed: the reference `tilegrad bench
allreduce` is compared with, on the same GPUs, sizes and definition of bus bandwidth.

    torchrun --nproc_per_node N bench/reference/torch_allreduce.py [--mib 25,471.8]
        [--collective all_reduce|reduce_scatter|all_gather] [--steps 20] [--warmup 5]

fp32 buffers of the given MiB (a multiple of N elements; the sharded collectives' shard in a
buffer of its own, where tilegrad's communicator works in place); `steps` collectives back to back after
`warmup`, timed on the host between a barrier and the device's synchronisation, the slowest
rank's time reported. Bus bandwidth as nccl-tests define it: bytes / time × 2(N − 1)/N for
all_reduce, × (N − 1)/N for reduce_scatter and all_gather (bytes: the whole buffer). One JSON
line per size from rank 0.
"""
import argparse
import json
import os
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", default="25,471.8")
    ap.add_argument("--collective", default="all_reduce", choices=["all_reduce", "reduce_scatter", "all_gather"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = 2 * (world - 1) / world if args.collective == "all_reduce" else (world - 1) / world
    for mib in (float(x) for x in args.mib.split(",")):
        n = max(world, (int(mib * 1048576 / 4) + world - 1) // world * world)
        buf = torch.full((n,), float(rank + 1), device="cuda", dtype=torch.float32)
        shard = torch.empty(n // world, device="cuda", dtype=torch.float32)  # the sharded collectives' other side

        def once():
            if args.collective == "all_reduce":
                dist.all_reduce(buf)
            elif args.collective == "reduce_scatter":
                dist.reduce_scatter_tensor(shard, buf)
            else:
                dist.all_gather_into_tensor(buf, shard)

        for _ in range(args.warmup):
            once()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            once()
        torch.cuda.synchronize()
        mine = torch.tensor([(time.perf_counter() - t0) / args.steps], device="cuda")
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        seconds = mine.item()
        algbw = n * 4 / seconds / 1e9
        if rank == 0:
            print(json.dumps(dict(bench="collective", impl="torch_nccl", collective=args.collective, world_size=world,
                                  bytes=n * 4, ms=seconds * 1e3, algbw_gbs=algbw, busbw_gbs=algbw * factor)),
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
