job "j" {
  type = "batch"
  periodic {
    crons = ["*/5 * * * *"]
  }
  group "g" {
    restart {
      attempts = 1
      interval = "1h30m"
      delay    = "15s"
    }
    network {
      port "http" {}
    }
    service {
      name = "web"
      port = "http"
      check {
        type     = "http"
        path     = "/"
        interval = "10s"
        timeout  = "2s"
      }
    }
    task "t" {
      driver = "raw_exec"
      config { command = "sleep" }
    }
  }
}
