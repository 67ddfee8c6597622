"""The trainwire-c10d handler against a real TCPStore and real torch.

Run: cd sidecar/rendezvous/tests && python3 -m unittest -v test_handler
(tests/tests/rendezvous_handler.rs runs it under nextest, on the files the
sidecar binary installs).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from base64 import b64decode
from datetime import datetime, timedelta, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
# The installed handler (TRAINWIRE_HANDLER_DIR, as the sidecar installs
# it), else the source next to this file.
PACKAGE_DIR = os.environ.get("TRAINWIRE_HANDLER_DIR") or os.path.dirname(HERE)
sys.path.insert(0, PACKAGE_DIR)

import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.rendezvous import RendezvousParameters  # noqa: E402
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr  # noqa: E402

import trainwire_rendezvous as tw  # noqa: E402
import trainwire_workers  # noqa: E402

RUN_ID = "job"

# As injected: each round's workers get their own store (torch's shared
# store is published again only by a new rank 0).
os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"


def wait_for(what, cond, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class World:
    """One TCPStore (the dedicated store) and agents' handlers in threads."""

    def __init__(self, test, min_nodes, max_nodes, last_call=1):
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
        self.dirs = {}
        self.test = test
        self.min_nodes, self.max_nodes, self.last_call = min_nodes, max_nodes, last_call
        self.tmp = tempfile.TemporaryDirectory()
        test.addCleanup(self.tmp.cleanup)

    def handler(self, pod):
        d = os.path.join(self.tmp.name, f"pod-{pod}")
        os.makedirs(d, exist_ok=True)
        self.dirs[pod] = d
        params = RendezvousParameters(
            backend=tw.BACKEND,
            endpoint=f"127.0.0.1:{self.store.port}",
            run_id=RUN_ID,
            min_nodes=self.min_nodes,
            max_nodes=self.max_nodes,
            is_host="false",
            keep_alive_interval=1,
            keep_alive_max_attempt=3,
            last_call_timeout=self.last_call,
            join_timeout=60,
        )
        old = {k: os.environ.get(k) for k in ("NODE_RANK", tw.DIR_ENV)}
        os.environ["NODE_RANK"] = str(pod)
        os.environ[tw.DIR_ENV] = d
        try:
            h = tw.create_handler(params)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.test.addCleanup(h._stop_heartbeats)
        return h

    def join(self, *handlers):
        """next_rendezvous of each handler in a thread; returns the results."""
        results = {}

        def run(h):
            try:
                results[h] = h.next_rendezvous()
            except Exception as e:  # noqa: BLE001
                results[h] = e

        threads = [threading.Thread(target=run, args=(h,), daemon=True) for h in handlers]
        for t in threads:
            t.start()
        return results, threads

    def formed_with_a_spare(self):
        """Pods 0 and 1 form a round of 2; pod 2 then waits as its spare
        (the redundancy list), its join still running. Returns the three
        handlers and the spare's join (results, threads)."""
        a, b, spare = self.handler(0), self.handler(1), self.handler(2)
        finish(*self.join(a, b))
        results, threads = self.join(spare)
        wait_for("the spare in the redundancy list", lambda: spare._this_node in self.state().redundancy_list)
        return a, b, spare, results, threads

    def state(self):
        raw = self.store.get(f"torch.rendezvous.{RUN_ID}")
        return pickle.loads(b64decode(raw))

    def tell(self, pod, losses):
        """The sidecar of `pod` writes its loss file."""
        doc = {"losses": [{"id": i, "rank": r, "confirmed_unix_ms": int(t.timestamp() * 1000)} for i, r, t in losses]}
        path = os.path.join(self.dirs[pod], tw.LOSS_FILE)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)


def now():
    return datetime.now(timezone.utc)


def read_node(directory):
    with open(os.path.join(directory, tw.NODE_FILE)) as f:
        return json.load(f)


def finish(results, threads, timeout=60):
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError("a rendezvous did not finish")
    for h, r in results.items():
        if isinstance(r, Exception):
            raise r
    return results


