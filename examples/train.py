#!/usr/bin/env python3
"""A small, real torchrun DDP training job that survives losing a node.

Run it the way trainwire runs it, with torchrun reading its flags from the
``PET_*`` environment the webhook injects::

    torchrun examples/train.py

or by hand on one machine::

    torchrun --nnodes 1 --nproc-per-node 2 examples/train.py --steps 200

What it shows:

* DDP on ``gloo`` (CPU) or ``nccl`` (when CUDA is available), with synthetic
  data and a small model, so it runs anywhere PyTorch is installed.
* Checkpoints in ``CHECKPOINT_DIR`` (default ``./checkpoints``), a directory
  every node shares (a PVC in Kubernetes). Rank 0 saves every
  ``--checkpoint-interval`` steps, atomically: it writes a temporary file in
  the same directory, fsyncs it, renames it into place with ``os.replace``,
  then replaces the ``latest`` pointer the same way. A crash at any moment
  leaves either the old or the new checkpoint, never a torn one.
* Resume on start: every rank loads the newest complete checkpoint (step,
  model, optimizer) that rank 0 picked, so after torchrun restarts the workers
  (a node was lost and replaced) training continues where it stopped.
* Parseable log lines, one per event, all starting with ``[trainwire-train]``
  and ending with the time the trainer wrote them (``at``, seconds since the
  epoch: a container runtime stamps a line when it reads it, late on a busy
  node)::

    [trainwire-train] start rank=0 world_size=2 backend=gloo resumed_from=120 checkpoint=/ckpt/ckpt-00000120.pt at=1764910087.123
    [trainwire-train] step=130 loss=0.012345 resumed_from=120 world_size=2 at=1764910088.350
    [trainwire-train] checkpoint step=140 path=/ckpt/ckpt-00000140.pt at=1764910090.871
    [trainwire-train] done step=200 resumed_from=120 at=1764910105.002

Every flag can also be set from the environment (``TRAIN_STEPS``,
``TRAIN_CHECKPOINT_INTERVAL``, ``TRAIN_SLEEP``, ...), so a manifest can tune
it without changing the command.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

LOG_PREFIX = "[trainwire-train]"
CKPT_RE = re.compile(r"^ckpt-(\d{8,})\.pt$")
LATEST = "latest"


def log(msg: str) -> None:
    """One whole line per write(2): the ranks of a node share torchrun's
    stdout, and ``print`` under ``python -u`` (as torchrun starts workers)
    writes the text and the newline separately, so lines of two ranks could
    interleave. A single write of less than PIPE_BUF bytes cannot. It ends
    with the time it is written (``at=``)."""
    line = f"{LOG_PREFIX} {msg} at={time.time():.3f}\n".encode()
    try:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line)
    except (OSError, ValueError, AttributeError):  # no real file descriptor
        print(line.decode(), end="", flush=True)


def env_default(name: str, default, kind=str):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        sys.exit(f"{LOG_PREFIX} error: {name}={raw!r} is not a valid {kind.__name__}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=env_default("TRAIN_STEPS", 500, int),
                   help="total optimizer steps; the job ends after this step (env TRAIN_STEPS)")
    p.add_argument("--checkpoint-interval", type=int,
                   default=env_default("TRAIN_CHECKPOINT_INTERVAL", 50, int),
                   help="rank 0 saves a checkpoint every N steps (env TRAIN_CHECKPOINT_INTERVAL)")
    p.add_argument("--checkpoint-dir",
                   default=os.environ.get("CHECKPOINT_DIR") or "./checkpoints",
                   help="shared checkpoint directory (env CHECKPOINT_DIR, default ./checkpoints)")
    p.add_argument("--keep", type=int, default=env_default("TRAIN_KEEP", 3, int),
                   help="complete checkpoints to keep; older ones are deleted (env TRAIN_KEEP)")
    p.add_argument("--sleep", type=float, default=env_default("TRAIN_SLEEP", 0.0, float),
                   help="seconds to sleep after each step, to make a run slow enough to interrupt (env TRAIN_SLEEP)")
    p.add_argument("--quiet-every", type=int, default=env_default("TRAIN_QUIET_EVERY", 0, int),
                   help="every N steps rank 0 spends --quiet-for seconds without collectives, as an "
                        "evaluation on one rank or a long save would; 0: never (env TRAIN_QUIET_EVERY)")
    p.add_argument("--quiet-for", type=float, default=env_default("TRAIN_QUIET_FOR", 0.0, float),
                   help="seconds of each quiet phase (env TRAIN_QUIET_FOR)")
    p.add_argument("--log-every", type=int, default=env_default("TRAIN_LOG_EVERY", 10, int),
                   help="rank 0 logs the loss every N steps (env TRAIN_LOG_EVERY)")
    p.add_argument("--batch-size", type=int, default=env_default("TRAIN_BATCH_SIZE", 32, int),
                   help="per-rank batch size (env TRAIN_BATCH_SIZE)")
    p.add_argument("--hidden", type=int, default=env_default("TRAIN_HIDDEN", 64, int),
                   help="hidden width of the model (env TRAIN_HIDDEN)")
    p.add_argument("--lr", type=float, default=env_default("TRAIN_LR", 0.01, float),
                   help="learning rate (env TRAIN_LR)")
    p.add_argument("--seed", type=int, default=env_default("TRAIN_SEED", 1234, int),
                   help="seed of the synthetic data and the model (env TRAIN_SEED)")
    p.add_argument("--pg-timeout", type=float, default=env_default("TRAIN_PG_TIMEOUT", 0.0, float),
                   help="process-group timeout in seconds; 0 keeps PyTorch's default (env TRAIN_PG_TIMEOUT)")
    args = p.parse_args(argv)
    for name in ("steps", "checkpoint_interval", "log_every", "batch_size", "hidden", "keep"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.sleep < 0:
        p.error(f"--sleep must not be negative, got {args.sleep}")
    if args.quiet_every < 0 or args.quiet_for < 0:
        p.error("--quiet-every and --quiet-for must not be negative")
    return args


# ---------------------------------------------------------------- checkpoint


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory
    finally:
        os.close(fd)


def write_atomically(directory: str, name: str, write) -> str:
    """Write ``name`` in ``directory`` through a temporary file, fsync, rename."""
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(directory)
    return final


def save_checkpoint(directory: str, step: int, model: nn.Module, optimizer, keep: int) -> str:
    state = {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "saved_at": time.time(),
    }
    name = checkpoint_name(step)
    path = write_atomically(directory, name, lambda f: torch.save(state, f))
    # The pointer goes last: it only ever names a checkpoint that is complete.
    write_atomically(directory, LATEST, lambda f: f.write((name + "\n").encode()))
    prune(directory, keep, protect=path)
    return path


def complete_checkpoints(directory: str) -> list[tuple[int, str]]:
    """Checkpoint files by step, newest first (temporary files never match)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = CKPT_RE.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(directory, name)))
    found.sort(reverse=True)
    return found


