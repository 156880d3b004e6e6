"""python-nomad 2.1.0's client module against a nomad-rs dev agent: the calls of python-nomad's
own tests/test_client.py (ls, stat, cat, read_at, stream_file refusing a missing file, host stats,
allocation stats, gc of one alloc and of all), plus signal and restart, on a raw_exec job, or on a docker job when NOMAD_DRIVER=docker (its image in NOMAD_IMAGE).

Each call prints `ok: <name>` or `FAILED: <name>: <error>`; the last line is
`N passed, M failed`, and the exit code is 1 when anything failed.
"""
import os
import sys
import time

import nomad
from nomad.api import exceptions

client = nomad.Nomad(host=os.environ["NOMAD_HOST"], port=int(os.environ["NOMAD_PORT"]), timeout=10)

driver = os.environ.get("NOMAD_DRIVER", "raw_exec")
script = "echo started > local/out.txt; exec sleep 300"
if driver == "docker":
    config = {"image": os.environ["NOMAD_IMAGE"], "command": "sh", "args": ["-c", "cd / && " + script]}
else:
    config = {"command": "/bin/sh", "args": ["-c", script]}

job = {
    "Job": {
        "ID": "py-client",
        "Name": "py-client",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "g",
                "Count": 1,
                "Tasks": [
                    {
                        "Name": "t",
                        "Driver": driver,
                        "Config": config,
                        "Resources": {"CPU": 100, "MemoryMB": 64},
                    }
                ],
            }
        ],
    }
}

client.jobs.register_job(job)
deadline = time.time() + 60
alloc = None
while time.time() < deadline:
    allocs = [a for a in client.job.get_allocations("py-client") if a["ClientStatus"] == "running"]
    if allocs:
        alloc = allocs[0]["ID"]
        break
    time.sleep(0.2)
if alloc is None:
    print("FAILED: the job's allocation never ran")
    sys.exit(1)
# The task writes its file right after it starts.
while time.time() < deadline:
    try:
        if "started" in client.client.cat.read_file(alloc, "/t/local/out.txt"):
            break
    except exceptions.BaseNomadException:
        pass
    time.sleep(0.2)

results = []


def step(name, fn):
    try:
        fn()
        results.append(True)
        print("ok: " + name)
    except Exception as e:  # noqa: BLE001 - every failure is reported by name
        results.append(False)
        print("FAILED: %s: %r" % (name, e))


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def ls():
    files = client.client.ls.list_files(alloc)
    expect(sorted(f["Name"] for f in files if f["IsDir"]) >= ["alloc", "t"], files)


def stat():
    info = client.client.stat.stat_file(alloc)
    expect(info["IsDir"] is True, info)
    info = client.client.stat.stat_file(alloc, "/t/local/out.txt")
    expect(info["Size"] == 8 and info["Name"] == "out.txt", info)


def cat():
    expect(client.client.cat.read_file(alloc, "/t/local/out.txt") == "started\n", "cat")


def read_at():
    expect(client.client.read_at.read_file_offset(alloc, 1, 3, "/t/local/out.txt") == "tar", "read_at")


def stream_fail():
    try:
        client.client.stream_file.stream(alloc, 1, "start", "/t/local/missing")
    except exceptions.BadRequestNomadException:
        return
    raise AssertionError("no BadRequest for a missing file")


def host_stats():
    s = client.client.stats.read_stats()
    expect(s["Memory"]["Total"] > 0 and len(s["CPU"]) > 0, s)


def alloc_stats():
    s = client.client.allocation.read_allocation_stats(alloc)
    expect(s["Tasks"]["t"]["ResourceUsage"]["MemoryStats"]["RSS"] > 0, s)


def signal():
    client.client.allocation.signal_allocation(alloc, "SIGCONT", task="t")


def restart():
    client.client.allocation.restart_allocation(alloc)


def gc_all():
    node_id = client.nodes.get_nodes()[0]["ID"]
    client.client.gc_all_allocations.garbage_collect(node_id)
    client.client.gc_all_allocations.garbage_collect()


def gc_running_refused():
    try:
        client.client.gc_allocation.garbage_collect(alloc)
    except exceptions.BaseNomadException:
        return
    raise AssertionError("a running alloc was collected")


for name, fn in [
    ("ls list_files", ls),
    ("stat stat_file", stat),
    ("cat read_file", cat),
    ("read_at read_file_offset", read_at),
    ("stream_file refuses a missing file", stream_fail),
    ("stats read_stats", host_stats),
    ("allocation read_allocation_stats", alloc_stats),
    ("allocation signal_allocation", signal),
    ("allocation restart_allocation", restart),
    ("gc_all_allocations garbage_collect", gc_all),
    ("gc_allocation refuses a running alloc", gc_running_refused),
]:
    step(name, fn)

client.job.deregister_job("py-client", purge=True)
passed = sum(results)
print("%d passed, %d failed" % (passed, len(results) - passed))
sys.exit(0 if passed == len(results) else 1)
