# BERT-large pre-training on AWS spot capacity, 8 GPUs per node.
#
# Nodes launch from the AMI below in two regions; the fleet stays in one
# availability zone (collectives need the bandwidth) and moves as a whole,
# restarting from its S3 checkpoint, when that zone runs out of spot capacity.

fleet "bert-large" {
  min_nodes = 2 # like torchrun --nnodes=2:8
  max_nodes = 8

  node {
    gpus                   = 8
    gpu_types              = ["A100", "H100"]
    min_vcpus              = 64
    min_memory_gib         = 500
    max_price_per_gpu_hour = 3.5 # spot offerings above this are never used
  }

  placement {
    strategy           = "price-capacity"
    colocate           = "zone"
    on_demand_fallback = "after 15m below min_nodes"
  }

  provider "aws" {
    regions        = ["us-east-1", "us-west-2"]
    instance_types = ["p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge"]
    image          = "ami-0123456789abcdef0" # a Deep Learning AMI with the NVIDIA driver
    image_per_region = {
      "us-west-2" = "ami-0fedcba9876543210"
    }
    # Zones without a subnet here are not used.
    subnets = {
      "us-east-1a" = "subnet-0aaa1111"
      "us-east-1b" = "subnet-0bbb2222"
      "us-west-2a" = "subnet-0ccc3333"
    }
    security_groups = ["sg-0123456789abcdef0"] # must allow all traffic between nodes (NCCL)
    # Security group ids are regional, like AMIs.
    security_groups_per_region = {
      "us-west-2" = ["sg-0fedcba9876543210"]
    }
    instance_profile   = "fleetd-node"          # read access to the checkpoint bucket
    interruption_queue = "fleetd-interruptions" # EventBridge → SQS, for notices the agent misses
  }

  training {
    setup = [
      "pip install --quiet -r /opt/bert/requirements.txt",
    ]
    workdir        = "/opt/bert"
    command        = ["python", "pretrain.py", "--config", "configs/bert-large.json"]
    nproc_per_node = 8   # one worker per GPU
    max_restarts   = 100 # application failures; membership changes do not count
    drain_grace    = "90s"
    checkpoint_uri = "s3://my-training-bucket/bert-large/"
    env = {
      NCCL_DEBUG             = "WARN"
      FI_EFA_USE_DEVICE_RDMA = "1"
    }
  }
}
