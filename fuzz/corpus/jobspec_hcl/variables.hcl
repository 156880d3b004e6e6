variable "n" {
  type    = number
  default = 2
}
locals {
  name = upper("web")
}
job "j" {
  meta = { x = "${local.name}-${var.n}" }
  group "g" {
    count = var.n
    dynamic "task" {
      for_each = ["a", "b"]
      labels   = [task.value]
      content {
        driver = "exec"
        config { command = "true" }
      }
    }
  }
}
