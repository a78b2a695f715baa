"""Data-parallel training: DistributedDataParallel under torchrun.

``torchrun --nproc_per_node N -m recurvit train ...`` (or ``recurvit train --nproc N``, which
launches exactly that through ``torch.distributed.run``) starts N processes; each builds the same
model, trains on its shard of every global batch and DDP averages the gradients. A single process
(no ``WORLD_SIZE`` in the environment) takes none of these paths and trains exactly as before.

Conventions
-----------
- Backend: nccl when the run's device is CUDA (each rank on ``cuda:LOCAL_RANK``), gloo otherwise.
- ``train.batch_size`` is the GLOBAL batch; each rank takes ``batch_size / world_size`` images
  (it must divide). The learning rate and schedule are those of the global batch, so a config
  means the same optimisation whatever the number of processes.
- Sample order: every epoch draws the SAME permutation as a single process
  (:class:`ShardedBatches`) and of every global batch rank r takes positions r, r + W, r + 2W,
  ...; so the union of the ranks' i-th batches is the single process's i-th batch. Without randomness in the step
  (no dropout / drop path / MixUp, a fixed depth) N processes follow the single-process loss
  trajectory up to float summation order (tests/run/test_distributed.py). When the last, partial
  batch is not a multiple of the number of processes it is padded with the epoch's first
  indices (DistributedSampler's rule), so that one step differs slightly.
- Randomness: the model is initialised from ``train.seed`` on every rank (and DDP broadcasts rank
  0's weights); after that each rank r > 0 reseeds its global RNG with a rank-dependent seed, so
  dropout, drop-path and MixUp draws differ between shards. Per-batch depth draws come from a
  generator shared by all ranks, so all run the same number of steps in a batch.
- Metrics are exact global figures: sums of loss x n, correct and n are all-reduced; test
  evaluation shards the test set without padding.
- Rank 0 alone writes the run directory (config, metrics, checkpoints), logs and prints; every
  rank loads ``last.pt`` to resume. Checkpoints hold every rank's RNG state.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from ..errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands in a (possibly single-process) run."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # --------------------------------------------------------------------- collectives
    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, values: Sequence[float], device: torch.device) -> List[float]:
        """Sums of ``values`` over the ranks (float64 on ``device``; one collective)."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> List[T]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        out: List[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def main_first(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on rank 0, then on the other ranks (downloads, directory creation).

        A ``UserError`` raised on rank 0 is raised on every rank, so no rank waits forever on a
        rank that has stopped."""
        result = self.on_main(fn)
        return result if self.is_main else fn()

    def on_main(self, fn: Callable[[], T]) -> Optional[T]:
        """Runs ``fn`` on rank 0 only (others get None); a ``UserError`` there stops every rank."""
        if not self.enabled:
            return fn()
        err, result, failure = None, None, None
        if self.is_main:
            try:
                result = fn()
            except UserError as e:
                err = str(e)
            except Exception as e:  # not the user's fault: rank 0 re-raises it, the others stop too
                failure, err = e, f"rank 0 failed: {type(e).__name__}: {e}"
        err = self.broadcast(err)
        if failure is not None:
            raise failure
        if err is not None:
            raise UserError(err)
        return result


SINGLE = DistEnv()


def launched_world_size() -> int:
    """WORLD_SIZE set by torchrun (1 when not launched by it)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise UserError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def launched_main() -> bool:
    """Whether this process is rank 0 of a torchrun launch (True when not launched by it): the one that prints."""
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        raise UserError(f"RANK={os.environ['RANK']!r} is not a number") from None


def current() -> DistEnv:
    """The process group this process belongs to (SINGLE when there is none)."""
    if dist.is_available() and dist.is_initialized():
        return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return SINGLE


def _wants_cuda(device_name: str) -> bool:
    return device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())


@contextmanager
def session(device_name: str = "auto", timeout_s: float = 1800.0) -> Iterator[DistEnv]:
    """Joins the torchrun process group for the duration (a no-op for a single process or when a
    group already exists); destroys the group on exit if it created it."""
    if dist.is_available() and dist.is_initialized():
        yield current()
        return
    world = launched_world_size()
    if world <= 1:
        yield SINGLE
        return
    if not dist.is_available():
        raise UserError("this PyTorch build has no torch.distributed; run a single process")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = _wants_cuda(device_name)
    if cuda:
        if not torch.cuda.is_available():
            raise UserError(f"train.device={device_name} but CUDA is not available; use train.device=cpu")
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA devices; "
                            "use --nproc_per_node <= the number of GPUs")
        torch.cuda.set_device(local_rank)
    kw = dict(device_id=torch.device("cuda", local_rank)) if cuda else {}  # binds nccl (and barrier) to this GPU
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s), **kw)
    try:
        yield current()
    finally:
        dist.destroy_process_group()


