# Every problem in this file must be reported, not only the first.
variable "nodes" {
  type = number
}

fleet "BERT_large" {
  min_nodes = 0
  max_nodes = 4
  deadline  = "next friday"

  node {
    gpus                   = -1
    max_price_per_gpu_hour = -3
    spot                   = "sometimes"
  }

  placement {
    strategy = "cheapest"
  }

  provider "gcp" {
    project       = "my-project"
    zones         = ["us-central1-a"]
    machine_types = ["a3-highgpu-8g"]
    imagee        = "projects/x/global/images/y"
  }

  provider "gcp" {
    project = "other"
  }

  training {
    command        = []
    nproc_per_node = 0
    master_port    = 70000
    env = {
      RANK       = "0"
      NCCL_DEBUG = "WARN"
      "1BAD"     = "x"
    }
  }

  rendezvous {
    heartbeat  = "20s"
    dead_after = "10s"
  }

  monitoring {
    enabled = true
  }
}
