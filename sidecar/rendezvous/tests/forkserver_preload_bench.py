"""Seconds from a forkserver child's start to its first optimizer step, for a
preload list (docs/benchmarks.md). Run: OMP_NUM_THREADS=1 python3
forkserver_preload_bench.py torch,torch.distributed.run[,torch._dynamo] 4
"""
import multiprocessing as mp, sys, time, os
from multiprocessing import forkserver

def work(t0, q):
    import torch
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    loss = m(torch.randn(4, 8)).sum()
    loss.backward()
    opt.step()
    q.put(time.monotonic() - t0)

if __name__ == "__main__":
    preload = sys.argv[1].split(",")
    mp.set_start_method("forkserver")
    mp.set_forkserver_preload(preload)
    forkserver.ensure_running()
    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    # the server is warm once a first child ran
    p = ctx.Process(target=time.sleep, args=(0,)); p.start(); p.join()
    out = []
    for _ in range(int(sys.argv[2])):
        t0 = time.monotonic()
        p = ctx.Process(target=work, args=(t0, q)); p.start()
        out.append(q.get()); p.join()
    print(sys.argv[1], " ".join(f"{x:.2f}" for x in out))
