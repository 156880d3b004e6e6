# A first job: one raw_exec task that prints a greeting and keeps running.
job "hello" {
  datacenters = ["dc1"]
  type        = "service"

  group "greeter" {
    count = 1

    task "hello" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"hello from ${NOMAD_ALLOC_ID}\"; exec sleep 3600"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
