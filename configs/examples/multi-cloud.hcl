# One job, two clouds: whichever of AWS and GCP has the cheapest H100 spot
# capacity (after the cost of its interruptions) gets the fleet. The fleet
# still lives in one zone at a time; it migrates across clouds from its
# checkpoint when its zone can no longer hold min_nodes.
#
# Variables can be set with -var NAME=VALUE or FLEETD_VAR_NAME:
#
#   fleetd validate -var run=exp42 -var 'aws_regions=["us-east-1"]' configs/examples/multi-cloud.hcl

variable "run" {
  type        = string
  default     = "exp1"
  description = "Run name: the trainer's --run flag and the checkpoint prefix."
}

variable "nodes" {
  type        = number
  default     = 4
  description = "max_nodes; the job keeps going with half of it."
}

variable "aws_regions" {
  type    = list(string)
  default = ["us-east-1", "us-west-2"]
}

variable "gcp_project" {
  type    = string
  default = "my-ml-project"
}

variable "extra_env" {
  type    = map(string)
  default = {}
}

fleet "gpt-multi" {
  min_nodes = max(1, floor(var.nodes / 2))
  max_nodes = var.nodes

  # Deadline mode: spend on-demand only as much as needed to finish `work`
  # (training time at max_nodes) before the deadline.
  deadline = "2026-12-01T00:00:00Z"
  work     = "72h"

  node {
    gpus                   = 8
    gpu_types              = ["H100"]
    max_price_per_gpu_hour = 4.0
  }

  placement {
    strategy = "price-capacity"
    colocate = "zone"
    # on_demand_fallback defaults to "deadline" because a deadline is set.
  }

  provider "aws" {
    regions         = var.aws_regions
    instance_types  = ["p5.48xlarge"]
    image           = "ami-0123456789abcdef0"
    subnets         = { "us-east-1a" = "subnet-0aaa1111", "us-west-2b" = "subnet-0ddd4444" }
    security_groups = ["sg-0123456789abcdef0"]
  }

  provider "gcp" {
    project       = var.gcp_project
    zones         = ["us-central1-a", "europe-west4-b"]
    machine_types = ["a3-highgpu-8g"]
    image         = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
  }

  training {
    command        = ["python", "train_gpt.py", "--run", var.run]
    nproc_per_node = 8
    max_restarts   = 50
    # One bucket per cloud would cost egress on every migration; keep one.
    checkpoint_uri = format("s3://my-training-bucket/gpt/%s/", var.run)
    env = merge(
      {
        NCCL_DEBUG   = "WARN"
        RUN_METADATA = jsonencode({ run = var.run, clouds = ["aws", "gcp"] })
      },
      var.extra_env,
    )
  }
}
