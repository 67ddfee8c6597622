"""trainwire: lets the pod's sidecar ask this process for its Python stacks.

trainwire puts this directory on the trainer's ``PYTHONPATH`` (with its
rendezvous handler for torchrun), so every Python process of the trainer
(torchrun's agent, its forkserver, its workers) imports this module at start,
before any of the program's code. When ``TRAINWIRE_STACKS_SIGNAL`` names a
signal (the injection sets ``SIGPWR``), the process registers Python's
``faulthandler`` for it: on that signal the interpreter writes every thread's
Python stack to the process's standard error (the trainer container's log),
from the signal handler itself, so a worker blocked in a C++ collective, a
data loader or a lock writes it too. The sidecar sends it to a stalled
world's workers before it restarts them (docs/sidecar.md, "A hung world").
No ptrace, no change to the training script. Workers forked from a
forkserver inherit the registration.

In torchrun's agent with forkserver workers (``PET_RDZV_BACKEND=
trainwire-c10d``, ``--start-method forkserver --run-path``), it also starts
the forkserver at once (``trainwire_workers.start_early``): torch then loads
in the forkserver while the agent starts, not after.

This module stands in front of any other ``sitecustomize`` on the path (the
image's or the distribution's): it runs that one next, as Python would have.
"""

import os
import sys


def _trainwire_register_stacks() -> None:
    value = os.environ.get("TRAINWIRE_STACKS_SIGNAL", "")
    if not value:
        return
    try:
        import faulthandler

        import signal

        signum = int(getattr(signal, value))
        if sys.stderr is None:
            return
        faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
    except (ImportError, ValueError, OSError, RuntimeError, AttributeError):
        # A bad value or a stderr without a file descriptor: no stacks,
        # never a failed start.
        pass


def _trainwire_next_sitecustomize() -> None:
    """Runs the first ``sitecustomize.py`` after this directory on ``sys.path``."""
    here = os.path.dirname(os.path.abspath(__file__))
    after = False
    for entry in list(sys.path):
        try:
            path = os.path.abspath(entry or os.getcwd())
        except OSError:
            continue
        if not after:
            after = path == here
            continue
        candidate = os.path.join(path, "sitecustomize.py")
        if not os.path.isfile(candidate):
            continue
        import importlib.util

        spec = importlib.util.spec_from_file_location("_trainwire_next_sitecustomize", candidate)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - Python would only warn too
            print(f"Error in sitecustomize ({candidate}); set PYTHONVERBOSE for traceback:\n"
                  f"{type(e).__name__}: {e}", file=sys.stderr)
        return


def _trainwire_start_forkserver() -> None:
    """In torchrun's agent with forkserver workers: the forkserver now, so
    that it loads torch while the agent starts (``trainwire_workers``, which
    imports nothing heavy and decides)."""
    try:
        import trainwire_workers

        trainwire_workers.start_early()
    except Exception:  # noqa: BLE001 - the handler starts it later
        pass


_trainwire_register_stacks()
_trainwire_next_sitecustomize()
# After the image's own sitecustomize: the forkserver gets the environment it set.
_trainwire_start_forkserver()
