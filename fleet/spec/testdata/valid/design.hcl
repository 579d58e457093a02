# The example from the design document, verbatim apart from this comment.
fleet "bert-large" {
  min_nodes = 2          # below this, training pauses (like torchrun --nnodes=MIN:MAX)
  max_nodes = 8
  # desired_nodes = 4    # optional fixed target; otherwise the autoscaler picks within [min,max]

  node {
    gpus           = 8
    gpu_types      = ["A100", "H100"]
    min_vcpus      = 32
    min_memory_gib = 200
    spot           = true
    max_price_per_gpu_hour = 3.0
  }

  placement {
    strategy  = "price-capacity"   # or "lowest-price", "capacity"
    colocate  = "zone"             # all nodes of the job in one zone ("region", "none")
    on_demand_fallback = "after 10m below min_nodes"   # or "never", "deadline"
  }
  # deadline = "2026-12-01T00:00:00Z"   # optional: on-demand only as much as needed to finish in time
  # work     = "48h"                    # estimated remaining training time at max_nodes

  provider "aws" {
    regions        = ["us-east-1", "us-west-2"]
    instance_types = ["p4d.24xlarge", "p5.48xlarge"]
    image          = "ami-0123456789abcdef0"
    subnets        = { "us-east-1a" = "subnet-aaa" }
    security_groups = ["sg-123"]
    instance_profile = "fleetd-node"
    interruption_queue = "fleetd-interruptions"   # optional EventBridge→SQS queue
  }

  provider "gcp" {
    project       = "my-project"
    zones         = ["us-central1-a", "us-central1-c"]
    machine_types = ["a3-highgpu-8g"]
    image         = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
  }

  training {
    command          = ["python", "train.py", "--ckpt", "/mnt/ckpt"]
    nproc_per_node   = 8
    max_restarts     = 100            # application failures; membership changes do not count
    master_port      = 29500
    drain_grace      = "90s"          # notice → SIGTERM → (grace) → SIGKILL
    checkpoint_uri   = "s3://bucket/bert-large/"   # passed to workers; survives migration
    env = { NCCL_DEBUG = "WARN" }
  }

  rendezvous {
    last_call = "5s"      # wait this long for more nodes once min_nodes have joined
    heartbeat = "2s"
    dead_after = "10s"    # a node silent this long is dropped from the round
  }
}
