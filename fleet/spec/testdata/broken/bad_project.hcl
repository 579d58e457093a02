fleet "resnet" {
  min_nodes = 2
  max_nodes = 4
  project   = "visoin"

  node {
    gpus = 1
  }

  budget {
    per_hour     = -3
    total        = 500
    warn_at      = 1.5
    on_exhausted = "halt"
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}

fleet "bert" {
  min_nodes = 4
  max_nodes = 8
  project   = "nlp"

  node {
    gpus = 8
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}

fleet "gpt" {
  min_nodes = 1
  max_nodes = 2
  project   = "robotics"

  node {
    gpus = 1
  }

  budget {
    total = 10
  }
  budget {
    total = 20
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}
