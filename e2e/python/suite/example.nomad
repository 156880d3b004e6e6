# The HCL job python-nomad's tests parse (tests/test_jobs.py::test_parse_job): the sdist leaves
# out the repository's example.nomad.
job "example" {
  type        = "service"
  datacenters = ["dc1"]

  group "cache" {
    task "redis" {
      driver = "raw_exec"

      config {
        command = "/bin/sleep"
        args    = ["3600"]
      }
    }
  }
}
