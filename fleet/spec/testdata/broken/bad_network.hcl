fleet "bert" {
  min_nodes = 2
  max_nodes = 8

  node {
    gpus    = 8
    network = "fast"
  }

  placement {
    colocate = "region"
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}

fleet "gpt" {
  min_nodes = 2
  max_nodes = 8

  node {
    gpus    = 8
    network = "efa"
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}

fleet "t5" {
  min_nodes = 2
  max_nodes = 8

  node {
    gpus    = 8
    network = "auto"
  }

  provider "local" {}

  training {
    command     = ["python3", "train.py"]
    gradient_mb = -1400
  }
}
