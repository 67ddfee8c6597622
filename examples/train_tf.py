#!/usr/bin/env python3
"""A small, real TensorFlow MultiWorkerMirroredStrategy job that survives
losing a worker by restarting from its checkpoint.

Run it the way trainwire runs it (``trainwire.dev/framework: tensorflow``),
with the cluster read from the ``TF_CONFIG`` the webhook injects::

    python3 examples/train_tf.py

What it shows:

* ``tf.distribute.MultiWorkerMirroredStrategy`` forming its cluster from
  ``TF_CONFIG`` alone, on CPU (``tensorflow-cpu``), a small Keras model and
  synthetic data, so it runs anywhere TensorFlow is installed.
* Checkpoints in ``CHECKPOINT_DIR`` (default ``./checkpoints``), a directory
  every worker shares (a PVC in Kubernetes), written with
  ``tf.train.CheckpointManager`` every ``--checkpoint-interval`` steps. Every
  worker takes part in a save (the variables are mirrored); the chief
  (task index 0) writes to ``CHECKPOINT_DIR``, the others to a scratch
  directory they delete, as TensorFlow's multi-worker guide says.
* Resume on start: every worker restores the newest checkpoint, so after the
  world restarts (a worker was lost, the survivors' containers exited and
  came back) training continues where it stopped. MultiWorkerMirroredStrategy
  has no elastic agent: a lost worker means the whole world starts again.
* The same parseable log lines as ``examples/train.py``::

    [trainwire-train] start rank=0 world_size=2 backend=tensorflow resumed_from=20 checkpoint=/ckpt/ckpt-2 at=1764910087.123
    [trainwire-train] step=30 loss=0.012345 resumed_from=20 world_size=2 at=1764910088.350
    [trainwire-train] checkpoint step=30 path=/ckpt/ckpt-3 at=1764910088.412
    [trainwire-train] done step=60 resumed_from=20 at=1764910095.002

Every flag can also be set from the environment (``TRAIN_STEPS``,
``TRAIN_CHECKPOINT_INTERVAL``, ``TRAIN_SLEEP``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

LOG_PREFIX = "[trainwire-train]"


def log(msg: str) -> None:
    """One whole line per write(2), ending with the time it is written, as
    in examples/train.py."""
    line = f"{LOG_PREFIX} {msg} at={time.time():.3f}\n".encode()
    try:
        sys.stdout.flush()
        os.write(sys.stdout.fileno(), line)
    except (OSError, ValueError, AttributeError):
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
    p.add_argument("--steps", type=int, default=env_default("TRAIN_STEPS", 200, int),
                   help="total steps; the job ends after this step (env TRAIN_STEPS)")
    p.add_argument("--checkpoint-interval", type=int,
                   default=env_default("TRAIN_CHECKPOINT_INTERVAL", 20, int),
                   help="save a checkpoint every N steps (env TRAIN_CHECKPOINT_INTERVAL)")
    p.add_argument("--checkpoint-dir",
                   default=os.environ.get("CHECKPOINT_DIR") or "./checkpoints",
                   help="shared checkpoint directory (env CHECKPOINT_DIR, default ./checkpoints)")
    p.add_argument("--keep", type=int, default=env_default("TRAIN_KEEP", 3, int),
                   help="checkpoints to keep (env TRAIN_KEEP)")
    p.add_argument("--sleep", type=float, default=env_default("TRAIN_SLEEP", 0.0, float),
                   help="seconds to sleep after each step (env TRAIN_SLEEP)")
    p.add_argument("--log-every", type=int, default=env_default("TRAIN_LOG_EVERY", 10, int),
                   help="the chief logs the loss every N steps (env TRAIN_LOG_EVERY)")
    p.add_argument("--batch-size", type=int, default=env_default("TRAIN_BATCH_SIZE", 32, int),
                   help="per-worker batch size (env TRAIN_BATCH_SIZE)")
    p.add_argument("--seed", type=int, default=env_default("TRAIN_SEED", 1234, int),
                   help="seed of the synthetic data and the model (env TRAIN_SEED)")
    args = p.parse_args(argv)
    for name in ("steps", "checkpoint_interval", "log_every", "batch_size", "keep"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.sleep < 0:
        p.error(f"--sleep must not be negative, got {args.sleep}")
    return args


def task() -> tuple[int, int]:
    """(task index, number of workers) from TF_CONFIG; (0, 1) without it."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return 0, 1
    try:
        conf = json.loads(raw)
        return int(conf["task"]["index"]), len(conf["cluster"]["worker"])
    except (ValueError, KeyError, TypeError) as e:
        sys.exit(f"{LOG_PREFIX} error: TF_CONFIG is not a cluster spec with a task index: {e}: {raw!r}")


def main(argv=None) -> int:
    args = parse_args(argv)
    index, workers = task()
    import tensorflow as tf  # slow: after the argument checks

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    world = strategy.num_replicas_in_sync
    chief = index == 0

    ckpt_dir = os.path.abspath(args.checkpoint_dir)
    scratch = None
    if chief:
        os.makedirs(ckpt_dir, exist_ok=True)
        save_dir = ckpt_dir
    else:
        scratch = tempfile.mkdtemp(prefix=f"tf-worker-{index}-")
        save_dir = scratch

    with strategy.scope():
        tf.keras.utils.set_random_seed(args.seed)
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(16,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(1),
        ])
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = tf.train.CheckpointManager(ckpt, save_dir, max_to_keep=args.keep)
    # Every worker restores the chief's newest checkpoint (the shared directory).
    latest = tf.train.latest_checkpoint(ckpt_dir)
    resumed_from = "none"
    if latest:
        ckpt.restore(latest)
        resumed_from = str(int(step_var.numpy()))
    start = int(step_var.numpy())
    log(f"start rank={index} world_size={world} workers={workers} backend=tensorflow "
        f"resumed_from={resumed_from} checkpoint={latest or 'none'}")

    def batch(step: int):
        """Synthetic data that depends only on (seed, step, worker)."""
        g = tf.random.Generator.from_seed(args.seed * 1_000_003 + step * 1009 + index)
        x = g.normal((args.batch_size, 16))
        y = tf.reduce_sum(x[:, :4], axis=1, keepdims=True) * 0.5
        return x, y

    @tf.function
    def train_step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        loss = strategy.run(replica, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)

    step = start
    while step < args.steps:
        x, y = batch(step)
        loss = train_step(x, y)
        step += 1
        step_var.assign(step)
        if chief and (step % args.log_every == 0 or step == args.steps):
            log(f"step={step} loss={float(loss):.6f} resumed_from={resumed_from} world_size={world}")
        if step % args.checkpoint_interval == 0 or step == args.steps:
            saved = manager.save(checkpoint_number=step)
            if chief:
                log(f"checkpoint step={step} path={saved}")
        if args.sleep:
            time.sleep(args.sleep)

    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    if chief:
        log(f"done step={step} resumed_from={resumed_from}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
