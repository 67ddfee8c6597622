"""Seconds from a fresh torchrun agent's start to its workers' first line,
with trainwire's handler and forkserver workers: the forkserver started at
the agent's start (``torchrun``: trainwire's sitecustomize) against started
by the handler (``python -c 'from torch.distributed.run import main; main()'``,
which sitecustomize does not recognise). docs/benchmarks.md, "Warm workers".
Run: cd sidecar/rendezvous/tests && python3 agent_start_bench.py 5
"""
import os, subprocess, sys, tempfile, time

import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)
TRAIN = "import torch\nprint('first', flush=True)\n"


def once(early: bool, d: str) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    script = os.path.join(d, "train.py")
    with open(script, "w") as f:
        f.write(TRAIN)
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR, PET_NNODES="1", PET_NPROC_PER_NODE="2",
               PET_RDZV_BACKEND="trainwire-c10d", PET_RDZV_ENDPOINT=f"127.0.0.1:{store.port}",
               PET_RDZV_ID=f"bench{time.monotonic_ns()}", PET_RDZV_CONF="is_host=false",
               NODE_RANK="0", TRAINWIRE_RENDEZVOUS_DIR=d, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               PET_START_METHOD="forkserver", PET_RUN_PATH="1")
    cmd = ["torchrun", script] if early else [
        sys.executable, "-c", "from torch.distributed.run import main; main()", script]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("first"):
            took = time.monotonic() - t0
            break
    else:
        took = float("nan")
    p.wait(timeout=120)
    return took


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for early in (True, False, True, False)[: 2 if n == 1 else 4]:
        with tempfile.TemporaryDirectory() as d:
            runs = [once(early, d) for _ in range(max(1, n // 2))]
        print("early" if early else "handler", " ".join(f"{x:.2f}" for x in runs))
