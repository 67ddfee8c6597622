#!/usr/bin/env python3
"""Builds the recorded pod event sequences for the kube-watch tests.

The pod objects start from the real StatefulSet pod that a kube-apiserver
v1.36.2 created (shared/fixtures/admission/pod-create-from-statefulset.json)
and get the fields the scheduler, the kubelet, the node lifecycle and taint
eviction controllers set in real clusters: spec.nodeName, status.phase,
conditions with lastTransitionTime, containerStatuses with restartCount,
deletionTimestamp/deletionGracePeriodSeconds, the DisruptionTarget
condition, status.reason NodeLost. Run it again to regenerate the JSON:
    python3 make_sequences.py /path/to/shared
"""
import copy, json, sys, os

shared = sys.argv[1] if len(sys.argv) > 1 else "/work/shared"
review = json.load(open(os.path.join(shared, "fixtures/admission/pod-create-from-statefulset.json")))
BASE = review["request"]["object"]
BASE["metadata"].pop("managedFields", None)

def pod(index, uid, created, node="gpu-node-a", rv="1000"):
    p = copy.deepcopy(BASE)
    m = p["metadata"]
    m["name"] = f"llama-ft-{index}"
    m["uid"] = uid
    m["resourceVersion"] = rv
    m["creationTimestamp"] = created
    m["labels"]["apps.kubernetes.io/pod-index"] = str(index)
    m["labels"]["statefulset.kubernetes.io/pod-name"] = f"llama-ft-{index}"
    p["spec"]["hostname"] = f"llama-ft-{index}"
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Pending", "qosClass": "BestEffort", "startTime": created}
    return p

def cond(t, status, at, reason=None, message=None):
    c = {"type": t, "status": status, "lastProbeTime": None, "lastTransitionTime": at}
    if reason: c["reason"] = reason
    if message: c["message"] = message
    return c

def running(p, at, ready=True, restarts=0, ready_at=None, reason=None):
    p = copy.deepcopy(p)
    ready_at = ready_at or at
    p["status"].update({
        "phase": "Running",
        "hostIP": "10.0.0.21", "hostIPs": [{"ip": "10.0.0.21"}],
        "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
        "conditions": [
            cond("PodReadyToStartContainers", "True", p["status"]["startTime"]),
            cond("Initialized", "True", p["status"]["startTime"]),
            cond("Ready", "True" if ready else "False", ready_at, None if ready else (reason or "ContainersNotReady"),
                 None if ready else "containers with unready status: [trainer]"),
            cond("ContainersReady", "True" if ready else "False", ready_at, None if ready else (reason or "ContainersNotReady")),
            cond("PodScheduled", "True", p["status"]["startTime"]),
        ],
        "containerStatuses": [{
            "name": "trainer", "ready": ready, "started": True, "restartCount": restarts,
            "image": "registry.example.invalid/llama-ft:1.0",
            "imageID": "registry.example.invalid/llama-ft@sha256:0c5d2f5b1a",
            "containerID": f"containerd://{restarts:02d}a7f3e9c1",
            "state": {"running": {"startedAt": at}},
            **({"lastState": {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": p["status"]["startTime"], "finishedAt": at,
                "containerID": "containerd://00a7f3e9c1"}}} if restarts else {"lastState": {}}),
        }],
    })
    return p

def with_rv(p, rv):
    p = copy.deepcopy(p); p["metadata"]["resourceVersion"] = rv; return p

def step(at, type_, obj=None, expect=None, node=None):
    s = {"at": at, "type": type_}
    if obj is not None: s["object"] = obj
    if node is not None: s["node"] = node
    s["expect"] = expect or []
    return s

T0 = "2026-11-21T17:00:00Z"
p0 = pod(0, "5b0c7c3e-1f0e-4c8a-9a55-0d7f2d6c1a10", T0)
r0 = running(p0, "2026-11-21T17:00:20Z")
seqs = {}

