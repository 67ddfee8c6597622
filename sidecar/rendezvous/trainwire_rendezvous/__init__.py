"""torchrun's c10d rendezvous, told of a lost node by the pod's trainwire sidecar.

Registered for torchrun through the ``torchrun.handlers`` entry point as
``trainwire-c10d`` (selected with ``PET_RDZV_BACKEND=trainwire-c10d``); the
trainwire sidecar installs this directory and the injection puts it on the
trainer's ``PYTHONPATH``. It is torch's own ``DynamicRendezvousHandler`` over
the c10d backend, configured exactly as ``c10d`` is, plus six things:

* Each agent appends its node descriptor (``addr``, ``pid``, ``local_id``) to
  the store key ``trainwire.nodes.<run_id>.<pod index>``, so a peer can name
  every agent that ran in a given pod.
* At each ``num_nodes_waiting()`` (torchrun's agent asks every
  ``monitor_interval``, 0.1 s), one ``stat`` of the loss file the sidecar
  writes (see ``LOSS_FILE``). A new loss names a pod index and the wall time
  the sidecar confirmed it. The handler evicts from the rendezvous state
  every agent published for that pod whose last keep-alive is older than the
  confirmation, the way torch's ``_sanitize`` drops a node whose keep-alive
  expired (compare-and-set on ``torch.rendezvous.<run_id>``). An agent that
  beat after the confirmation (a replacement, a node that came back, a
  restarted container) is never evicted. If the lost node was a participant
  of this agent's round, ``num_nodes_waiting()`` answers at least 1 until
  the next ``next_rendezvous()``, so the agent restarts its workers now.
  A spare is never moved by the handler: it leaves the redundancy list on
  its own (which resets its join deadline) once a participant is gone.
* Warm workers: with ``--start-method forkserver`` and ``--run-path``
  (``PET_START_METHOD``, ``PET_RUN_PATH``), the forkserver is started at
  once with torch preloaded, and old workers still alive 0.5 s into a stop
  are killed (torch waits 30 s).
* A join polls the state every ``poll_seconds`` (0.1 s up to 16 nodes, torch's
  1 s from 160 on) instead of every second from a 1 s cache: a spare sees a
  free place, and a participant its round complete, within a tenth of a
  second in a small world. At each poll the handler hears the sidecar's
  losses too: an agent whose workers failed before the sidecar's word
  evicts the dead node from inside its join.
* A node left in the wait list of a complete, full round is moved to the
  redundancy list (``park_waiting``): torch would restart every
  participant's workers for it, again and again.
* torchrun's agent, wrapped (``_install_agent_hooks``): a restart after
  workers failed because a node left the world is not counted against
  ``--max-restarts``; an agent whose run failed leaves the rendezvous open
  (torch would close it for every node, for good); at the stop of a round,
  a stopped worker is asked for its Python stacks first; an exception it
  logs is formatted as text before torch's formatter sees it
  (``ExceptionText``), which would import ``torch._dynamo`` (seconds,
  docs/benchmarks.md) between a worker's failure and the restart.

Whatever goes wrong here (a torch without a private field this relies on, a
store without ``append``), the handler is plain c10d with a warning that
says why: never a failed start.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import time
import weakref
from datetime import datetime, timezone

BACKEND = "trainwire-c10d"

#: The directory shared with the sidecar (an emptyDir).
DIR_ENV = "TRAINWIRE_RENDEZVOUS_DIR"
DEFAULT_DIR = "/run/trainwire/rendezvous"

#: The sidecar's loss file in that directory, replaced atomically (rename):
#: ``{"losses": [{"id": "<rank>-<generation>", "rank": 3,
#: "confirmed_unix_ms": 1764860000000}, ...]}``, the most recent losses only.
LOSS_FILE = "losses.json"

#: This agent's node descriptor and what it got from its last completed
#: rendezvous, for the sidecar (torch's node rank of workers whose
#: environment does not tell it: forkserver children, another user's) and
#: for people: ``{"addr": ..., "pid": ..., "pid_start_ticks": ...,
#: "local_id": ..., "run_id": ..., "fast": bool, "why_not": str|null,
#: "round": int|null, "group_rank": int|null, "world_size": int|null}``.
#: ``pid`` is the agent's and ``pid_start_ticks`` its start time
#: (``/proc/<pid>/stat`` field 22), so a reader can tell a file left by a
#: dead or replaced agent. Replaced atomically (rename), mode 0644: the
#: sidecar may run as another user.
NODE_FILE = "node.json"

#: Most bytes read from the loss file.
MAX_LOSS_BYTES = 64 * 1024

#: Most agents remembered per pod index (each agent start appends one).
MAX_NODES_PER_POD = 64

#: Old workers still alive this long into a stop are killed.
STOP_GRACE_SECONDS = 0.5

#: How long the agent waits after asking a stopped worker for its Python
#: stack, before it stops the round's workers (``STACKS_WAIT`` of the
#: sidecar's stall action: the dump takes milliseconds once the worker runs).
STACKS_WAIT_SECONDS = 0.5

#: Compare-and-set attempts of one eviction.
MAX_CAS_ATTEMPTS = 8

#: How often an agent of the smallest worlds reads the rendezvous state
#: while it waits in a join (torch: once a second, and its state cache 1 s).
FAST_POLL_SECONDS = 0.1

#: The most state reads a second the whole world makes while it waits in a
#: join: the poll grows with the world so that this holds, up to torch's
#: own second.
MAX_WORLD_POLLS_PER_SECOND = 160

logger = logging.getLogger("trainwire_rendezvous")
if not logger.handlers:
    _h = logging.StreamHandler(sys.stderr)
    _h.setFormatter(logging.Formatter("[trainwire-rendezvous] %(levelname)s %(message)s"))
    logger.addHandler(_h)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _create(params):
    return create_handler(params)


def creator():
    """The entry point's object: torchrun calls it for the creator.

    Defined before torch is imported: importing torch's rendezvous package
    loads the entry points, this module's among them, while this module may
    itself be importing it."""
    return _create


def nodes_key(run_id: str, pod_index: int) -> str:
    """The store key listing the agents that ran in pod ``pod_index``."""
    return f"trainwire.nodes.{run_id}.{pod_index}"


def pod_index() -> int | None:
    """This pod's index (the injected ``NODE_RANK``), if it is one."""
    for name in ("NODE_RANK", "PET_NODE_RANK"):
        v = os.environ.get(name, "")
        if v.isdigit():
            return int(v)
    return None


