"""The distributed tests' harness: a function run on ``world`` gloo processes, each rank's result returned.

A rank's result (tensors in dicts, lists and tuples) goes through a file and is read back with
``weights_only=True``, so reading it runs no code."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank, fn, args, world, store, out):
    torch.set_num_threads(1)  # two processes on a 2-core machine
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    try:
        torch.save(fn(rank, *args), os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(tmp_path, fn, *args, world=2):
    """``[fn(rank, *args) for rank in range(world)]``, each on its own process of one gloo group.

    Args:
        tmp_path: an empty folder for the group's store and the ranks' result files.
        fn: a module-level function (the processes import it by name).
        args: more arguments for ``fn``, picklable.
        world: the number of processes.

    Returns:
        The ranks' results, in rank order.
    """
    mp.spawn(_worker, args=(fn, args, world, str(tmp_path / "store"), str(tmp_path)), nprocs=world)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
