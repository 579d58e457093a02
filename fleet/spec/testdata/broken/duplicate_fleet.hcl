fleet "bert" {
  min_nodes = 1
  max_nodes = 2
  node {
    gpus = 1
  }
  provider "local" {}
  training {
    command = ["python3", "train.py"]
  }
}

fleet "bert" {
  min_nodes = 2
  max_nodes = 4
  node {
    gpus = 1
  }
  provider "local" {}
  training {
    command = ["python3", "train.py"]
  }
}
