fleet "bert" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
  }

  provider "awz" {
    regions = ["us-east-1"]
  }

  provider "azure" {}

  training {
    command = ["python3", "train.py"]
  }
}