def prune(directory: str, keep: int, protect: str) -> None:
    """Delete all but the newest ``keep`` checkpoints, never ``protect`` (the one just saved)."""
    for _, path in complete_checkpoints(directory)[keep:]:
        if path == protect:
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


def load_state(path: str):
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= state.keys():
        raise ValueError("not a trainwire checkpoint (missing step/model/optimizer)")
    return state


def pick_checkpoint(directory: str):
    """The newest checkpoint that loads: the ``latest`` pointer first, then by step.

    Returns ``(path, state)`` or ``(None, None)``. A pointer to a missing or
    unreadable file (a checkpoint deleted by hand, a disk that lost the tail of
    a file) falls back to the next older checkpoint instead of failing.
    """
    candidates = []
    try:
        with open(os.path.join(directory, LATEST)) as f:
            name = f.read().strip()
        if CKPT_RE.match(name):
            candidates.append(os.path.join(directory, name))
        else:
            log(f"warning: ignoring pointer {directory}/{LATEST}: {name!r} is not a checkpoint name")
    except FileNotFoundError:
        pass
    except OSError as e:
        log(f"warning: cannot read {directory}/{LATEST}: {e}")
    candidates += [p for _, p in complete_checkpoints(directory) if p not in candidates]
    for path in candidates:
        try:
            return path, load_state(path)
        except FileNotFoundError:
            log(f"warning: checkpoint {path} is gone, trying an older one")
        except Exception as e:  # a torn or foreign file: skip it, keep looking
            log(f"warning: skipping unreadable checkpoint {path}: {type(e).__name__}: {e}")
    return None, None


# ------------------------------------------------------------------ training


class Net(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(16, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, x):
        return self.layers(x)


def batch(step: int, rank: int, args, device):
    """Synthetic regression data that depends only on (seed, step, rank).

    A resumed run therefore sees exactly the batches it would have seen.
    """
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(args.batch_size, 16, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True) * 0.5 + torch.sin(x[:, 4:5])).clamp(-3, 3)
    return x.to(device), y.to(device)


def setup():
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    return distributed, backend, device


def main(argv=None) -> int:
    args = parse_args(argv)
    distributed, backend, device = setup()
    if distributed:
        kwargs = {"backend": backend}
        if args.pg_timeout > 0:
            kwargs["timeout"] = datetime.timedelta(seconds=args.pg_timeout)
        dist.init_process_group(**kwargs)
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        backend, rank, world = "none", 0, 1

    ckpt_dir = os.path.abspath(args.checkpoint_dir)
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)

    torch.manual_seed(args.seed)
    model = Net(args.hidden).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    # Rank 0 picks the checkpoint and tells the others which one, so every
    # rank resumes from the same step even if the directory changes meanwhile.
    choice = [None]
    if rank == 0:
        path, _ = pick_checkpoint(ckpt_dir)
        choice = [path]
    if distributed:
        dist.broadcast_object_list(choice, src=0)
    path = choice[0]
    start, resumed_from = 0, "none"
    if path is not None:
        state = load_state(path)  # every rank reads the shared file itself
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        resumed_from = str(start)
    log(f"start rank={rank} world_size={world} backend={backend} resumed_from={resumed_from} "
        f"checkpoint={path or 'none'} restart_count={os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}")

    ddp = DDP(model) if distributed else model
    loss_fn = nn.MSELoss()
    step = start
    while step < args.steps:
        x, y = batch(step, rank, args, device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        step += 1
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            log(f"step={step} loss={loss.item():.6f} resumed_from={resumed_from} world_size={world}")
        if rank == 0 and step % args.checkpoint_interval == 0:
            saved = save_checkpoint(ckpt_dir, step, model, optimizer, args.keep)
            log(f"checkpoint step={step} path={saved}")
        if args.sleep:
            time.sleep(args.sleep)
        if rank == 0 and args.quiet_every and step % args.quiet_every == 0 and args.quiet_for:
            # The other ranks wait in the next step's all-reduce meanwhile.
            log(f"quiet step={step} seconds={args.quiet_for}")
            time.sleep(args.quiet_for)

    if rank == 0 and step % args.checkpoint_interval != 0 and step > start:
        saved = save_checkpoint(ckpt_dir, step, model, optimizer, args.keep)
        log(f"checkpoint step={step} path={saved}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        log(f"done step={step} resumed_from={resumed_from}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
