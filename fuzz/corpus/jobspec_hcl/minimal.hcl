job "web" {
  datacenters = ["dc1"]
  group "g" {
    count = 2
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/sleep"
        args    = ["${NOMAD_ALLOC_ID}"]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
