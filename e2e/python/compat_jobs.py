"""python-nomad 2.1.0 against a nomad-rs server: register, list, read, evaluations, stop, purge.

Every step asserts on what Nomad itself would return, and prints `ok: <step>`.
"""
import os
import sys

import nomad
from nomad.api import exceptions

client = nomad.Nomad(host=os.environ["NOMAD_HOST"], port=int(os.environ["NOMAD_PORT"]), timeout=10)

job = {
    "Job": {
        "ID": "py-web",
        "Name": "py-web",
        "Type": "service",
        "Datacenters": ["dc1"],
        "TaskGroups": [
            {
                "Name": "web",
                "Count": 2,
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


def check(cond, what):
    if not cond:
        print("FAILED: " + what)
        sys.exit(1)
    print("ok: " + what)


reg = client.jobs.register_job(job)
check(reg["EvalID"] != "" and reg["JobModifyIndex"] > 0, "registered")

listed = client.jobs.get_jobs()
check([j["ID"] for j in listed] == ["py-web"], "listed")
check(client.jobs.get_jobs(prefix="py-")[0]["Status"] in ("pending", "running"), "listed by prefix")
check(client.jobs.get_jobs(prefix="nope") == [], "empty prefix list")
check("py-web" in client.jobs, "membership test")

read = client.job.get_job("py-web")
check(read["TaskGroups"][0]["Count"] == 2 and read["Namespace"] == "default", "read")

evals = client.job.get_evaluations("py-web")
check(any(e["ID"] == reg["EvalID"] for e in evals), "evaluations")
ev = client.evaluation.get_evaluation(reg["EvalID"])
check(ev["JobID"] == "py-web" and ev["TriggeredBy"] == "job-register", "evaluation read")

summary = client.job.get_summary("py-web")
check("web" in summary["Summary"], "summary")
check(isinstance(client.job.get_allocations("py-web"), list), "allocations")

try:
    client.job.get_job("does-not-exist")
    check(False, "missing job raises")
except exceptions.URLNotFoundNomadException:
    check(True, "missing job raises URLNotFound")

stopped = client.job.deregister_job("py-web")
check(stopped["EvalID"] != "", "stopped")
check(client.job.get_job("py-web")["Stop"] is True, "stop visible")

purged = client.job.deregister_job("py-web", purge=True)
check("EvalID" in purged, "purge answered")
try:
    client.job.get_job("py-web")
    check(False, "purged job is gone")
except exceptions.URLNotFoundNomadException:
    check(True, "purged")

check(client.status.leader.get_leader() != "", "leader")
check(client.regions.get_regions() == ["global"], "regions")
check("config" in client.agent.get_agent(), "agent self")
