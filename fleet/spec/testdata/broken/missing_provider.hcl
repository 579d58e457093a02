fleet "bert" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
  }

  training {
    command = ["python3", "train.py"]
  }
}
