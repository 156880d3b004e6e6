job "example" {
  datacenters = ["*"]

  group "greeter" {
    network {
      port "http" {}
    }

    task "greet" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args    = ["-c", "while true; do echo \"hello from ${NOMAD_ALLOC_ID}\"; sleep 10; done"]
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
