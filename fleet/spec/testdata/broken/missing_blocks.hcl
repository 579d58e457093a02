fleet "bert" {
  min_nodes = 1
}

fleet "this-fleet-name-is-far-too-long-to-be-a-label" {
  min_nodes = 1
  max_nodes = 1

  node {
    gpus = 1
  }

  node {
    gpus = 2
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}
