fleet "bert" {
  min_nodes = 2
  max_nodes = 4

  node {
    gpus = 8
    gpu_types = ["A100" "H100"]
  }
