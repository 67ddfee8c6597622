#!/usr/bin/env python3
"""What torch's c10d rendezvous costs its store, at 128 and 1,024 agents.

One real torch TCPStore (`is_master=True, multi_tenant=True`, as the dedicated
store runs it) in a process of its own, and N simulated torchrun agents, each
with its own client connection, doing on the wire what
`_BackendRendezvousStateHolder` and `C10dRendezvousBackend` do once a round is
complete:

- every second (the state holder's 1 s cache, refreshed by the agent's
  `num_nodes_waiting()` poll): `get` of `torch.rendezvous.<run_id>`;
- every keep-alive interval: the keep-alive op, a `compare_set` of the whole
  state with the value last read as the token, retried on a lost race after a
  fresh `get` (the op executor's loop).

The value is the size of a real state: a `_RendezvousState` of N participants
with their heartbeats, pickled and base64-encoded as the backend stores it.
Each agent rewrites only its own bytes of it, which costs the store the same
as a real keep-alive (the value's size is all the store sees).

Prints one markdown row per configuration: agents, keep-alive interval, the
state's size, operations per second served, the store process's CPU (share of
one core), the median and 99th-percentile latency of `get` and of a
keep-alive (with its retries), and the share of `compare_set` calls that lost
a race. Every run is bounded by `--seconds`.

Usage: python3 tests/scripts/store_load.py [--agents 128,1024]
       [--keep-alive 1,5] [--seconds 10]
"""

import argparse
import base64
import multiprocessing
import os
import pickle
import statistics
import sys
import threading
import time
from datetime import datetime, timedelta, timezone


# The store clients warn once per connection that they cannot name their host.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def store_process(port_queue, stop):
    from torch.distributed import TCPStore

    store = TCPStore(
        "127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False
    )
    port_queue.put(store.port)
    stop.wait()


def real_state_bytes(nodes):
    """The base64 of a pickled `_RendezvousState` with `nodes` participants."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        _NodeDesc,
        _RendezvousState,
    )

    state = _RendezvousState()
    state.round = 3
    state.complete = True
    now = datetime.now(timezone.utc)
    for i in range(nodes):
        node = _NodeDesc(f"train-{i}.train.default.svc.cluster.local", 40 + i, 0)
        state.participants[node] = i
        state.last_heartbeats[node] = now
    return base64.b64encode(pickle.dumps(state))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def run(port, agents, keep_alive, seconds, store_pid):
    from torch.distributed import TCPStore

    key = "torch.rendezvous.bench"
    value = real_state_bytes(agents)
    setup = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    setup.set(key, value)

    gets, keepalives = [], []
    counts = {"ops": 0, "cas": 0, "lost": 0}
    lock = threading.Lock()
    ready = threading.Barrier(agents + 1)
    deadline = [float("inf")]

    def agent(index):
        client = TCPStore(
            "127.0.0.1",
            port,
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        slot = (index * 97) % max(1, len(value) - 8)
        my_gets, my_keepalives, ops, cas, lost = [], [], 0, 0, 0
        current = client.get(key)
        ready.wait()
        # Spread the agents over the interval as independent timers are.
        phase = (index / agents) * keep_alive
        next_get = time.monotonic() + (index / agents)
        next_keep_alive = time.monotonic() + phase
        while True:
            now = time.monotonic()
            if now >= deadline[0]:
                break
            if now >= next_keep_alive:
                started = time.monotonic()
                for _ in range(64):
                    new = bytearray(current)
                    new[slot : slot + 8] = os.urandom(6).hex()[:8].encode()
                    answer = client.compare_set(key, current, bytes(new))
                    ops += 1
                    cas += 1
                    if answer == bytes(new):
                        current = answer
                        break
                    lost += 1
                    current = answer
                my_keepalives.append(time.monotonic() - started)
                next_keep_alive += keep_alive
                continue
            if now >= next_get:
                started = time.monotonic()
                current = client.get(key)
                ops += 1
                my_gets.append(time.monotonic() - started)
                next_get += 1.0
                continue
            time.sleep(max(0.0, min(next_get, next_keep_alive, deadline[0]) - now))
        with lock:
            gets.extend(my_gets)
            keepalives.extend(my_keepalives)
            counts["ops"] += ops
            counts["cas"] += cas
            counts["lost"] += lost

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(agents)]
    for t in threads:
        t.start()
    ready.wait()
    start_cpu = cpu_seconds(store_pid)
    start = time.monotonic()
    deadline[0] = start + seconds
    for t in threads:
        t.join(timeout=seconds + 120)
    elapsed = time.monotonic() - start
    cpu = (cpu_seconds(store_pid) - start_cpu) / elapsed
    return {
        "agents": agents,
        "keep_alive": keep_alive,
        "state_kb": len(value) / 1024,
        "ops_s": counts["ops"] / elapsed,
        "cpu": cpu,
        "get_p50": statistics.median(gets) if gets else float("nan"),
        "get_p99": percentile(gets, 0.99),
        "ka_p50": statistics.median(keepalives) if keepalives else float("nan"),
        "ka_p99": percentile(keepalives, 0.99),
        "lost": counts["lost"] / counts["cas"] if counts["cas"] else 0.0,
        # A get moves the value once; a compare_set three times (token,
        # new value, the answer).
        "mb_s": (counts["ops"] + 2 * counts["cas"]) * len(value) / elapsed / 1e6,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="128,1024")
    parser.add_argument("--keep-alive", default="1,5")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    agent_counts = [int(a) for a in args.agents.split(",")]
    intervals = [float(k) for k in args.keep_alive.split(",")]
    if any(a < 1 or a > 4096 for a in agent_counts) or not 1 <= args.seconds <= 120:
        sys.exit("store_load: agents 1..4096, seconds 1..120")

    context = multiprocessing.get_context("spawn")
    ports, stop = context.Queue(), context.Event()
    store = context.Process(target=store_process, args=(ports, stop), daemon=True)
    store.start()
    port = ports.get(timeout=60)
    print(
        f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; "
        f"{args.seconds:.0f} s per row"
    )
    print(
        "| agents | keep-alive | state | ops/s | store CPU | get p50 / p99 | "
        "keep-alive p50 / p99 | CAS lost | bytes moved |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    try:
        for agents in agent_counts:
            for interval in intervals:
                r = run(port, agents, interval, args.seconds, store.pid)
                print(
                    f"| {r['agents']} | {r['keep_alive']:g} s | {r['state_kb']:.0f} KiB | "
                    f"{r['ops_s']:.0f} | {r['cpu'] * 100:.0f} % | "
                    f"{r['get_p50'] * 1e3:.1f} / {r['get_p99'] * 1e3:.1f} ms | "
                    f"{r['ka_p50'] * 1e3:.1f} / {r['ka_p99'] * 1e3:.1f} ms | "
                    f"{r['lost'] * 100:.0f} % | {r['mb_s']:.0f} MB/s |",
                    flush=True,
                )
    finally:
        stop.set()
        store.join(timeout=10)
        if store.is_alive():
            store.kill()


if __name__ == "__main__":
    main()
