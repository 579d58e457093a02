fleet "bert" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]

    checkpoint {
      dir   = "s3://bucket/ckpt"
      store = "s3://bucket/ckpt?endpont=http://127.0.0.1:5000"
      keep  = 0
    }
  }
}

fleet "gpt" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]

    checkpoint {
      store  = "file:///srv/ckpt"
      access = "signed"
    }
  }
}
