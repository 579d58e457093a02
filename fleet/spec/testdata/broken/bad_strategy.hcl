fleet "bert" {
  min_nodes = 1
  max_nodes = 2

  node {
    gpus = 1
  }

  placement {
    strategy           = "lowest_price"
    colocate           = "zoen"
    on_demand_fallback = "after 10 minutes below min_nodes"
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]
  }
}
