# An exec web server on a dynamic port: python3's http.server, chrooted by the exec driver
# (which binds the host's /usr, /lib, /bin and /etc read-only into the task's root).
#   nomad-rs job run examples/web.nomad.hcl
#   nomad-rs alloc status <alloc>      # shows the address, e.g. http: 127.0.0.1:23456
job "web" {
  datacenters = ["dc1"]
  type        = "service"

  group "web" {
    count = 1

    network {
      # No static value: the client picks a free port and sets NOMAD_PORT_http.
      port "http" {}
    }

    task "server" {
      driver = "exec"

      config {
        command = "/usr/bin/python3"
        args    = ["-m", "http.server", "${NOMAD_PORT_http}", "--directory", "/alloc"]
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
