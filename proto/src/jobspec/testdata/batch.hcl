# The blocks full.hcl leaves out: periodic and parameterized batch jobs,
# multiregion, vault/identity, task-level services and networks, host
# volumes, service-level check_restart, gateways with ingress, and the
# keys of common blocks that full.hcl does not set.

job "nightly" {
  type         = "batch"
  vault_token  = "s.token"
  consul_token = "c.token"

  periodic {
    crons            = ["0 2 * * *", "0 14 * * *"]
    prohibit_overlap = true
    time_zone        = "Europe/Berlin"
  }

  parameterized {
    payload       = "required"
    meta_required = ["customer"]
    meta_optional = ["tier"]
  }

  multiregion {
    strategy {
      max_parallel = 1
      on_failure   = "fail_all"
    }

    region "west" {
      count       = 2
      datacenters = ["w1"]
    }
  }

  reschedule {
    max_delay = "2h"
  }

  vault {
    policies = ["reader"]
  }

  group "work" {
    stop_after_client_disconnect = "90s"

    meta {
      tier = "gold"
    }

    constraint {
      attribute = "${attr.cpu.arch}"
      operator  = "!="
      value     = "arm64"
    }

    affinity {
      attribute        = "${meta.features}"
      set_contains_any = "gpu,fpga"
      weight           = -20
    }

    spread {
      attribute = "${meta.rack}"
    }

    consul {
      namespace = "billing"
    }

    volume "scratch" {
      type   = "host"
      source = "scratch-disk"
    }

    ephemeral_disk {
      migrate = true
    }

    service {
      name         = "ingress"
      port         = 8443
      canary_tags  = ["canary"]
      address_mode = "host"
      address      = "10.0.0.1"
      task         = "runner"
      on_update    = "ignore"
      provider     = "nomad"

      meta {
        version = "2"
      }

      check_restart {
        limit           = 2
        ignore_warnings = true
      }

      check {
        type     = "script"
        command  = "/bin/check"
        args     = ["-v", "${NOMAD_TASK_NAME}"]
        interval = "30s"
        timeout  = "5s"

        check_restart {
          grace = "15s"
        }
      }

      connect {
        native = true

        gateway {
          ingress {
            listener {
              port     = 8080
              protocol = "http"

              service {
                name  = "api"
                hosts = ["api.example.com"]
              }
            }
          }
        }
      }
    }

    service {
      name = "mesh"

      connect {
        sidecar_service {
          proxy {
            local_service_address = "127.0.0.2"

            expose {
              path {
                path            = "/metrics"
                protocol        = "http"
                local_path_port = 9102
                listener_port   = "expose"
              }
            }
          }
        }
      }
    }

    task "runner" {
      driver         = "exec"
      kind           = "connect-proxy:mesh"
      shutdown_delay = "3s"

      constraint {
        attribute = "${attr.os.name}"
        value     = "ubuntu"
      }

      affinity {
        attribute = "${node.class}"
        value     = "big"
      }

      service {
        name = "runner-metrics"
        port = "metrics"
      }

      resources {
        cores = 2
        disk  = 1024

        network {
          mbits = 10

          port "metrics" {}
        }
      }

      volume_mount {
        volume           = "scratch"
        destination      = "/scratch"
        propagation_mode = "host-to-task"
      }

      lifecycle {
        hook    = "poststart"
        sidecar = true
      }

      logs {
        disabled = true
      }

      artifact {
        source = "https://example.com/tools/run.sh?archive=false"
        mode   = "file"

        headers {
          User-Agent = "nomad-rs"
        }
      }

      identity {
        env = true
      }

      dispatch_payload {
        file = "input.json"
      }

      scaling "mem" {
        max = 2048
      }

      csi_plugin {
        id             = "nfs"
        type           = "monolith"
        health_timeout = "1m"
      }

      config {
        command = "run.sh"
      }
    }
  }
}
