# A job that touches every block the parser supports.

variable "image" {
  type        = string
  description = "container image"
  default     = "redis:7"
}

variable "replicas" {
  type    = number
  default = 2
}

locals {
  app  = "cache"
  full = "${local.app}-${var.replicas}"
}

job "example" {
  region      = "eu"
  namespace   = "prod"
  type        = "service"
  priority    = 70
  datacenters = ["dc1", "dc2"]
  node_pool   = "fast"
  all_at_once = false

  meta {
    owner = "team-a"
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    distinct_hosts = true
  }

  constraint {
    distinct_property = "${meta.rack}"
  }

  constraint {
    attribute = "${attr.nomad.version}"
    version   = ">= 1.5"
  }

  constraint {
    attribute = "${meta.tags}"
    set_contains = "ssd"
  }

  constraint {
    attribute = "${node.unique.name}"
    regexp    = "^web-[0-9]+$"
  }

  affinity {
    attribute = "${node.datacenter}"
    value     = "dc1"
    weight    = 80
  }

  spread {
    attribute = "${node.datacenter}"
    weight    = 100

    target "dc1" {
      percent = 70
    }

    target "dc2" {
      percent = 30
    }
  }

  update {
    max_parallel     = 2
    min_healthy_time = "30s"
    canary           = 1
    auto_promote     = true
  }

  reschedule {
    delay          = "1m"
    delay_function = "constant"
    unlimited      = false
    attempts       = 5
    interval       = "1h"
  }

  migrate {
    max_parallel = 3
  }

  group "cache" {
    count                 = var.replicas
    shutdown_delay        = "5s"
    max_client_disconnect = "1h"

    # Its per_alloc volume cannot go with canaries: the group rolls without them.
    update {
      canary       = 0
      auto_promote = false
    }

    network {
      mode     = "bridge"
      hostname = "cache-host"

      dns {
        servers = ["1.1.1.1"]
      }

      port "db" {
        to = 6379
      }

      port "admin" {
        static       = 8080
        to           = 80
        host_network = "public"
      }
    }

    service {
      name     = "${local.app}-redis"
      port     = "db"
      tags     = ["cache", "v${var.replicas}"]
      provider = "consul"

      check {
        name     = "alive"
        type     = "grpc"
        interval = "10s"
        timeout  = "2s"
      }

      check {
        type     = "http"
        path     = "/health"
        port     = "admin"
        interval = "1h30m"
        timeout  = "250ms"
        method   = "GET"

        header {
          Authorization = ["Basic x"]
        }

        check_restart {
          limit = 3
          grace = "90s"
        }
      }

      connect {
        sidecar_service {
          port = "20000"
          tags = ["mesh"]

          proxy {
            local_service_port = 6379

            upstreams {
              destination_name = "db"
              local_bind_port  = 5432
            }

            upstreams {
              destination_name = "search"
              local_bind_port  = 9200
              datacenter       = "dc2"

              config {
                connect_timeout_ms = 1500
              }
            }

            config {
              protocol = "tcp"
            }
          }
        }

        sidecar_task {
          resources {
            cpu    = 250
            memory = 128
          }
        }
      }
    }

    service {
      name = "gateway"

      connect {
        gateway {
          proxy {}

          terminating {
            service {
              name    = "legacy"
              ca_file = "/etc/ca.pem"
            }
          }
        }
      }
    }

    volume "data" {
      type            = "csi"
      source          = "redis-vol"
      read_only       = false
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      per_alloc       = true

      mount_options {
        fs_type     = "ext4"
        mount_flags = ["noatime"]
      }
    }

    restart {
      attempts = 0
    }

    ephemeral_disk {
      size   = 500
      sticky = true
    }

    scaling {
      min = 1
      max = 5

      policy {
        cooldown = "1m"
      }
    }

    task "redis" {
      driver = "docker"
      user   = "redis"
      leader = true

      config {
        image = var.image
        args  = ["--port", "${NOMAD_PORT_db}"]

        port_map {
          db = 6379
        }

        labels = {
          app = "cache"
        }
      }

      env {
        ALLOC  = "${NOMAD_ALLOC_ID}"
        ESCAPE = "$${NOT_INTERPOLATED}"
        NODE   = "n-${node.unique.name}"
      }

      resources {
        cpu        = 500
        memory     = 256
        memory_max = 512

        device "nvidia/gpu" {
          count = 2
        }
      }

      volume_mount {
        volume      = "data"
        destination = "/data"
        read_only   = true
      }

      template {
        data        = <<-EOT
          port={{ env "NOMAD_PORT_db" }}
          EOT
        destination = "local/redis.conf"
        change_mode = "signal"
        change_signal = "SIGHUP"
      }

      artifact {
        source      = "https://example.com/redis.tar.gz"
        destination = "local/redis"
        options {
          checksum = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        }
      }

      logs {
        max_files     = 3
        max_file_size = 5
      }

      kill_timeout = "20s"
      kill_signal  = "SIGTERM"

      meta = {
        "team.name" = "cache"
      }
    }

    task "init" {
      driver = "raw_exec"

      lifecycle {
        hook    = "prestart"
        sidecar = false
      }

      config {
        command = "/bin/true"
      }
    }

    task "plugin" {
      driver = "docker"

      csi_plugin {
        id        = "ebs"
        type      = "node"
        mount_dir = "/csi"
      }

      config {
        image = "ebs-plugin:1"
      }
    }
  }
}