def check_devices(device_name: str, nproc: int) -> None:
    """One GPU per process: a CUDA run cannot start more processes than there are GPUs."""
    if _wants_cuda(device_name):
        n = torch.cuda.device_count()
        if n == 0:
            raise UserError(f"train.device={device_name} but CUDA is not available; use train.device=cpu")
        if nproc > n:
            raise UserError(f"{nproc} processes but {n} GPU(s): use --nproc {n} or fewer (one GPU per process), "
                            "or train.device=cpu")


def rank_device(env: DistEnv, device: torch.device) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` for CUDA runs with several processes."""
    if not env.enabled or device.type != "cuda":
        return device
    if device.index is not None and device.index != env.local_rank:
        raise UserError(f"train.device={device} names one GPU but {env.world_size} processes are running; "
                        "use train.device=cuda (each rank takes cuda:LOCAL_RANK)")
    return torch.device("cuda", env.local_rank)


def wrap_ddp(module: torch.nn.Module, device: torch.device, find_unused: bool = False) -> torch.nn.Module:
    """``module`` in DistributedDataParallel (its forward is what training calls: it prepares the
    gradient all-reduce); ``find_unused`` when some parameters may get no gradient in a step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused)


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """``train.batch_size`` is global; each of ``world_size`` ranks takes an equal share."""
    if global_batch < 1:
        raise UserError(f"train.batch_size must be >= 1, got {global_batch}")
    if global_batch % world_size:
        raise UserError(f"train.batch_size={global_batch} (the global batch) must be divisible by the number of "
                        f"processes ({world_size}); choose e.g. train.batch_size={global_batch // world_size * world_size or world_size}")
    return global_batch // world_size


class ShardedBatches(Sampler):
    """A distributed batch sampler: the single-process batches, each split among the ranks.

    ``sampler`` is the single-process sampler (a ``RandomSampler`` drawing from the loader's
    generator, exactly as ``DataLoader(shuffle=True, generator=g)`` builds it), so the epoch's
    permutation is the one a single process draws, whatever else touches the generator (worker
    seeds, progress bars). Global batch i is the next ``global_batch`` indices; rank r takes its
    positions r, r + W, r + 2W, ... A last, partial batch whose size is not a multiple of W is
    padded with the first indices of the epoch (DistributedSampler's rule), so every rank takes
    part in every step with a batch of the same size."""

    def __init__(self, sampler: Sampler, global_batch: int, rank: int, world_size: int):
        self.sampler, self.batch, self.rank, self.world = sampler, global_batch, rank, world_size

    def __iter__(self) -> Iterator[List[int]]:
        order = iter(self.sampler)
        first: List[int] = []
        while True:
            chunk = [int(i) for i in itertools.islice(order, self.batch)]
            if not chunk:
                return
            first = first or list(chunk)
            pad = -len(chunk) % self.world
            while pad > 0:
                take = first[:pad]
                chunk += take
                pad -= len(take)
            yield chunk[self.rank::self.world]

    def __len__(self) -> int:
        return -(-len(self.sampler) // self.batch)


class Shard(Sampler):
    """Positions rank, rank + W, ... of 0..n-1, no padding: exact sums over a split test set."""

    def __init__(self, n: int, rank: int, world_size: int):
        self.n, self.rank, self.world = n, rank, world_size

    def __iter__(self):
        return iter(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world))


def rank_seed(seed: int, rank: int) -> int:
    """The global-RNG seed of rank ``rank`` after model initialisation (rank 0 keeps its stream)."""
    return (seed + 1_000_003 * rank) % 2**63


# ---------------------------------------------------------------------------------- launcher
def torchrun_command(nproc: int, args: Sequence[str]) -> List[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N -m recurvit <args>``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={int(nproc)}",
            "-m", "recurvit", *args]


def launch(nproc: int, args: Sequence[str]) -> int:
    """Runs ``recurvit <args>`` in ``nproc`` processes under torchrun; returns its exit status."""
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if launched_world_size() > 1:
        raise UserError("--nproc given inside a torchrun job; drop --nproc (torchrun already started the processes)")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))  # torchrun's default is 1
    try:
        rc = subprocess.call(torchrun_command(nproc, args), env=env, preexec_fn=_end_with_parent)
    except KeyboardInterrupt:
        return 130
    if rc < 0:  # torchrun itself was killed (kill -9, the OOM killer): its ranks said nothing, so say it here
        import signal

        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        print(f"error: torchrun was ended by {name}; the run keeps its last whole epoch (continue it with "
              "--resume RUN)", file=sys.stderr)
        return 128 - rc  # the shell's convention (137 for SIGKILL), not 256 - 9 = 247
    return rc


def _end_with_parent() -> None:
    """In the torchrun child, before it starts: SIGTERM when this launcher dies (Linux: PR_SET_PDEATHSIG),
    so that a killed ``recurvit train --nproc N`` takes torchrun, and torchrun its ranks, with it
    (they would otherwise train on as orphans holding the run's lock)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher's own signals still reach the group
        pass


__all__ = ["DistEnv", "SINGLE", "session", "current", "check_devices", "rank_device", "per_rank_batch", "ShardedBatches", "Shard",
           "rank_seed", "launch", "torchrun_command", "launched_world_size"]
