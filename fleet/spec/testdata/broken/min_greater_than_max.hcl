fleet "bert" {
  min_nodes     = 6
  max_nodes     = 4
  desired_nodes = 9

  node {
    gpus = 8
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}

fleet "gpt" {
  min_nodes     = 2
  max_nodes     = 4
  desired_nodes = 9

  node {
    gpus = 8
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}
