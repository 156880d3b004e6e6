# A system job: one allocation on every eligible client node, including nodes that join later.
#   nomad-rs job run examples/system.nomad.hcl
#   nomad-rs job status node-ticker     # one alloc per node
job "node-ticker" {
  datacenters = ["*"]
  type        = "system"

  group "ticker" {
    task "tick" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"tick from ${node.unique.name} ($(date -u +%FT%TZ))\"; sleep 30; done"]
      }

      resources {
        cpu    = 20
        memory = 16
      }
    }
  }
}
