"""The distributed tests' harness: a function run on ``world`` gloo processes, each rank's result returned.

A rank's result (tensors in dicts, lists and tuples) goes through a file and is read back with
``weights_only=True``, so reading it runs no code."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


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


def full(p):
    """A parameter's whole value (FSDP2 holds a DTensor shard of it)."""
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def wrapped(replica, wrap, parts):
    """``replica`` under DDP (wrap "ddp") or FSDP2 ("fsdp": ``fully_shard`` on each of ``parts``, then on it)."""
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(replica)
    from torch.distributed.fsdp import fully_shard
    for m in (*parts, replica):
        fully_shard(m)
    return replica


def step_beside_one_process(ref, model, opt, side, x, t, rows, world):
    """One MSE step (before ``opt.step()``): ``ref``, one process, on the global batch ``(x, t)``; ``model`` (this
    rank's wrapped replica, optimizer ``opt``) on the rank's ``rows``; ``side`` (a second replica, unwrapped, whose
    gradients only are wanted) on the same rows. Returns both losses (the replicas' mean over the ranks), and the
    outputs and input gradients of ``model`` and ``ref`` on the rank's rows."""
    xg = x.clone().requires_grad_(True)
    y_ref = ref(xg)
    loss_ref = (y_ref - t).pow(2).mean()
    ref.zero_grad()
    loss_ref.backward()
    xr = x[rows].clone().requires_grad_(True)
    y = model(xr)
    loss = (y - t[rows]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    side.zero_grad()
    (side(xr.detach()) - t[rows]).pow(2).mean().backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    return {"loss": mean_loss / world, "loss_ref": loss_ref.detach(), "y": y.detach(),
            "y_ref": y_ref.detach()[rows], "dx": xr.grad, "dx_ref": xg.grad[rows]}


def copy_weights(source, *targets):
    """The next step starts every model from ``source``'s weights (whole, if FSDP2 shards them)."""
    with torch.no_grad():
        for p, *qs in zip(source.parameters(), *(m.parameters() for m in targets)):
            for q in qs:
                q.copy_(full(p))


class Net(nn.Module):
    """The distributed tests' model: x + fc2(act(fc1(x))) into a head, 64 -> 128 -> 64 -> 16."""

    def __init__(self, act):
        super().__init__()
        self.act = act
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.head = nn.Linear(64, 16)

    def forward(self, x):
        return self.head(x + self.fc2(self.act(self.fc1(x))))


def rank_part(rank, pass_, operand, codes, scales, ref_codes, ref_scales):
    """The single process's quantised operand (``ref_codes``, ``ref_scales``) on the part a rank's operand
    (``codes``, ``scales``) holds: its token columns in wgrad (bwd_dw), its token rows for operand a of the other
    passes, all of it for a weight operand."""
    if pass_ == "bwd_dw":  # tokens in columns
        n, nb = codes.shape[1], scales.shape[1]
        return ref_codes[:, rank * n:(rank + 1) * n], ref_scales[:, rank * nb:(rank + 1) * nb]
    if operand == "a":  # tokens in rows
        n = codes.shape[0]
        return ref_codes[rank * n:(rank + 1) * n], ref_scales[rank * n:(rank + 1) * n]
    return ref_codes, ref_scales
