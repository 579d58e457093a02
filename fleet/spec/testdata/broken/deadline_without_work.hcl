fleet "bert" {
  min_nodes = 1
  max_nodes = 2
  deadline  = "2026-12-01T00:00:00Z"

  node {
    gpus      = 0
    gpu_types = ["A100"]
  }

  provider "local" {}

  training {
    command        = ["python3", "train.py"]
    checkpoint_uri = "ckpt/dir"
  }
}

fleet "gpt" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
    spot = false
  }

  placement {
    on_demand_fallback = "deadline"
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}