def rendezvous_dir() -> str:
    return os.environ.get(DIR_ENV) or DEFAULT_DIR


class Loss:
    """One loss the sidecar confirmed."""

    __slots__ = ("id", "rank", "confirmed")

    def __init__(self, id: str, rank: int, confirmed: datetime) -> None:
        self.id = id
        self.rank = rank
        self.confirmed = confirmed

    def __repr__(self) -> str:
        return f"Loss({self.id}, pod {self.rank}, confirmed {self.confirmed.isoformat()})"


def parse_losses(text: str) -> list[Loss]:
    """The losses of a loss file; a malformed entry is skipped."""
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    out = []
    items = doc.get("losses") if isinstance(doc, dict) else None
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        id_, rank, ms = item.get("id"), item.get("rank"), item.get("confirmed_unix_ms")
        if (
            not isinstance(id_, str)
            or not isinstance(rank, int)
            or isinstance(rank, bool)
            or not isinstance(ms, int)
            or rank < 0
            or ms <= 0
        ):
            continue
        try:
            when = datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            continue
        out.append(Loss(id_[:64], rank, when))
    return out


class LossFile:
    """The sidecar's loss file, read again only when it changed."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._seen_stat: tuple | None = None
        self._done: set[str] = set()

    def _stat(self):
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> list[Loss]:
        try:
            with open(self._path, "rb") as f:
                data = f.read(MAX_LOSS_BYTES)
        except OSError:
            return []
        return parse_losses(data.decode("utf-8", "replace"))

    def skip_existing(self) -> None:
        """Losses already in the file are old news to a new agent."""
        self._seen_stat = self._stat()
        for loss in self._read():
            self._done.add(loss.id)

    def new_losses(self) -> list[Loss]:
        st = self._stat()
        if st is None or st == self._seen_stat:
            return []
        self._seen_stat = st
        fresh = [l for l in self._read() if l.id not in self._done]
        for loss in fresh:
            self._done.add(loss.id)
        if len(self._done) > 1024:
            self._done = {l.id for l in fresh}
        return fresh


def _write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        os.fchmod(f.fileno(), mode)
        f.write(text)
    os.replace(tmp, path)


def start_ticks(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/<pid>/stat``
    field 22; the command name, field 2, may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096).decode("ascii", "replace")
        return int(stat[stat.rindex(")") + 1 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class NodeFile:
    """This agent's ``node.json`` (see ``NODE_FILE``): written at the
    handler's set-up and again after each completed rendezvous."""

    def __init__(self, directory: str) -> None:
        self._path = os.path.join(directory, NODE_FILE)
        self._pid = os.getpid()
        self.doc = {
            "addr": None,
            "pid": self._pid,
            "pid_start_ticks": start_ticks(self._pid),
            "local_id": None,
            "run_id": None,
            "fast": False,
            "why_not": None,
            "round": None,
            "group_rank": None,
            "world_size": None,
            "workers_store_port": None,
        }

    def write(self, **fields) -> None:
        self.doc.update(fields)
        try:
            _write_atomic(self._path, json.dumps(self.doc))
        except OSError as e:
            logger.debug("writing %s: %s", self._path, e)

    def round_done(self, info, round_: int | None) -> None:
        """What the agent got from a completed rendezvous (torch's
        ``RendezvousInfo``: this node's group rank, the nodes in the round,
        the port of the store its workers meet at, which the sidecar must
        not take for their collective)."""
        rank = getattr(info, "rank", None)
        size = getattr(info, "world_size", None)
        port = getattr(getattr(info, "bootstrap_store_info", None), "master_port", None)
        self.write(
            round=round_ if isinstance(round_, int) else None,
            group_rank=rank if isinstance(rank, int) else None,
            world_size=size if isinstance(size, int) else None,
            workers_store_port=port if isinstance(port, int) and 0 < port < 65536 else None,
        )