class Eviction(unittest.TestCase):
    def test_a_lost_participant_is_evicted_the_agent_restarts_once_and_the_spare_joins_on_its_own(self):
        w = World(self, 2, 2)
        a, b, spare, spare_results, spare_threads = w.formed_with_a_spare()
        self.assertTrue(a._tw_fast and b._tw_fast and spare._tw_fast)
        self.assertEqual(a.num_nodes_waiting(), 0)

        # Pod 1 is cut: its agent beats no more; its loss is confirmed after.
        b._stop_heartbeats()
        w.tell(0, [("1-1", 1, now())])
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)
        state = w.state()
        self.assertNotIn(b._this_node, state.participants)
        self.assertNotIn(b._this_node, state.last_heartbeats)
        self.assertIn(a._this_node, state.participants)
        # The spare is left where it was: it moves itself (and so resets its
        # join deadline) when it sees the free place.
        self.assertIn(spare._this_node, state.redundancy_list)
        self.assertNotIn(spare._this_node, state.wait_list)
        # Once, until the agent's next rendezvous.
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)
        wait_for("the spare in the wait list", lambda: spare._this_node in w.state().wait_list)

        finish(*w.join(a))
        finish(spare_results, spare_threads)
        state = w.state()
        self.assertEqual(set(state.participants), {a._this_node, spare._this_node})
        self.assertTrue(state.complete)
        self.assertEqual(a.num_nodes_waiting(), 0, "the loss is consumed at next_rendezvous")
        # The same loss file seen again: nothing more.
        w.tell(0, [("1-1", 1, now())])
        self.assertEqual(a.num_nodes_waiting(), 0)

    def test_each_agent_writes_what_its_rendezvous_gave_it_to_node_json(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        before = read_node(w.dirs[0])
        self.assertIsNone(before["group_rank"], "no round completed yet")
        self.assertTrue(before["fast"])
        results = finish(*w.join(a, b))
        state = w.state()
        ranks = set()
        for pod, h in ((0, a), (1, b)):
            doc = read_node(w.dirs[pod])
            self.assertEqual(doc["group_rank"], results[h].rank)
            self.assertEqual(doc["world_size"], 2)
            self.assertEqual(doc["round"], state.round)
            # The store the workers meet at (their MASTER_PORT): the
            # sidecar leaves its connections out of their collective.
            self.assertEqual(doc["workers_store_port"], results[h].bootstrap_store_info.master_port)
            self.assertIsInstance(doc["workers_store_port"], int)
            # The fence a reader checks: this agent's pid and start time.
            self.assertEqual(doc["pid"], os.getpid())
            self.assertEqual(doc["pid_start_ticks"], tw.start_ticks(os.getpid()))
            self.assertIsInstance(doc["pid_start_ticks"], int)
            self.assertEqual(os.stat(os.path.join(w.dirs[pod], tw.NODE_FILE)).st_mode & 0o777, 0o644)
            ranks.add(doc["group_rank"])
        self.assertEqual(ranks, {0, 1})
        self.assertEqual([f for f in os.listdir(w.dirs[0]) if f.endswith(".tmp")], [])

    def test_a_node_that_beat_after_the_confirmation_is_not_evicted(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        # A stale loss: confirmed before pod 1's agent last beat.
        w.tell(0, [("1-1", 1, now() - timedelta(seconds=30))])
        self.assertEqual(a.num_nodes_waiting(), 0)
        self.assertIn(b._this_node, w.state().participants)

    def test_a_replacement_in_the_lost_pods_place_is_not_evicted(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        b._stop_heartbeats()
        confirmed = now()
        # The replacement (a new agent of pod 1) joins as a spare before
        # this agent hears the loss; both are published under pod 1.
        time.sleep(0.01)
        replacement = w.handler(1)
        r_results, r_threads = w.join(replacement)
        wait_for("the replacement in the redundancy list", lambda: replacement._this_node in w.state().redundancy_list)
        w.tell(0, [("1-1", 1, confirmed)])
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)
        state = w.state()
        self.assertNotIn(b._this_node, state.last_heartbeats)
        self.assertIn(replacement._this_node, state.last_heartbeats)
        finish(*w.join(a))
        finish(r_results, r_threads)
        self.assertEqual(set(w.state().participants), {a._this_node, replacement._this_node})

    def test_a_second_loss_during_the_first_is_evicted_too_and_restarts_once(self):
        w = World(self, 1, 3)
        a, b, c = w.handler(0), w.handler(1), w.handler(2)
        finish(*w.join(a, b, c))
        b._stop_heartbeats()
        w.tell(0, [("1-1", 1, now())])
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)
        c._stop_heartbeats()
        w.tell(0, [("1-1", 1, now()), ("2-1", 2, now())])
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)
        state = w.state()
        self.assertEqual(set(state.participants), {a._this_node})
        self.assertEqual(set(state.last_heartbeats), {a._this_node})
        finish(*w.join(a))
        self.assertEqual(set(w.state().participants), {a._this_node})
        self.assertEqual(a.num_nodes_waiting(), 0)

    def test_a_peer_that_evicted_first_still_makes_this_agent_restart(self):
        w = World(self, 1, 3)
        a, b, c = w.handler(0), w.handler(1), w.handler(2)
        finish(*w.join(a, b, c))
        c._stop_heartbeats()
        w.tell(1, [("2-1", 2, now())])
        self.assertGreaterEqual(b.num_nodes_waiting(), 1)
        w.tell(0, [("2-1", 2, now())])
        self.assertGreaterEqual(a.num_nodes_waiting(), 1)

    def test_a_loss_of_a_node_not_in_this_round_evicts_without_a_restart(self):
        w = World(self, 2, 2)
        a, _, spare, _, _ = w.formed_with_a_spare()
        spare._stop_heartbeats()
        # the spare's thread keeps polling in its join; silence its beats by
        # naming a confirmation after its last beat
        w.tell(0, [("2-1", 2, now() + timedelta(seconds=5))])
        self.assertEqual(a.num_nodes_waiting(), 0)


