# Consul Connect: an API and a dashboard that reaches it through the service mesh. Each group
# has its own network namespace (CNI bridge) and an Envoy sidecar the servers inject; the
# dashboard's Envoy listens on 127.0.0.1:8080 for the API (${NOMAD_UPSTREAM_ADDR_count_api})
# and carries the bytes over mutual TLS to the API's Envoy, the only way in to the API.
#
# Envoy runs from the host under exec (`scripts/install-deps` puts it in /usr/local/bin); drop
# the two `sidecar_task` blocks to get Nomad's default, a docker Envoy of
# ${meta.connect.sidecar_image}. Needs root, the CNI plugins, and a Consul agent with Connect and
# its gRPC port: a real one, or the repository's stand-in:
#   target/debug/consul-standin --xds              # prints its HTTP address
#   echo 'consul { address = "127.0.0.1:<its port>" }' >consul.hcl
#   nomad-rs agent -dev-connect -config consul.hcl  # the node on the default route's interface
#   nomad-rs job run examples/connect.nomad.hcl
#   nomad-rs alloc status <dashboard alloc>         # its http port, e.g. 192.0.2.2:27123
#   curl http://192.0.2.2:27123/cgi-bin/count       # "count-api: hello from <alloc>"
variable "envoy" {
  type    = string
  default = "/usr/local/bin/envoy"
}

job "countdash" {
  datacenters = ["dc1"]

  group "api" {
    network {
      mode = "bridge"
    }

    service {
      name = "count-api"
      # The port inside the namespace: only the API's Envoy reaches it.
      port = "9001"

      connect {
        sidecar_service {}

        sidecar_task {
          driver = "exec"

          config {
            command = var.envoy
            args = ["-c", "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json", "-l", "${meta.connect.log_level}",
            "--concurrency", "${meta.connect.proxy_concurrency}", "--disable-hot-restart"]
          }
        }
      }
    }

    task "web" {
      driver = "exec"

      config {
        command = "/bin/sh"
        args = ["-c", "mkdir -p ${NOMAD_TASK_DIR}/www && echo \"count-api: hello from $NOMAD_ALLOC_ID\" >${NOMAD_TASK_DIR}/www/index.html && exec /bin/busybox httpd -f -p 127.0.0.1:9001 -h ${NOMAD_TASK_DIR}/www"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }

  group "dashboard" {
    network {
      mode = "bridge"

      port "http" {
        to = 9002
      }
    }

    service {
      name = "count-dashboard"
      port = "9002"

      connect {
        sidecar_service {
          proxy {
            upstreams {
              destination_name = "count-api"
              local_bind_port  = 8080
            }
          }
        }

        sidecar_task {
          driver = "exec"

          config {
            command = var.envoy
            args = ["-c", "${NOMAD_SECRETS_DIR}/envoy_bootstrap.json", "-l", "${meta.connect.log_level}",
            "--concurrency", "${meta.connect.proxy_concurrency}", "--disable-hot-restart"]
          }
        }
      }
    }

    task "dashboard" {
      driver = "exec"

      env {
        COUNTING_SERVICE_URL = "http://${NOMAD_UPSTREAM_ADDR_count_api}"
      }

      # busybox httpd on 9002; its CGI /cgi-bin/count asks the API through the upstream.
      config {
        command = "/bin/sh"
        args = ["-c", "mkdir -p ${NOMAD_TASK_DIR}/www/cgi-bin && printf '#!/bin/sh\\necho Content-Type: text/plain\\necho\\nexec /bin/busybox wget -q -O - %s/\\n' $COUNTING_SERVICE_URL >${NOMAD_TASK_DIR}/www/cgi-bin/count && chmod 755 ${NOMAD_TASK_DIR}/www/cgi-bin/count && exec /bin/busybox httpd -f -p 9002 -h ${NOMAD_TASK_DIR}/www"]
      }

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