# ---------------------------------------------------------------------------
# torch's side. Everything private is looked up here, once; a miss makes the
# handler plain c10d with a warning naming it.

_why_not: str | None = None
try:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as _dr
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
        DynamicRendezvousHandler,
        create_handler as _create_dynamic_handler,
    )
except Exception as e:  # noqa: BLE001 - any failure means plain c10d
    _why_not = f"torch's dynamic rendezvous could not be imported ({type(e).__name__}: {e})"
    _dr = None  # type: ignore[assignment]
    DynamicRendezvousHandler = None  # type: ignore[assignment,misc]

#: What a state must have for the eviction (torch's _RendezvousState fields).
STATE_FIELDS = ("round", "complete", "participants", "wait_list", "redundancy_list", "last_heartbeats")
#: What a handler must have (torch's DynamicRendezvousHandler fields).
HANDLER_FIELDS = ("_this_node", "_settings", "_store", "_state_holder", "_heartbeat_lock")


def _module_gaps() -> str | None:
    if _why_not is not None:
        return _why_not
    for name in ("_remove_participant_epilogue", "_RendezvousState", "_NodeDesc"):
        if not hasattr(_dr, name):
            return f"torch.distributed.elastic.rendezvous.dynamic_rendezvous has no {name}"
    return None


def _handler_gaps(h) -> str | None:
    for name in HANDLER_FIELDS:
        if not hasattr(h, name):
            return f"DynamicRendezvousHandler has no {name}"
    holder = h._state_holder
    for name in ("_backend", "sync"):
        if not hasattr(holder, name):
            return f"the rendezvous state holder has no {name}"
    backend = holder._backend
    for name in ("get_state", "set_state"):
        if not hasattr(backend, name):
            return f"the rendezvous backend has no {name}"
    for name in STATE_FIELDS:
        if not hasattr(holder.state, name):
            return f"the rendezvous state has no {name}"
    for name in ("addr", "pid", "local_id"):
        if not hasattr(h._this_node, name):
            return f"the node descriptor has no {name}"
    if not hasattr(h._store, "append") or not hasattr(h._store, "check"):
        return "the store has no append/check"
    return None


def _desc_json(node) -> str:
    return json.dumps({"addr": node.addr, "pid": node.pid, "local_id": node.local_id})


def _desc_from(obj):
    try:
        addr, pid, local_id = obj["addr"], obj["pid"], obj["local_id"]
    except (KeyError, TypeError):
        return None
    if not isinstance(addr, str) or not isinstance(pid, int) or not isinstance(local_id, int):
        return None
    return _dr._NodeDesc(addr, pid, local_id)


def evict(state, nodes, confirmed: datetime, settings) -> list:
    """Drop from ``state`` each of ``nodes`` whose last keep-alive is older
    than ``confirmed``, as torch's ``_sanitize`` drops an expired node.
    Returns the nodes dropped."""
    dropped = []
    participant_removed = False
    for node in nodes:
        beat = state.last_heartbeats.get(node)
        if beat is None or beat >= confirmed:
            continue
        del state.last_heartbeats[node]
        if state.participants.pop(node, None) is not None:
            participant_removed = True
        state.wait_list.discard(node)
        state.redundancy_list.discard(node)
        dropped.append(node)
    if participant_removed:
        _dr._remove_participant_epilogue(state, settings)
    return dropped


def poll_seconds(max_nodes: int) -> float:
    """How often an agent reads the rendezvous state while it waits in a join
    (a round re-forming after a loss, a spare waiting for a place): 0.1 s up
    to 16 nodes, then ``max_nodes / 160`` s, torch's 1 s from 160 nodes on,
    so that the world's reads stay at most ``MAX_WORLD_POLLS_PER_SECOND``.

    torch sleeps 1 s between two reads and serves its state from a 1 s
    cache: a spare sees that a place freed up to 2 s late, and a participant
    that the round completed up to 2 s late; after a loss both are on the
    way to the first step."""
    n = max(1, int(max_nodes))
    return min(1.0, max(FAST_POLL_SECONDS, n / MAX_WORLD_POLLS_PER_SECOND))


