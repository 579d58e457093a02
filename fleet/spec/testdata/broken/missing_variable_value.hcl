variable "project" {
  type        = string
  description = "GCP project to launch into."
}

variable "nodes" {
  type    = number
  default = "many"
}

fleet "bert" {
  min_nodes = 1
  max_nodes = var.nodes

  node {
    gpus = 1
  }

  provider "gcp" {
    project       = var.project
    zones         = ["us-central1-a"]
    machine_types = ["a2-highgpu-1g"]
    image         = file("no-such-file.txt")
  }

  training {
    command = ["python3", "train.py"]
  }
}