# 1. The peer pod is deleted (kubectl delete pod, or the node is drained).
term = with_rv(r0, "1200"); term["metadata"]["deletionTimestamp"] = "2026-11-21T17:10:30Z"; term["metadata"]["deletionGracePeriodSeconds"] = 30
seqs["deleted"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:10:00Z", "Applied", term, ["suspect"]),
    step("2026-11-21T17:10:05Z", "Deleted", term, ["lost:deleted"]),
]

# 2. The trainer exits with an error and restartPolicy Never / OnFailure exhausted: phase Failed.
failed = copy.deepcopy(r0); failed["metadata"]["resourceVersion"] = "1300"
failed["status"]["phase"] = "Failed"; failed["status"]["reason"] = "Error"
failed["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-11-21T17:00:20Z", "finishedAt": "2026-11-21T17:20:00Z"}}
failed["status"]["containerStatuses"][0]["ready"] = False
seqs["failed"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:20:01Z", "Applied", failed, ["lost:failed"]),
]

# 3. Readiness fails and stays failed past the grace (10s).
nr = running(p0, "2026-11-21T17:00:20Z", ready=False, ready_at="2026-11-21T17:30:00Z")
nr["metadata"]["resourceVersion"] = "1400"
seqs["not-ready"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:30:01Z", "Applied", nr, ["suspect"]),
    step("2026-11-21T17:30:05Z", "Tick", None, []),
    step("2026-11-21T17:30:11Z", "Tick", None, ["lost:not-ready"]),
]

# 4. A fresh pod that is not Ready yet (pulling its image) is never lost for it.
fresh = running(p0, "2026-11-21T17:00:20Z", ready=False, ready_at="2026-11-21T17:00:00Z")
seqs["starting-not-ready-is-not-lost"] = [
    step("2026-11-21T17:00:20Z", "Applied", fresh, ["alive"]),
    step("2026-11-21T17:05:00Z", "Tick", None, []),
]

# 5. The trainer container crashed and the kubelet restarted it.
rs1 = running(p0, "2026-11-21T17:40:02Z", ready=False, restarts=1, ready_at="2026-11-21T17:40:00Z"); rs1["metadata"]["resourceVersion"] = "1500"
rs1b = running(p0, "2026-11-21T17:40:02Z", ready=True, restarts=1, ready_at="2026-11-21T17:40:09Z"); rs1b["metadata"]["resourceVersion"] = "1501"
seqs["container-restarted"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:40:02Z", "Applied", rs1, ["lost:container-restarted"]),
    step("2026-11-21T17:40:09Z", "Applied", rs1b, ["alive"]),
]

# 6. The node stops answering: the node lifecycle controller marks the pod
#    not Ready (~40s later) and taints the node; the service account can read
#    the node, which is unreachable.
unreach = running(p0, "2026-11-21T17:00:20Z", ready=False, ready_at="2026-11-21T17:50:40Z")
for c in unreach["status"]["conditions"]:
    if c["type"] == "Ready":
        c.pop("reason", None); c.pop("message", None)
unreach["metadata"]["resourceVersion"] = "1600"
seqs["node-unreachable"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:50:41Z", "Applied", unreach, ["suspect"]),
    step("2026-11-21T17:50:42Z", "NodeUnreachable", None, ["lost:node-unreachable"], node="gpu-node-a"),
]

# 7. Taint eviction after tolerationSeconds: the DisruptionTarget condition.
evict = copy.deepcopy(unreach); evict["metadata"]["resourceVersion"] = "1700"
evict["status"]["conditions"].append(cond("DisruptionTarget", "True", "2026-11-21T17:55:40Z", "DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"))
seqs["disruption-target"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:55:40Z", "Applied", evict, ["lost:disrupted"]),
]

# 8. The node controller marks the pod NodeLost (older clusters).
nl = copy.deepcopy(unreach); nl["metadata"]["resourceVersion"] = "1800"
nl["status"]["reason"] = "NodeLost"; nl["status"]["message"] = "Node gpu-node-a which was running pod llama-ft-0 is unresponsive"
seqs["node-lost-reason"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:51:00Z", "Applied", nl, ["lost:node-unreachable"]),
]