#: The poll the join's one-second sleep is replaced by (``poll_seconds``),
#: once a handler of this process is set up, and that handler: at each poll
#: of a join it hears the sidecar's losses, so that an agent whose workers
#: failed before the sidecar's word (a peer's trainer killed) evicts the
#: dead node from inside its join instead of waiting for its keep-alive to
#: expire (torch's agent asks ``num_nodes_waiting()`` only while its
#: workers run).
_poll = {"seconds": None, "handlers": weakref.WeakSet()}


def _install_poll(handler) -> None:
    """Replaces torch's one-second sleep between two reads of a join with
    ``poll_seconds`` for this world, and the agent's state cache likewise."""
    seconds = poll_seconds(getattr(handler._settings, "max_nodes", 0))
    _poll["seconds"] = seconds
    _poll["handlers"].add(handler)
    holder = getattr(handler, "_state_holder", None)
    if holder is not None and hasattr(holder, "_cache_duration"):
        holder._cache_duration = seconds
    if _dr is None or getattr(_dr._delay, "_tw_poll", False):
        return
    original = _dr._delay

    def _delay(seconds):
        # Only the join's poll sleeps exactly 1 s; backoffs are ranges.
        if seconds == 1 and _poll["seconds"] is not None:
            seconds = _poll["seconds"]
            # One handler per agent process (tests hold several): the one
            # in its join.
            for joining in list(_poll["handlers"]):
                if not (getattr(joining, "_tw_fast", False) and getattr(joining, "_tw_joining", False)):
                    continue
                try:
                    joining._tw_hear(joining=True)
                except Exception as e:  # noqa: BLE001 - the keep-alive still works
                    logger.warning("acting on the sidecar's loss in a join failed: %s: %s", type(e).__name__, e)
        return original(seconds)

    _delay._tw_poll = True  # type: ignore[attr-defined]
    _dr._delay = _delay


def park_waiting(state, settings) -> list:
    """Move the wait list of a complete round that is full (``max_nodes``
    participants) to the redundancy list, where torch puts a node that
    arrives at a full round. Returns the nodes moved.

    torch leaves a node in the wait list when the round it waited for
    completed full without it, and every participant's agent then sees a
    waiting node and restarts its workers, for nothing: the new round has
    no place for it either. When the participants restart one by one, the
    first to leave the round joins the wait list of the next, and one
    waiting node is left over again: on the real node, a world of 2 + 1
    spare whose lost trainer came back within a second restarted its
    workers every 1.2 s for good. A node in the redundancy list keeps
    alive without a join deadline and leaves it on its own (with a fresh
    deadline) when a participant is gone."""
    if not state.complete or len(state.participants) < settings.max_nodes or not state.wait_list:
        return []
    moved = list(state.wait_list)
    for node in moved:
        state.wait_list.discard(node)
        state.redundancy_list.add(node)
    return moved