class Fallback(unittest.TestCase):
    def test_a_missing_private_field_leaves_plain_c10d(self):
        saved = dr._remove_participant_epilogue
        del dr._remove_participant_epilogue
        try:
            w = World(self, 2, 2)
            a, b = w.handler(0), w.handler(1)
        finally:
            dr._remove_participant_epilogue = saved
        self.assertFalse(a._tw_fast)
        self.assertEqual(a.get_backend(), tw.BACKEND)
        finish(*w.join(a, b))
        w.tell(0, [("1-1", 1, now())])
        self.assertEqual(a.num_nodes_waiting(), 0)
        with open(os.path.join(w.dirs[0], tw.NODE_FILE)) as f:
            node = json.load(f)
        self.assertFalse(node["fast"])
        self.assertIn("_remove_participant_epilogue", node["why_not"])

    def test_without_a_pod_index_it_is_plain_c10d(self):
        w = World(self, 1, 1)
        params = RendezvousParameters(
            backend=tw.BACKEND, endpoint=f"127.0.0.1:{w.store.port}", run_id="x", min_nodes=1, max_nodes=1, is_host="false"
        )
        saved = {k: os.environ.pop(k, None) for k in ("NODE_RANK", "PET_NODE_RANK")}
        os.environ[tw.DIR_ENV] = w.tmp.name
        try:
            h = tw.create_handler(params)
        finally:
            os.environ.pop(tw.DIR_ENV, None)
            for k, v in saved.items():
                if v is not None:
                    os.environ[k] = v
        self.assertFalse(h._tw_fast)
        info = h.next_rendezvous()
        self.assertEqual(info.world_size, 1)
        h._stop_heartbeats()

    def test_malformed_loss_files_are_ignored(self):
        self.assertEqual(tw.parse_losses("not json"), [])
        self.assertEqual(tw.parse_losses('{"losses": [{"id": 1}, {"id": "x", "rank": true, "confirmed_unix_ms": 5}, 3]}'), [])
        [loss] = tw.parse_losses('{"losses": [{"id": "2-3", "rank": 2, "confirmed_unix_ms": 1764860000000}]}')
        self.assertEqual((loss.id, loss.rank), ("2-3", 2))


TRAIN = r"""
import os, sys
print("worker", os.environ["LOCAL_RANK"], "ppid", os.getppid(), flush=True)
"""


BESIDE = r"""
import sys, torch
import beside
print("beside", beside.VALUE, sys.path[0], type(sys.stdout.buffer).__name__, torch.get_num_threads())
"""