# 9. Stuck Terminating: deleted on an unreachable node; the kubelet never confirms.
stuck = copy.deepcopy(r0); stuck["metadata"]["resourceVersion"] = "1900"
stuck["metadata"]["deletionTimestamp"] = "2026-11-21T18:00:30Z"; stuck["metadata"]["deletionGracePeriodSeconds"] = 30
seqs["stuck-terminating"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T18:00:00Z", "Applied", stuck, ["suspect"]),
    step("2026-11-21T18:00:35Z", "Tick", None, []),
    step("2026-11-21T18:00:41Z", "Tick", None, ["lost:stuck-terminating"]),
]

# 10. Recreated with a new UID (force-deleted; the watch missed the delete),
#     then the old pod's late delete event must not count again.
new = pod(0, "9e3f1d2a-77b4-4f0e-8d21-3c5a4b6e7f80", "2026-11-21T18:10:00Z", node="gpu-node-b", rv="2000")
new_run = running(new, "2026-11-21T18:10:12Z"); new_run["metadata"]["resourceVersion"] = "2010"
seqs["recreated-new-uid"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T18:10:00Z", "Applied", new, ["alive"]),
    step("2026-11-21T18:10:01Z", "Deleted", r0, []),
    step("2026-11-21T18:10:12Z", "Applied", new_run, ["alive"]),
]

# 11. The watch was down while the pod was deleted: the relist shows it gone.
seqs["deleted-during-watch-gap"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T18:20:00Z", "Init", None, []),
    step("2026-11-21T18:20:00Z", "InitDone", None, ["lost:deleted"]),
]

# 12. Our own pod is never a peer; a Succeeded peer is the end of training.
own = running(pod(1, "c1d2e3f4-0000-4000-8000-000000000001", T0), "2026-11-21T17:00:20Z")
done = copy.deepcopy(r0); done["status"]["phase"] = "Succeeded"
seqs["own-pod-and-succeeded"] = [
    step("2026-11-21T17:00:20Z", "Applied", own, []),
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T19:00:00Z", "Applied", done, []),
    step("2026-11-21T19:00:05Z", "Deleted", done, []),
]

# 13. The trainer exits with an error (its agent SIGKILLed): the kubelet puts
#     the terminated state in the pod status at once (Ready false); it
#     restarts the container only after its back-off (restartCount 1, the
#     same exit as lastState), then the container is Ready again. One loss,
#     at the exit, closed when Ready.
ex = running(p0, "2026-11-21T17:00:20Z", ready=False, ready_at="2026-11-21T17:45:00Z"); ex["metadata"]["resourceVersion"] = "2100"
ex["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": "2026-11-21T17:00:20Z",
    "finishedAt": "2026-11-21T17:45:00Z", "containerID": "containerd://00a7f3e9c1"}}
back_off = running(p0, "2026-11-21T17:45:08Z", ready=False, restarts=1, ready_at="2026-11-21T17:45:00Z"); back_off["metadata"]["resourceVersion"] = "2101"
back_off["status"]["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"] = "2026-11-21T17:45:00Z"
back_ready = running(p0, "2026-11-21T17:45:08Z", ready=True, restarts=1, ready_at="2026-11-21T17:45:12Z"); back_ready["metadata"]["resourceVersion"] = "2102"
back_ready["status"]["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"] = "2026-11-21T17:45:00Z"
seqs["container-terminated"] = [
    step("2026-11-21T17:00:20Z", "Applied", r0, ["alive"]),
    step("2026-11-21T17:45:00Z", "Applied", ex, ["lost:container-restarted"]),
    step("2026-11-21T17:45:08Z", "Applied", back_off, ["suspect"]),
    step("2026-11-21T17:45:12Z", "Applied", back_ready, ["alive"]),
]

for name, steps in seqs.items():
    with open(f"{name}.json", "w") as f:
        json.dump({"self": "llama-ft-1", "grace_seconds": 10, "steps": steps}, f, indent=1)
        f.write("\n")
print(len(seqs), "sequences")
