fleet "bert" {
  min_nodes = 1
  max_nodes = 2
  work      = "two days"

  node {
    gpus = 1
  }

  provider "local" {}

  training {
    command     = ["python3", "train.py"]
    drain_grace = "90 seconds"
  }

  rendezvous {
    heartbeat  = "2"
    dead_after = "-10s"
  }
}