def torchrun(env_extra, script_dir, prelude="", train=TRAIN, console=False):
    """A real torchrun (one node, its own store) with this package on
    PYTHONPATH, running ``train`` (a script's text); ``console``: torch's
    ``torchrun`` script, as a trainer runs it (else ``python -c``, which
    trainwire's sitecustomize does not take for torchrun's agent)."""
    script = os.path.join(script_dir, "train.py")
    with open(script, "w") as f:
        f.write(train)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    env = dict(os.environ)
    env.update(
        {
            "PYTHONPATH": PACKAGE_DIR + os.pathsep + env.get("PYTHONPATH", ""),
            "PET_NNODES": "1",
            "PET_NPROC_PER_NODE": "2",
            "PET_RDZV_BACKEND": tw.BACKEND,
            "PET_RDZV_ENDPOINT": f"127.0.0.1:{store.port}",
            "PET_RDZV_ID": "fallback",
            "PET_RDZV_CONF": "is_host=false,keep_alive_interval=1,keep_alive_max_attempt=3",
            "NODE_RANK": "0",
            tw.DIR_ENV: script_dir,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
    )
    env.update(env_extra)
    code = prelude + "from torch.distributed.run import main; main()"
    if console:
        assert not prelude
        command = [os.path.join(os.path.dirname(sys.executable), "torchrun"), script]
    else:
        command = [sys.executable, "-c", code, script]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    del store
    return out


def log_an_exception(install: bool) -> subprocess.CompletedProcess:
    """A fresh interpreter with torchrun's logging, that logs an exception
    on the agent's logger as torch does when a worker failed (with or
    without ``ExceptionText``); it prints whether ``torch._dynamo`` got
    loaded."""
    code = (
        "import sys, logging\n"
        "import torch.distributed.run\n"
        f"sys.path.insert(0, {PACKAGE_DIR!r})\n"
        "import trainwire_rendezvous as tw\n"
        f"print('filters', tw._install_exception_text() if {install!r} else 0)\n"
        "log = logging.getLogger('torch.distributed.elastic.multiprocessing.api')\n"
        "try:\n"
        "    raise RuntimeError('the worker failed: boom')\n"
        "except RuntimeError:\n"
        "    log.exception('failed (exitcode: %s)', 1)\n"
        "print('dynamo', 'torch._dynamo' in sys.modules)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


class ExceptionLogs(unittest.TestCase):
    def test_an_agents_exception_log_keeps_its_traceback_without_loading_torch_dynamo(self):
        out = log_an_exception(install=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("dynamo False", out.stdout)
        self.assertNotIn("filters 0", out.stdout)
        # The same lines as torch's formatter writes: its prefix, the
        # message, the traceback.
        self.assertIn("failed (exitcode: 1)", out.stderr)
        self.assertIn("Traceback (most recent call last):", out.stderr)
        self.assertIn("RuntimeError: the worker failed: boom", out.stderr)
        lines = [l for l in out.stderr.splitlines() if "boom" in l]
        self.assertTrue(lines and all(l.startswith("E") for l in lines), lines)

    def test_without_it_torchs_formatter_loads_torch_dynamo(self):
        # What ExceptionText is for: torch's formatter imports torch._dynamo
        # at the first record with an exception.
        out = log_an_exception(install=False)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("dynamo True", out.stdout)
        self.assertIn("RuntimeError: the worker failed: boom", out.stderr)


class Torchrun(unittest.TestCase):
    def test_torchrun_selects_the_handler_by_name(self):
        with tempfile.TemporaryDirectory() as d:
            out = torchrun({}, d)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("restarts the workers at once", out.stderr)
            self.assertEqual(out.stdout.count("worker"), 2, out.stdout)

    def test_torchrun_starts_with_a_missing_private_field(self):
        with tempfile.TemporaryDirectory() as d:
            prelude = (
                "import torch.distributed.elastic.rendezvous.dynamic_rendezvous as d\n"
                "del d._remove_participant_epilogue\n"
            )
            out = torchrun({}, d, prelude)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("plain c10d rendezvous", out.stderr)
            self.assertIn("_remove_participant_epilogue", out.stderr)
            self.assertEqual(out.stdout.count("worker"), 2, out.stdout)
            # The fallback writes its round too (torch's rank of the workers).
            doc = read_node(d)
            self.assertFalse(doc["fast"])
            self.assertIn("_remove_participant_epilogue", doc["why_not"])
            self.assertEqual((doc["group_rank"], doc["world_size"]), (0, 1))

    def test_forkserver_workers_are_children_of_a_forkserver_with_torch_loaded(self):
        with tempfile.TemporaryDirectory() as d:
            out = torchrun({"PET_START_METHOD": "forkserver", "PET_RUN_PATH": "1"}, d)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn("workers start warm", out.stderr)
            ppids = {line.split()[-1] for line in out.stdout.splitlines() if line.startswith("worker")}
            self.assertEqual(len(ppids), 1, out.stdout)
            doc = read_node(d)
            self.assertEqual((doc["group_rank"], doc["world_size"]), (0, 1))
            self.assertIn("torch._dynamo", trainwire_workers.FORKSERVER_PRELOAD)

    def _run_beside(self, console):
        """A warm worker runs its script as ``python -u script.py`` would."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "beside.py"), "w") as f:
                f.write("VALUE = 42\n")
            out = torchrun(
                {"PET_START_METHOD": "forkserver", "PET_RUN_PATH": "1"}, d, train=BESIDE, console=console
            )
            self.assertEqual(out.returncode, 0, out.stderr)
            lines = [l.split() for l in out.stdout.splitlines() if l.startswith("beside")]
            self.assertEqual(len(lines), 2, out.stdout + out.stderr)
            for line in lines:
                # beside VALUE sys.path[0] stdout's buffer torch's threads
                self.assertEqual(line[1:], ["42", os.path.realpath(d), "FileIO", "1"], out.stdout)
            return out

    def test_a_warm_worker_runs_its_script_as_python_u_would(self):
        out = self._run_beside(console=False)
        self.assertIn("forkserver with torch preloaded, started now", out.stderr)

    def test_torchruns_agent_starts_the_forkserver_with_itself(self):
        # torchrun's own script: sitecustomize starts the forkserver at the
        # agent's start, with OMP_NUM_THREADS=1 as torchrun sets it for 2
        # processes a node (the workers' torch threads above).
        out = self._run_beside(console=True)
        self.assertIn("forkserver with torch preloaded, started with the agent", out.stderr)


class WorkerStart(unittest.TestCase):
    """trainwire_workers' reading of torchrun's arguments (no torch)."""

    def test_the_start_method_and_run_path_from_flags_or_env(self):
        w = trainwire_workers
        env = {"PET_START_METHOD": "forkserver", "PET_RUN_PATH": "1"}
        self.assertEqual(w.start_method(["x.py"], env), ("forkserver", True))
        self.assertEqual(w.start_method(["--start-method", "spawn", "x.py"], env), ("spawn", True))
        self.assertEqual(w.start_method(["--start_method=fork", "--run_path", "x.py"], {}), ("fork", True))
        self.assertEqual(w.start_method(["x.py"], {}), ("spawn", False))
        self.assertIsNone(w.warm(["x.py"], env))
        self.assertIn("no --run-path", w.warm(["x.py"], {"PET_START_METHOD": "forkserver"}))

    def test_omp_threads_as_torchrun_sets_them(self):
        w = trainwire_workers
        self.assertEqual(w.omp_threads(["x.py"], {"PET_NPROC_PER_NODE": "2"}), "1")
        self.assertIsNone(w.omp_threads(["x.py"], {"PET_NPROC_PER_NODE": "1"}))
        self.assertIsNone(w.omp_threads(["x.py"], {}))
        self.assertEqual(w.omp_threads(["--nproc-per-node=4", "x.py"], {}), "1")
        self.assertEqual(w.omp_threads(["--nproc_per_node", "8", "x.py"], {"OMP_NUM_THREADS": "3"}), "3")
        # Told only once torchrun looked at the machine: not before.
        self.assertIs(w.omp_threads(["--nproc-per-node", "gpu", "x.py"], {}), False)
        self.assertIs(w.omp_threads(["x.py"], {"PET_NPROC_PER_NODE": "auto"}), False)

    def test_only_torchruns_agent_starts_a_forkserver_at_its_start(self):
        # A Python process that is not torchrun's agent (here: this test's
        # interpreter, argv of unittest) starts nothing.
        env = {"PET_RDZV_BACKEND": tw.BACKEND, "PET_START_METHOD": "forkserver", "PET_RUN_PATH": "1"}
        code = (
            f"import sys; sys.path.insert(0, {PACKAGE_DIR!r}); import trainwire_workers as w\n"
            "print('started', w.start_early())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True, timeout=60
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("started False", out.stdout)


class Stacks(unittest.TestCase):
    """The agent's stop asks a stopped worker for its Python stack."""

    def _child(self):
        env = dict(os.environ, PYTHONPATH=PACKAGE_DIR, TRAINWIRE_STACKS_SIGNAL="SIGPWR")
        code = (
            "import sys, time\n"
            "def waiting_in_a_data_loader():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "waiting_in_a_data_loader()\n"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.assertEqual(child.stdout.readline().strip(), "ready")
        return child

    def _stop(self, child):
        import signal

        os.kill(child.pid, signal.SIGSTOP)
        for _ in range(200):
            if tw.process_state(child.pid) in ("T", "t"):
                return
            time.sleep(0.01)
        self.fail("the child did not stop")

    def test_a_stopped_worker_writes_its_stack_and_a_running_one_is_left_alone(self):
        os.environ["TRAINWIRE_STACKS_SIGNAL"] = "SIGPWR"
        stopped, running = self._child(), self._child()
        try:
            self._stop(stopped)
            asked = tw.ask_stopped_for_stacks([stopped.pid, running.pid, 2**22 + 7])
            self.assertEqual(asked, [stopped.pid])
            # Resumed: it runs (or sleeps) again.
            self.assertIn(tw.process_state(stopped.pid), ("R", "S"))
        finally:
            for c in (stopped, running):
                c.kill()
        _, err = stopped.communicate(timeout=10)
        self.assertIn("waiting_in_a_data_loader", err)
        _, err = running.communicate(timeout=10)
        self.assertNotIn("waiting_in_a_data_loader", err)

    def test_without_the_signal_named_nothing_is_sent(self):
        os.environ["TRAINWIRE_STACKS_SIGNAL"] = ""
        child = self._child()
        try:
            self._stop(child)
            self.assertEqual(tw.ask_stopped_for_stacks([child.pid]), [])
            self.assertIn(tw.process_state(child.pid), ("T", "t"))
        finally:
            child.kill()
            child.communicate(timeout=10)


class AgentHooks(unittest.TestCase):
    """What the handler changes in torchrun's agent."""

    def test_a_failed_agent_leaves_the_rendezvous_open_a_finished_one_closes_it(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        tw._agent_outcome["failed"] = True
        try:
            self.assertTrue(a.shutdown())
            self.assertFalse(w.state().closed)
            # The other agent goes on: it is not told the world is closed.
            self.assertFalse(b.is_closed())
        finally:
            tw._agent_outcome["failed"] = False
        self.assertTrue(b.shutdown())
        self.assertTrue(w.state().closed)

    def test_an_agent_stopped_by_a_signal_leaves_its_round_and_the_rendezvous_stays_open(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        self.assertTrue(tw.leave_round(b))
        state = w.state()
        self.assertNotIn(b._this_node, state.participants)
        self.assertIn(a._this_node, state.participants)
        self.assertFalse(state.closed)
        self.assertFalse(tw.leave_round(object()))

    def test_a_restart_after_a_node_left_is_given_back_any_other_is_counted(self):
        from types import SimpleNamespace

        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        saved = {k: LocalElasticAgent.__dict__.get(k) for k in ("_restart_workers", "_stop_workers", "run", "_tw_hooked")}
        try:
            LocalElasticAgent._restart_workers = lambda self, wg: None
            LocalElasticAgent._tw_hooked = False
            self.assertIsNone(tw._install_agent_hooks(warm=False))

            def restart(state, left):
                agent = SimpleNamespace(_remaining_restarts=1)
                handler = SimpleNamespace(_tw_left=left)
                wg = SimpleNamespace(state=state, spec=SimpleNamespace(max_restarts=3, rdzv_handler=handler))
                LocalElasticAgent._restart_workers(agent, wg)
                return agent._remaining_restarts

            self.assertEqual(restart(WorkerState.FAILED, {"node-of-the-lost-pod"}), 2)
            self.assertEqual(restart(WorkerState.FAILED, set()), 1)
            self.assertEqual(restart(WorkerState.HEALTHY, {"node-of-the-lost-pod"}), 1)
        finally:
            for k, v in saved.items():
                if v is None:
                    if k in LocalElasticAgent.__dict__:
                        delattr(LocalElasticAgent, k)
                else:
                    setattr(LocalElasticAgent, k, v)

    def test_the_round_after_a_loss_names_the_node_that_left(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        self.assertEqual(a._tw_left, set())
        lost = b._this_node
        b._stop_heartbeats()
        c = w.handler(1)
        w.tell(0, [("1-1", 1, now())])
        wait_for("the agent to hear the loss", lambda: a.num_nodes_waiting() > 0)
        finish(*w.join(a, c))
        self.assertEqual(a._tw_left, {lost})


class FullRound(unittest.TestCase):
    """A node left in the wait list of a full round waits as a spare."""

    def _wait_list(self, w, node):
        raw = w.store.get(f"torch.rendezvous.{RUN_ID}")
        state = pickle.loads(b64decode(raw))
        state.wait_list.add(node)
        state.last_heartbeats[node] = now()
        from base64 import b64encode

        w.store.set(f"torch.rendezvous.{RUN_ID}", b64encode(pickle.dumps(state)))

    def test_a_node_waiting_for_a_full_round_is_parked_and_nobody_restarts(self):
        w = World(self, 2, 2)
        a, b = w.handler(0), w.handler(1)
        finish(*w.join(a, b))
        late = dr._NodeDesc("pod-2-restarted", 4242, 0)
        self._wait_list(w, late)
        a._state_holder._last_sync_time = -1
        self.assertEqual(a.num_nodes_waiting(), 0)
        state = w.state()
        self.assertNotIn(late, state.wait_list)
        self.assertIn(late, state.redundancy_list)
        self.assertEqual(len(state.participants), 2)

    def test_a_node_waiting_for_a_round_with_a_free_place_still_restarts_the_workers(self):
        w = World(self, 1, 2)
        a = w.handler(0)
        finish(*w.join(a))
        late = dr._NodeDesc("pod-1", 4243, 0)
        self._wait_list(w, late)
        a._state_holder._last_sync_time = -1
        self.assertEqual(a.num_nodes_waiting(), 1)
        self.assertIn(late, w.state().wait_list)


class Poll(unittest.TestCase):
    """A join reads the state every poll_seconds, not every second."""

    def test_the_poll_grows_with_the_world_up_to_torchs_second(self):
        self.assertEqual(tw.poll_seconds(2), 0.1)
        self.assertEqual(tw.poll_seconds(16), 0.1)
        self.assertAlmostEqual(tw.poll_seconds(80), 0.5)
        self.assertEqual(tw.poll_seconds(160), 1.0)
        self.assertEqual(tw.poll_seconds(1024), 1.0)
        self.assertEqual(tw.poll_seconds(0), 0.1)

    def test_a_fast_handler_polls_its_join_at_its_worlds_pace(self):
        w = World(self, 2, 2)
        a = w.handler(0)
        self.assertEqual(a._state_holder._cache_duration, 0.1)
        start = time.monotonic()
        dr._delay(seconds=1)
        self.assertLess(time.monotonic() - start, 0.5)
        # A backoff (a range) is torch's own.
        start = time.monotonic()
        dr._delay(seconds=(0, 0.01))
        self.assertLess(time.monotonic() - start, 0.5)

    def test_an_agent_in_its_join_evicts_the_node_the_sidecar_lost(self):
        # The survivor's workers failed before the sidecar's word: its agent
        # is in its join, where torch never asks num_nodes_waiting().
        w = World(self, 2, 2)
        a, b, spare, results, threads = w.formed_with_a_spare()
        b._stop_heartbeats()
        res_a, th_a = w.join(a)
        wait_for("the survivor in its join", lambda: a._this_node in w.state().wait_list)
        lost = b._this_node
        w.tell(0, [("1-1", 1, now())])
        start = time.monotonic()
        finish(res_a, th_a)
        finish(results, threads)
        self.assertLess(time.monotonic() - start, 2.0)
        state = w.state()
        self.assertNotIn(lost, state.participants)
        self.assertEqual(set(state.participants), {a._this_node, spare._this_node})
        # No waiting node reported for the loss it acted on in its join.
        self.assertEqual(a.num_nodes_waiting(), 0)

    def test_a_spare_takes_a_free_place_within_a_fraction_of_a_second(self):
        w = World(self, 2, 2)
        a, b, spare, results, threads = w.formed_with_a_spare()
        b._stop_heartbeats()
        w.tell(0, [("1-1", 1, now())])
        wait_for("the agent to hear the loss", lambda: a.num_nodes_waiting() > 0)
        start = time.monotonic()
        res_a, th_a = w.join(a)
        finish(res_a, th_a)
        finish(results, threads)
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertEqual(set(w.state().participants), {a._this_node, spare._this_node})


if __name__ == "__main__":
    unittest.main()