if DynamicRendezvousHandler is not None:

    class TrainwireRendezvousHandler(DynamicRendezvousHandler):
        """torch's c10d rendezvous handler that hears a loss from the sidecar."""

        _tw_fast: bool = False

        def get_backend(self) -> str:
            return BACKEND

        # -- set-up ---------------------------------------------------------

        def _tw_setup(self, why_not: str | None) -> None:
            self._tw_fast = False
            self._tw_pending = False
            self._tw_round_nodes: set = set()
            self._tw_left: set = set()
            self._tw_round = -1
            self._tw_lock = threading.Lock()
            self._tw_dir = rendezvous_dir()
            self._tw_index = pod_index()
            self._tw_losses = LossFile(os.path.join(self._tw_dir, LOSS_FILE))
            self._tw_node = NodeFile(self._tw_dir)
            if why_not is None:
                why_not = _module_gaps() or _handler_gaps(self)
            if why_not is None and self._tw_index is None:
                why_not = "NODE_RANK (the pod index) is not set"
            if why_not is None:
                try:
                    self._store.append(
                        nodes_key(self._settings.run_id, self._tw_index),
                        _desc_json(self._this_node) + "\n",
                    )
                except Exception as e:  # noqa: BLE001
                    why_not = f"publishing this agent in the store failed ({type(e).__name__}: {e})"
            if why_not is None:
                self._tw_losses.skip_existing()
                self._tw_fast = True
                _install_poll(self)
                logger.info(
                    "node %s (pod %s): a loss the sidecar confirms restarts the workers at once",
                    self._this_node,
                    self._tw_index,
                )
            else:
                logger.warning("plain c10d rendezvous, the sidecar's losses are not heard: %s", why_not)
            self._tw_publish_node(why_not)

        def _tw_publish_node(self, why_not: str | None) -> None:
            node = getattr(self, "_this_node", None)
            self._tw_node.write(
                addr=getattr(node, "addr", None),
                local_id=getattr(node, "local_id", None),
                run_id=getattr(getattr(self, "_settings", None), "run_id", None),
                fast=self._tw_fast,
                why_not=why_not,
            )

        # -- torch's calls --------------------------------------------------

        def next_rendezvous(self):
            # The loss that made the agent restart is consumed here.
            self._tw_pending = False
            self._tw_joining = True
            try:
                info = super().next_rendezvous()
            finally:
                self._tw_joining = False
            round_ = None
            previous = self._tw_round_nodes
            try:
                state = self._state_holder.state
                round_ = state.round
                if self._tw_fast:
                    self._tw_round_nodes = set(state.participants)
                    self._tw_round = state.round
                    # Nodes of the round before that are not in this one:
                    # the world lost them (a restarted trainer is a new
                    # node: another agent pid).
                    self._tw_left = previous - self._tw_round_nodes
            except Exception:  # noqa: BLE001
                self._tw_round_nodes = set()
                self._tw_round = -1
                self._tw_left = set()
            self._tw_node.round_done(info, round_)
            return info

        def shutdown(self) -> bool:
            if _agent_outcome["failed"]:
                return _leave_open(self)
            return super().shutdown()

        def num_nodes_waiting(self) -> int:
            n = super().num_nodes_waiting()
            if not self._tw_fast:
                return n
            try:
                self._tw_hear()
            except Exception as e:  # noqa: BLE001 - torch's keep-alive still works
                logger.warning("acting on the sidecar's loss failed: %s: %s", type(e).__name__, e)
            if n > 0 and not self._tw_pending:
                try:
                    n = self._tw_park(n)
                except Exception as e:  # noqa: BLE001 - torch's answer stands
                    logger.warning("parking the waiting nodes of a full round failed: %s: %s", type(e).__name__, e)
            return max(n, 1) if self._tw_pending else n

        # -- the loss -------------------------------------------------------

        def _tw_hear(self, joining: bool = False) -> None:
            for loss in self._tw_losses.new_losses():
                self._tw_act(loss, joining)

        def _tw_published(self, rank: int) -> list:
            key = nodes_key(self._settings.run_id, rank)
            if not self._store.check([key]):
                return []
            lines = bytes(self._store.get(key)).decode("utf-8", "replace").splitlines()
            nodes = []
            for line in lines[-MAX_NODES_PER_POD:]:
                try:
                    desc = _desc_from(json.loads(line))
                except ValueError:
                    desc = None
                if desc is not None:
                    nodes.append(desc)
            return nodes

        def _tw_act(self, loss: Loss, joining: bool = False) -> None:
            nodes = self._tw_published(loss.rank)
            with self._heartbeat_lock:
                dropped, state = self._tw_evict(nodes, loss.confirmed)
            # Restart the workers if the lost agent was in this agent's round
            # and is gone from it now (evicted here or by a peer first), and
            # not if it beat after the confirmation (alive).
            gone = [
                n
                for n in nodes
                if n in self._tw_round_nodes
                and (state is None or n not in state.participants or state.round != self._tw_round)
            ]
            # An agent in its join re-forms already: evicting is all it needs
            # (a waiting node reported now would restart the new round).
            if gone and not joining:
                self._tw_pending = True
            logger.info(
                "%s: evicted %s; workers restart now: %s",
                loss,
                ", ".join(map(repr, dropped)) or "nothing",
                "no (re-forming already)" if joining else "yes" if gone else "no (not in this round)",
            )

        def _tw_park(self, n: int) -> int:
            """torch's count of waiting nodes, unless the round is complete
            and full: then they are parked (``park_waiting``) and none waits."""
            cached = self._state_holder.state
            if not cached.complete or len(cached.participants) < self._settings.max_nodes:
                return n
            with self._heartbeat_lock:
                moved, state = self._tw_cas(lambda st: park_waiting(st, self._settings))
            if state is not None and state.complete and len(state.participants) >= self._settings.max_nodes:
                if moved:
                    logger.info(
                        "round %d is complete and full: %s waits as a spare (torch would restart every participant's workers for it)",
                        state.round,
                        ", ".join(map(repr, moved)),
                    )
                return len(state.wait_list)
            return n

        def _tw_cas(self, change):
            """Apply ``change`` (state -> what it changed, falsy for nothing)
            to the rendezvous state by compare-and-set, retried when another
            agent wrote first. Returns (what changed, state as written or
            read)."""
            holder = self._state_holder
            backend = holder._backend
            state = None
            for _ in range(MAX_CAS_ATTEMPTS):
                got = backend.get_state()
                if got is None:
                    return [], None
                bits, token = got
                state = pickle.loads(bits)
                changed = change(state)
                if not changed:
                    return changed, state
                answer = backend.set_state(pickle.dumps(state), token)
                if answer is not None and answer[2]:
                    # The holder's cached copy is stale: read at next sync.
                    if hasattr(holder, "_last_sync_time"):
                        holder._last_sync_time = -1
                    return changed, state
            logger.warning("changing the rendezvous state: it kept changing under %d attempts", MAX_CAS_ATTEMPTS)
            return [], state

        def _tw_evict(self, nodes, confirmed):
            """Evict by compare-and-set. Returns (dropped, state as written
            or read)."""
            return self._tw_cas(lambda st: evict(st, nodes, confirmed, self._settings))

