"""Seconds from a worker's failure to its restart by torchrun's agent
(docs/real-node.md, "Seconds in a log line"): a real one-node torchrun on
the handler, warm workers (forkserver, --run-path), one worker that raises
in its first run. `trainwire` runs the handler as installed; `torch` leaves
torch's log formatter the agent's exception log (no ``ExceptionText``),
which then imports ``torch._dynamo`` before the agent restarts the worker.

Run from this directory, with the handler installed (or from the source):
    TRAINWIRE_HANDLER_DIR=<dir> python3 failure_restart_bench.py torch,trainwire 3
"""
import re
import sys
import tempfile

import test_handler as th

FAILS_ONCE = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    print(f"failed at {time.time():.3f}", flush=True)
    raise RuntimeError("the worker failed")
print(f"restarted at {time.time():.3f}", flush=True)
dist.destroy_process_group()
"""

# The handler as it was before ExceptionText: torch's formatter sees the
# exception.
WITHOUT_EXCEPTION_TEXT = "import trainwire_rendezvous as tw\ntw._install_exception_text = lambda: 0\n"


def failure_to_restart(mode: str) -> float:
    with tempfile.TemporaryDirectory() as d:
        out = th.torchrun(
            {"PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "1", "PET_START_METHOD": "forkserver", "PET_RUN_PATH": "1"},
            d,
            prelude=WITHOUT_EXCEPTION_TEXT if mode == "torch" else "",
            train=FAILS_ONCE,
        )
    failed = re.search(r"failed at ([0-9.]+)", out.stdout)
    restarted = re.search(r"restarted at ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not failed or not restarted:
        raise SystemExit(f"torchrun did not fail once and restart (exit {out.returncode}):\n{out.stdout}\n{out.stderr}")
    return float(restarted.group(1)) - float(failed.group(1))


if __name__ == "__main__":
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["torch", "trainwire"]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    for mode in modes:
        times = sorted(failure_to_restart(mode) for _ in range(runs))
        print(
            f"{mode}: failure to restart in {' '.join(f'{t:.2f}' for t in times)} s "
            f"(median {times[len(times) // 2]:.2f} s, {runs} runs)"
        )
