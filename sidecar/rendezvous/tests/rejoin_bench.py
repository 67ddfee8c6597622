"""Seconds from a survivor's next_rendezvous, after the sidecar's word of a
lost participant, to the new round complete with the spare (docs/benchmarks.md,
"trainwire's rendezvous handler"): real handlers on a real TCPStore in one
process, a world of 2 + 1 spare. `torch` runs the join with torch's poll (1 s
sleep, 1 s state cache), `trainwire` with the handler's (``poll_seconds``).

Run from this directory, with the handler installed (or from the source):
    TRAINWIRE_HANDLER_DIR=<dir> python3 rejoin_bench.py torch,trainwire 5
"""
import sys
import time
import unittest

import test_handler as th

tw = th.tw


def rejoin(case: unittest.TestCase, mode: str, i: int) -> float:
    w = th.World(case, 2, 2)
    a, b, spare, results, threads = w.formed_with_a_spare()
    if mode == "torch":
        tw._poll["seconds"] = None
        for h in (a, b, spare):
            h._state_holder._cache_duration = 1
    b._stop_heartbeats()
    w.tell(0, [(f"1-{i}", 1, th.now())])
    th.wait_for("the survivor to hear the loss", lambda: a.num_nodes_waiting() > 0)
    start = time.monotonic()
    th.finish(*w.join(a))
    th.finish(results, threads)
    took = time.monotonic() - start
    a._stop_heartbeats()
    spare._stop_heartbeats()
    return took


if __name__ == "__main__":
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else ["torch", "trainwire"]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    case = unittest.TestCase()
    for mode in modes:
        times = [rejoin(case, mode, n) for n in range(runs)]
        times.sort()
        print(
            f"{mode}: rejoin with the spare in {' '.join(f'{t:.2f}' for t in times)} s "
            f"(median {times[len(times) // 2]:.2f} s, {runs} runs)"
        )
    case.doCleanups()
