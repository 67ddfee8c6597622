"""trainwire: how torchrun's workers start in a trainwire pod.

For a plain ``torchrun script.py`` the injection sets ``PET_START_METHOD=
forkserver`` and ``PET_RUN_PATH=1``: workers are forked from a forkserver
that has torch loaded (milliseconds) instead of started as new interpreters
(seconds). This module holds the two things that make that safe and fast,
and nothing that imports torch, so that ``sitecustomize`` may import it in
every Python process of the trainer:

* ``start_early()``: called by trainwire's ``sitecustomize`` at the start of
  every Python process; in torchrun's agent only (with forkserver workers
  and ``--run-path``), it starts the forkserver at once, so that the
  forkserver loads torch while the agent does and while it meets its peers,
  not after. A new agent (a restarted trainer, a replacement pod) then forks
  its first workers about when its rendezvous completes. The rendezvous
  handler starts it otherwise (``ensure_running`` finds it running).
* ``run_script``: the workers' entrypoint, in place of torch's
  ``run_script_path``, that runs the script as ``python -u script.py``
  would: the script's directory first on ``sys.path`` (a script that
  imports a module beside it), unbuffered standard output and error (a
  ``print`` reaches the log at once).
"""

from __future__ import annotations

import os
import sys

#: What the forkserver imports before it forks workers: what a worker
#: imports before its first step (``torch._dynamo`` is loaded by the
#: optimizer's ``load_state_dict`` and first step), so that a new worker
#: starts with it loaded.
FORKSERVER_PRELOAD = ["torch", "torch.distributed.run", "torch._dynamo"]

#: The handler's backend name (``PET_RDZV_BACKEND``).
BACKEND = "trainwire-c10d"

_TRUE = ("1", "true", "True")


def _flag_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last ``--name value`` or ``--name=value`` in argv."""
    value = None
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            value = argv[i + 1]
        else:
            for name in names:
                if arg.startswith(name + "="):
                    value = arg.split("=", 1)[1]
    return value


def start_method(argv: list[str], environ) -> tuple[str, bool]:
    """torchrun's start method and whether it runs the script in the worker's
    interpreter (``--run-path``), from its arguments and ``PET_*`` env."""
    method = _flag_value(argv, ("--start-method", "--start_method"))
    if method is None:
        method = environ.get("PET_START_METHOD", "spawn")
    run_path = environ.get("PET_RUN_PATH", "") in _TRUE or any(
        a in ("--run-path", "--run_path") for a in argv
    )
    return method, run_path


def warm(argv: list[str], environ) -> str | None:
    """Why workers do not start from a forkserver, or None if they do."""
    method, run_path = start_method(argv, environ)
    if method != "forkserver" or not run_path:
        return f"workers start with {method}{'' if run_path else ' as new interpreters (no --run-path)'}"
    return None


def _agent_argv() -> list[str] | None:
    """This process' arguments after torchrun's own name, if it is torchrun's
    agent (the ``torchrun`` script or ``python -m torch.distributed.run``)."""
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) == "torchrun":
        return argv[1:]
    if argv[:1] == ["-m"]:
        # At site time sys.argv is ['-m', args...]: the module is in the command line.
        try:
            with open("/proc/self/cmdline", "rb") as f:
                cmdline = f.read(1 << 16).split(b"\0")
        except OSError:
            return None
        for i, arg in enumerate(cmdline[:-1]):
            if arg == b"-m":
                if cmdline[i + 1] == b"torch.distributed.run":
                    return argv[1:]
                return None
    return None


def omp_threads(argv: list[str], environ) -> str | None | bool:
    """``OMP_NUM_THREADS`` as torchrun will set it before it starts workers
    (``1`` with more than one process per node, unless already set): a
    string, None when torchrun leaves it unset, False when that cannot be
    told before torchrun parses its arguments (``auto``, ``gpu``, ...)."""
    if "OMP_NUM_THREADS" in environ:
        return environ["OMP_NUM_THREADS"]
    nproc = _flag_value(argv, ("--nproc-per-node", "--nproc_per_node"))
    if nproc is None:
        nproc = environ.get("PET_NPROC_PER_NODE", "1")
    try:
        n = int(nproc)
    except ValueError:
        return False
    return "1" if n > 1 else None


def start_forkserver() -> None:
    """Starts this process' forkserver with torch preloaded (no-op if it runs)."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    forkserver.ensure_running()


def start_early() -> bool:
    """In torchrun's agent with forkserver workers, starts the forkserver now,
    with the environment torchrun will give it (``OMP_NUM_THREADS`` is read
    when torch loads: a forkserver started without it would give every worker
    all cores). Anything unclear: not now, the handler starts it later."""
    if os.environ.get("PET_RDZV_BACKEND") != BACKEND:
        return False
    argv = _agent_argv()
    if argv is None or warm(argv, os.environ) is not None:
        return False
    omp = omp_threads(argv, os.environ)
    if omp is False:
        return False
    set_here = omp is not None and "OMP_NUM_THREADS" not in os.environ
    try:
        if set_here:
            os.environ["OMP_NUM_THREADS"] = str(omp)
        start_forkserver()
    except Exception:  # noqa: BLE001 - the handler tries again, or workers start cold
        return False
    finally:
        if set_here:
            os.environ.pop("OMP_NUM_THREADS", None)
    return True


def _fd(stream) -> int | None:
    try:
        return stream.fileno()
    except Exception:  # noqa: BLE001 - None, or a stream without a descriptor
        return None


def _unbuffered(stream, fd: int):
    """A text stream on ``fd`` as ``python -u`` makes it: no buffer."""
    import io

    try:
        stream.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        return io.TextIOWrapper(
            raw,
            encoding=stream.encoding,
            errors=stream.errors,
            write_through=True,
        )
    except Exception:  # noqa: BLE001 - a closed or odd stream: keep it
        return stream


def run_script(training_script: str, *training_script_args: str) -> None:
    """Runs the training script in this (forked) worker as ``python -u
    script`` runs it (torch's ``run_script_path`` does not put the script's
    directory on ``sys.path``, and the worker's output is buffered)."""
    import runpy

    directory = os.path.dirname(os.path.realpath(training_script))
    if sys.path[:1] != [directory]:
        sys.path.insert(0, directory)
    if _fd(sys.stdout) == 1:
        sys.stdout = _unbuffered(sys.stdout, 1)
    if _fd(sys.stderr) == 2:
        sys.stderr = _unbuffered(sys.stderr, 2)
    sys.argv = [training_script, *training_script_args]
    runpy.run_path(training_script, run_name="__main__")