else:
    TrainwireRendezvousHandler = None  # type: ignore[assignment,misc]


def process_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``D``, ``T``...)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
    except OSError:
        return None
    _, _, after = stat.rpartition(b") ")
    return after[:1].decode("ascii", "replace") or None


def ask_stopped_for_stacks(pids) -> list[int]:
    """Of ``pids``, each worker that is stopped (state ``T`` or ``t``: a
    debugger, a SIGSTOP, a job-control stop) is sent the stacks signal that
    trainwire's ``sitecustomize`` registered (``TRAINWIRE_STACKS_SIGNAL``),
    then SIGCONT, so that it writes its Python stacks to the trainer's log
    now, before its round's stop kills it; then the agent waits
    ``STACKS_WAIT_SECONDS``. A stopped worker is the one a hung world waits
    for, and whichever pod's sidecar restarted first, this agent's stop is
    the last moment its stack can be had. Returns the pids asked."""
    name = os.environ.get("TRAINWIRE_STACKS_SIGNAL", "")
    if not name:
        return []
    import signal

    signum = getattr(signal, name, None)
    if not isinstance(signum, int):
        return []
    asked = []
    for pid in pids:
        if process_state(pid) not in ("T", "t"):
            continue
        try:
            os.kill(pid, signum)
            os.kill(pid, signal.SIGCONT)
        except OSError:
            continue
        asked.append(pid)
    if asked:
        logger.warning(
            "worker(s) %s were stopped when their round ended: asked for their Python stacks (%s) before stopping them",
            asked,
            name,
        )
        time.sleep(STACKS_WAIT_SECONDS)
    return asked


def _worker_pids(agent) -> list[int]:
    """The pids of the agent's current workers (none when it cannot tell)."""
    try:
        pcontext = getattr(agent, "_pcontext", None)
        return [int(p) for p in pcontext.pids().values()] if pcontext is not None else []
    except Exception:  # noqa: BLE001 - a changed private field: no stacks
        return []


#: How the agent's run ended, for the handler's ``shutdown``: torchrun
#: calls it after the run, and torch's handler then closes the rendezvous
#: for every node, for good.
_agent_outcome = {"failed": False}


def _leave_open(handler) -> bool:
    """The shutdown of an agent whose run failed: its keep-alive stops, the
    rendezvous stays open. torch would close it, and every other agent of
    the world would end with ``RendezvousClosedError``; with a dedicated
    store, every restarted trainer would too, for as long as the store
    lives. In a StatefulSet or an indexed Job this pod's trainer is started
    again and joins (its peers restart their workers meanwhile, as for any
    lost node); trainwire's failure policy (``crash-loop``) bounds a trainer
    that fails again and again, not one agent's ``--max-restarts``."""
    try:
        handler._stop_heartbeats()
    except Exception:  # noqa: BLE001
        pass
    logger.warning(
        "this agent's run failed: the rendezvous stays open for the world (its trainer is restarted by Kubernetes and joins again; torch would close it for every node)"
    )
    return True


#: How long an agent stopped by a signal tries to leave its round.
LEAVE_SECONDS = 2.0


def leave_round(handler) -> bool:
    """Removes this agent's node from the participants of its round (torch's
    own exit operation, the one ``next_rendezvous`` starts with), so that
    its peers re-form without it at once instead of when its keep-alive
    expires (3 s) or a sidecar confirms the loss. For an agent stopped by a
    signal (SIGTERM: the pod is deleted, evicted or preempted): torch then
    neither closes the rendezvous nor leaves it. Returns whether it left."""
    executor = getattr(handler, "_op_executor", None)
    if executor is None or _dr is None:
        return False
    try:
        executor.run(_dr._RendezvousExitOp(), time.monotonic() + LEAVE_SECONDS)
    except Exception as e:  # noqa: BLE001 - its keep-alive expires anyway
        logger.warning("leaving the round failed: %s: %s", type(e).__name__, e)
        return False
    logger.info("stopped by a signal: this node left its round, its peers re-form without it now")
    return True


