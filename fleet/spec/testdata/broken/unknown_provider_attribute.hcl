fleet "bert" {
  min_nodes = 2
  max_nodes = 4

  node {
    gpus = 8
  }

  provider "aws" {
    regionz        = ["us-east-1"]
    instance_types = ["p4d.24xlarge"]
    image          = "ami-0123456789abcdef0"
  }

  training {
    command = ["python3", "train.py"]
  }
}
