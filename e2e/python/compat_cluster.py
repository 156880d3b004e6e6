"""python-nomad 2.1.0 against a nomad-rs cluster of 1 server and 2 clients: register a job, list
nodes with their resources, list and read its allocations as they run on the clients, stop it.

Every step asserts on what Nomad itself would return, and prints `ok: <step>`.
"""
import os
import sys
import time

import nomad

client = nomad.Nomad(host=os.environ["NOMAD_HOST"], port=int(os.environ["NOMAD_PORT"]), timeout=10)
DEADLINE = 60.0


def check(cond, what):
    if not cond:
        print("FAILED: " + what)
        sys.exit(1)
    print("ok: " + what)


def wait(what, f):
    """Polls f until it returns something truthy; fails after DEADLINE seconds."""
    start = time.time()
    while time.time() - start < DEADLINE:
        value = f()
        if value:
            return value
        time.sleep(0.1)
    check(False, "timed out waiting for " + what)


job = {
    "Job": {
        "ID": "py-cluster",
        "Name": "py-cluster",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "web",
                "Count": 2,
                # One alloc per client.
                "Constraints": [{"Operand": "distinct_hosts", "RTarget": "true"}],
                "Tasks": [
                    {
                        "Name": "server",
                        "Driver": "raw_exec",
                        "Config": {"command": "/bin/sleep", "args": ["300"]},
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
}

# Nodes, with resources.
def ready_nodes():
    listed = client.nodes.get_nodes()
    return listed if len(listed) == 2 and all(n["Status"] == "ready" for n in listed) else None


nodes = wait("two ready nodes", ready_nodes)
check(len(nodes) == 2, "two nodes listed")
check(all("NodeResources" not in n for n in nodes), "no resources unless asked")
with_resources = client.nodes.get_nodes(resources=True)
check(len(with_resources) == 2, "two nodes listed with resources=true")
for n in with_resources:
    res = n.get("NodeResources")
    check(res is not None, "NodeResources present for " + n["Name"])
    check(res["Cpu"]["CpuShares"] > 0 and res["Memory"]["MemoryMB"] > 0, "cpu and memory in NodeResources of " + n["Name"])
    check("ReservedResources" in n, "ReservedResources present for " + n["Name"])
    check("SecretID" not in n, "no SecretID in the list of " + n["Name"])
node_ids = {n["ID"] for n in nodes}
check(all(client.node.get_node(i)["ID"] == i for i in node_ids), "each node read")

# Register.
reg = client.jobs.register_job(job)
check(reg["EvalID"] != "" and reg["JobModifyIndex"] > 0, "registered")



# Allocations: listed, then running on both clients.
def running_allocs():
    allocs = [a for a in client.allocations.get_allocations() if a["JobID"] == "py-cluster"]
    return allocs if len(allocs) == 2 and all(a["ClientStatus"] == "running" for a in allocs) else None


allocs = wait("both allocations running", running_allocs)
check({a["NodeID"] for a in allocs} == node_ids, "one allocation on each client")
with_states = client.allocations.get_allocations(task_states=True, resources=True)
mine = [a for a in with_states if a["JobID"] == "py-cluster"]
check(all(a["TaskStates"]["server"]["State"] == "running" for a in mine), "task states in the list")
check(all("AllocatedResources" in a for a in mine), "resources in the list")
for stub in allocs:
    a = client.allocation.get_allocation(stub["ID"])
    check(a["ID"] == stub["ID"] and a["Job"]["ID"] == "py-cluster", "allocation read " + a["ID"][:8])
    check(a["TaskStates"]["server"]["State"] == "running", "task running in " + a["ID"][:8])
    check(a["DesiredStatus"] == "run", "desired run for " + a["ID"][:8])
check(len(client.job.get_allocations("py-cluster")) == 2, "job allocations")

# Stop one allocation, then the job.
stopped = client.allocation.stop_allocation(allocs[0]["ID"])
check(stopped["EvalID"] != "", "allocation stop answered")
wait("the stopped allocation to be complete",
     lambda: client.allocation.get_allocation(allocs[0]["ID"])["ClientStatus"] == "complete")
check(client.allocation.get_allocation(allocs[0]["ID"])["DesiredStatus"] == "stop", "allocation stopped")

dereg = client.job.deregister_job("py-cluster")
check(dereg["EvalID"] != "", "job stopped")


def all_stopped():
    allocs = client.job.get_allocations("py-cluster")
    return all(a["DesiredStatus"] == "stop" and a["ClientStatus"] in ("complete", "failed") for a in allocs)


wait("every allocation to be stopped on the clients", all_stopped)
check(client.job.get_job("py-cluster")["Stop"] is True, "stop visible")
print("ok: cluster")