def _script_entrypoint():
    """torch's ``--run-path`` entrypoint and trainwire's in its place
    (``trainwire_workers.run_script``: the script run as ``python -u``
    runs it), or None."""
    try:
        import trainwire_workers
        from torch.distributed.run import run_script_path
    except Exception:  # noqa: BLE001
        return None
    return run_script_path, trainwire_workers.run_script


def _install_agent_hooks(warm: bool) -> str | None:
    """Wraps torchrun's agent, once:

    - its start of workers: with warm workers, torch's ``--run-path``
      entrypoint is replaced by ``trainwire_workers.run_script`` (the
      script's directory on ``sys.path``, unbuffered output, as ``python -u
      script.py``);
    - its stop of its workers: first the stacks of stopped workers
      (``ask_stopped_for_stacks``), then torch's own stop; with warm
      workers, old workers still alive ``STOP_GRACE_SECONDS`` into it are
      killed (torch would wait 30 s);
    - its restart after a failure: workers that failed because a node left
      the world (the next round lacks a node of the last one) are a
      membership change, which torch does not count when it hears of it
      first ("membership changes do not count as retries"); the restart is
      given back, so that a survivor of ``--max-restarts`` losses does not
      give up;
    - its run: how it ended, for ``shutdown`` (``_leave_open``); stopped
      by a signal, it leaves its round (``leave_round``).

    Returns why not, if not."""
    try:
        from torch.distributed.elastic.agent.server.api import WorkerState
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing.api import SignalException
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    if warm and not hasattr(LocalElasticAgent, "_shutdown"):
        return "LocalElasticAgent has no _shutdown"
    if getattr(LocalElasticAgent, "_tw_hooked", False):
        return None
    stop = LocalElasticAgent._stop_workers
    restart = LocalElasticAgent._restart_workers
    run = LocalElasticAgent.run
    start = LocalElasticAgent._start_workers
    script_entrypoint = _script_entrypoint() if warm else None

    def _start_workers(self, worker_group, *args, **kwargs):
        spec = worker_group.spec
        if script_entrypoint is not None and getattr(spec, "entrypoint", None) is script_entrypoint[0]:
            spec.entrypoint = script_entrypoint[1]
        return start(self, worker_group, *args, **kwargs)

    def _stop_workers(self, worker_group, *args, **kwargs):
        ask_stopped_for_stacks(_worker_pids(self))
        if warm:
            return self._shutdown(timeout=STOP_GRACE_SECONDS)
        return stop(self, worker_group, *args, **kwargs)

    def _restart_workers(self, worker_group, *args, **kwargs):
        failed = worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        result = restart(self, worker_group, *args, **kwargs)
        left = getattr(worker_group.spec.rdzv_handler, "_tw_left", None)
        most = worker_group.spec.max_restarts
        if failed and left and self._remaining_restarts < most:
            self._remaining_restarts += 1
            logger.info(
                "the workers failed as %d node(s) left the world: not counted against --max-restarts (%d/%d left)",
                len(left),
                self._remaining_restarts,
                most,
            )
        return result

    def _run(self, *args, **kwargs):
        failed = True
        try:
            result = run(self, *args, **kwargs)
            failed = bool(result.is_failed())
            return result
        except SignalException:
            group = getattr(self, "_worker_group", None)
            leave_round(getattr(getattr(group, "spec", None), "rdzv_handler", None))
            raise
        finally:
            _agent_outcome["failed"] = failed

    LocalElasticAgent._start_workers = _start_workers  # type: ignore[method-assign]
    LocalElasticAgent._stop_workers = _stop_workers  # type: ignore[method-assign]
    LocalElasticAgent._restart_workers = _restart_workers  # type: ignore[method-assign]
    LocalElasticAgent.run = _run  # type: ignore[method-assign]
    LocalElasticAgent._tw_hooked = True  # type: ignore[attr-defined]
    return None


class ExceptionText(logging.Filter):
    """Formats a record's exception where it is logged, with logging's own
    formatter, and hands it on as text (``exc_text``, ``exc_info`` cleared):
    the same lines out, but torch's log formatter then does not import
    ``torch._dynamo`` (``from torch._dynamo import config`` in
    ``TorchLogsFormatter.format``, for every record with ``exc_info``).

    That import is the first exception log's cost in an agent, which never
    loads ``torch._dynamo`` otherwise: 1.4 to 2.7 s on this kind of machine,
    between a worker's failure (its peer gone: a deleted pod, a killed
    trainer) and the agent's restart of its workers, the longest step of
    that recovery."""

    _format = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            if not record.exc_text:
                try:
                    record.exc_text = self._format.formatException(record.exc_info)
                except Exception:  # noqa: BLE001 - torch's formatter does it then
                    return True
            record.exc_info = None
        return True


