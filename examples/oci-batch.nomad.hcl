# A batch job in an OCI container run by runc: busybox from a root filesystem directory.
# Make the rootfs first (needs Debian's busybox-static package):
#   sudo scripts/make-busybox-rootfs /var/lib/nomad-rs/busybox-rootfs
#   nomad-rs job run examples/oci-batch.nomad.hcl
#   nomad-rs job run -var rootfs=/some/other/dir examples/oci-batch.nomad.hcl
variable "rootfs" {
  type        = string
  default     = "/var/lib/nomad-rs/busybox-rootfs"
  description = "A root filesystem directory (or an OCI image layout) on the client"
}

job "oci-batch" {
  datacenters = ["dc1"]
  type        = "batch"

  group "hello" {
    count = 1

    restart {
      attempts = 0
      mode     = "fail"
    }

    task "busybox" {
      driver = "oci"

      config {
        image   = var.rootfs
        command = "/bin/sh"
        args    = ["-c", "echo hello from busybox on $(hostname); uname -sr; ls /"]
      }

      resources {
        cpu    = 100
        memory = 32
      }
    }
  }
}
