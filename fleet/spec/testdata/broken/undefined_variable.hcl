variable "region" {
  type    = string
  default = "us-east-1"
}

fleet "bert" {
  min_nodes = var.min_nodes
  max_nodes = 2

  node {
    gpus = 1
  }

  provider "aws" {
    regions        = [var.regoin]
    instance_types = ["p4d.24xlarge"]
    image          = "ami-0123456789abcdef0"
  }

  training {
    command = ["python3", "train.py", "--region", region]
  }
}