def _install_exception_text() -> int:
    """An ``ExceptionText`` on every handler of torch's loggers (torch gives
    ``torch`` and ``torch.distributed`` each a stderr handler), once.
    Returns how many handlers got one."""
    loggers = [logging.getLogger("torch")] + [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if name.startswith("torch.") and isinstance(logger, logging.Logger)
    ]
    added = 0
    for logger in loggers:
        for h in logger.handlers:
            if not any(isinstance(f, ExceptionText) for f in h.filters):
                h.addFilter(ExceptionText())
                added += 1
    return added


def _forkserver_running() -> bool:
    try:
        from multiprocessing import forkserver

        return forkserver._forkserver._forkserver_pid is not None
    except Exception:  # noqa: BLE001
        return False


def _warm_workers() -> str | None:
    """With forkserver workers, start the forkserver now with torch loaded,
    unless ``sitecustomize`` did at the agent's start (``trainwire_workers``;
    ``_install_agent_hooks`` then kills old workers 0.5 s into a stop and
    starts workers with ``trainwire_workers.run_script``). Returns why not,
    if not."""
    try:
        import trainwire_workers
    except Exception as e:  # noqa: BLE001
        return f"trainwire_workers is missing ({type(e).__name__}: {e})"
    why_not = trainwire_workers.warm(sys.argv, os.environ)
    if why_not is not None:
        return why_not
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        if not hasattr(LocalElasticAgent, "_shutdown"):
            return "LocalElasticAgent has no _shutdown"
        trainwire_workers.start_forkserver()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


_warmed = False


def create_handler(params):
    """torchrun's creator for ``trainwire-c10d``: c10d's own configuration."""
    global _warmed
    if TrainwireRendezvousHandler is None:
        return _plain(params, _why_not or "torch's dynamic rendezvous is missing")
    backend, store = create_backend(params)
    handler = _create_dynamic_handler(store, backend, params)
    why_not = None
    try:
        handler.__class__ = TrainwireRendezvousHandler
    except TypeError as e:
        why_not = f"DynamicRendezvousHandler cannot be extended ({e})"
    if why_not is not None:
        return _plain_wrap(handler, why_not)
    handler._tw_setup(None)
    if handler._tw_fast and not _warmed:
        _warmed = True
        early = _forkserver_running()
        not_warm = _warm_workers()
        if not_warm is not None:
            logger.info("workers start cold: %s", not_warm)
        else:
            logger.info(
                "workers start warm: forkserver with torch preloaded, started %s",
                "with the agent" if early else "now",
            )
        _install_exception_text()
        no_hooks = _install_agent_hooks(warm=not_warm is None)
        if no_hooks is not None:
            logger.info("torch's agent is not wrapped: %s", no_hooks)
    return handler


# ---------------------------------------------------------------------------
# The fallback: torch's c10d handler under this backend's name.


def _plain(params, why_not: str):
    from torch.distributed.elastic.rendezvous.registry import _create_c10d_handler

    return _plain_wrap(_create_c10d_handler(params), why_not)


def _plain_wrap(inner, why_not: str):
    logger.warning("plain c10d rendezvous, the sidecar's losses are not heard: %s", why_not)
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler as _RH

    node_file = NodeFile(rendezvous_dir())
    node_file.write(why_not=why_not)

    class PlainC10d(_RH):
        def __init__(self, inner):
            self._inner = inner

        def get_backend(self) -> str:
            return BACKEND

        @property
        def use_agent_store(self) -> bool:
            return self._inner.use_agent_store

        def next_rendezvous(self):
            info = self._inner.next_rendezvous()
            state = getattr(getattr(self._inner, "_state_holder", None), "state", None)
            node_file.round_done(info, getattr(state, "round", None))
            return info

        def is_closed(self) -> bool:
            return self._inner.is_closed()

        def set_closed(self):
            return self._inner.set_closed()

        def num_nodes_waiting(self) -> int:
            return self._inner.num_nodes_waiting()

        def get_run_id(self) -> str:
            return self._inner.get_run_id()

        def shutdown(self) -> bool:
            if _agent_outcome["failed"]:
                return _leave_open(self._inner)
            return self._inner.shutdown()

        def __getattr__(self, name):
            return getattr(self._inner, name)

    return PlainC10d(inner)
