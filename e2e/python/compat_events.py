"""python-nomad 2.1.0's event stream reader against a nomad-rs server.

Subscribes to Job events, registers a job, and checks the batch it reads:
topic, type, key and payload, and that heartbeats never reach the queue.
"""
import os
import queue
import sys

import nomad

client = nomad.Nomad(host=os.environ["NOMAD_HOST"], port=int(os.environ["NOMAD_PORT"]), timeout=10)


def check(cond, what):
    if not cond:
        print("FAILED: " + what)
        sys.exit(1)
    print("ok: " + what)


stream, stop, events = client.event.stream.get_stream(index=0, topic=["Job"], timeout=60)
stream.daemon = True
stream.start()

client.jobs.register_job({"Job": {"ID": "py-events", "TaskGroups": [{"Name": "g", "Tasks": [
    {"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]}})

try:
    batch = events.get(timeout=20)
except queue.Empty:
    check(False, "a batch arrives")
check(batch["Index"] > 0, "batch has an index")
ev = batch["Events"][0]
check(ev["Topic"] == "Job" and ev["Type"] == "JobRegistered", "topic and type")
check(ev["Key"] == "py-events" and ev["Payload"]["Job"]["ID"] == "py-events", "key and payload")
check(all(e["Topic"] == "Job" for e in batch["Events"]), "only Job events")
stop.set()
print("ok: events")
