#!/usr/bin/env python3
"""A process tree shaped like torchrun's, for the sidecar's tests.

The agent (this script) starts N workers, each in its own session (as
torchrun does with start_new_session), and restarts a worker when it dies,
like torchrun's elastic agent. Everything is logged, one line per event, to
the --log file:

    <unix time> agent-start <pid>
    <unix time> spawn <worker pid> <slot> <generation>
    <unix time> worker-sigterm <worker pid>      (written by the worker)
    <unix time> exit <worker pid> <slot> <returncode>
    <unix time> agent-sigterm <pid>

--tag is any token that makes this agent's command line unique, so a test
can point TRAINWIRE_AGENT_MATCH at exactly this agent. The agent and its
workers exit on their own when their parent goes away.
"""
import argparse, os, signal, subprocess, sys, time

WORKER = r"""
import os, signal, sys, time
log, slot = sys.argv[1], sys.argv[2]
# The agent's pid comes from the agent itself: reading getppid() here would
# race with an agent killed before this worker started (it would read 1, the
# adoptive parent, and never exit).
agent = int(sys.argv[3])
def say(*a):
    with open(log, "a") as f:
        f.write(" ".join([f"{time.time():.6f}"] + [str(x) for x in a]) + "\n")
def on_term(signum, frame):
    say("worker-sigterm", os.getpid())
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
while os.getppid() == agent:
    time.sleep(0.05)
"""

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    def say(*a):
        with open(args.log, "a") as f:
            f.write(" ".join([f"{time.time():.6f}"] + [str(x) for x in a]) + "\n")

    def on_term(signum, frame):
        # A real agent blocked on a dead c10d store ignores SIGTERM; log it.
        say("agent-sigterm", os.getpid())
    signal.signal(signal.SIGTERM, on_term)

    parent = os.getppid()
    say("agent-start", os.getpid())
    generation = 0
    procs = {}
    def spawn(slot):
        p = subprocess.Popen([sys.executable, "-u", "-c", WORKER, args.log, str(slot), str(os.getpid())],
                             start_new_session=True)
        procs[slot] = p
        say("spawn", p.pid, slot, generation)
    for slot in range(args.workers):
        spawn(slot)
    while os.getppid() == parent:
        for slot, p in list(procs.items()):
            rc = p.poll()
            if rc is not None:
                say("exit", p.pid, slot, rc)
                generation += 1
                spawn(slot)
        time.sleep(0.05)
    for p in procs.values():
        try:
            p.kill()
        except Exception:
            pass

if __name__ == "__main__":
    main()
