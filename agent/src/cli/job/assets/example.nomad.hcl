# An example job for nomad-rs, written by `nomad-rs job init`.
#
# Run it on a dev agent (`nomad-rs agent -dev`, which enables raw_exec):
#
#     nomad-rs job run example.nomad.hcl
#
# Every block below is one nomad-rs runs; `nomad-rs job validate` names any block a job uses
# that it does not run yet.

# A job has a unique name. It holds groups of tasks; each group is placed on one node.
job "example" {
  # The datacenters the job may be placed in; "*" matches them all.
  datacenters = ["*"]

  # A service keeps its tasks running and replaces those that fail. Other types: "batch" (runs
  # to completion), "system" and "sysbatch" (one alloc on every eligible node).
  type = "service"

  # How a changed job replaces its running allocations: `max_parallel` at a time, each waiting
  # `min_healthy_time` with its tasks running before the next one goes.
  update {
    max_parallel     = 1
    min_healthy_time = "10s"
  }

  # How a draining node hands its allocations over to other nodes.
  migrate {
    max_parallel     = 1
    health_check     = "task_states"
    min_healthy_time = "10s"
  }

  # A group's tasks are placed together, on one node, `count` times.
  group "greeter" {
    count = 1

    # A port for the group: without `static`, the client picks a free one from its dynamic
    # range and tells the tasks in NOMAD_PORT_http and NOMAD_ADDR_http.
    network {
      port "http" {}
    }

    # What the client does when a task fails: restart it up to `attempts` times per
    # `interval`, `delay` apart; then "fail" the allocation, so the servers reschedule it.
    restart {
      attempts = 2
      interval = "30m"
      delay    = "15s"
      mode     = "fail"
    }

    # Scratch disk for the allocation, in MB, reserved by the scheduler.
    ephemeral_disk {
      size = 300
    }

    # A task is one process, run by a driver: raw_exec runs it as the agent's user with no
    # isolation (the dev agent enables it); exec isolates it (needs root), oci runs a container.
    task "greet" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"hello from ${NOMAD_ALLOC_ID} (port ${NOMAD_PORT_http})\"; sleep 10; done"]
      }

      # What the task may use: CPU in MHz and memory in MB.
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
