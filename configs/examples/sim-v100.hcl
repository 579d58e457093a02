# A 48-hour single-GPU training job on AWS p3.2xlarge (1×V100) spot, with a
# deadline, replayed on the bundled two-month V100 trace (9 zones, 195 s
# ticks) by the trace-driven `sim` provider:
#
#   fleetd sim -spec configs/examples/sim-v100.hcl -windows 300
#   fleetd sim -spec configs/examples/sim-v100.hcl -deadline 52h
#
# fleetd sim moves the job's start over random windows of the trace; the
# deadline below is the trace's first tick plus 60 h. See docs/sim.md.

fleet "v100-job" {
  min_nodes = 1
  max_nodes = 1

  deadline = "2023-02-18T10:08:16Z" # 60 h after the trace starts
  work     = "48h"                  # training time left at max_nodes

  node {
    gpus      = 1
    gpu_types = ["V100"]
  }

  placement {
    colocate           = "zone"
    on_demand_fallback = "deadline" # on-demand only as needed to finish in time
  }

  provider "sim" {
    trace           = "configs/traces/aws-v100-2023-02-15" # relative to where fleetd runs (the repository root)
    cloud           = "aws"                                # 2-minute interruption notices
    instance_type   = "p3.2xlarge"
    gpu_type        = "V100"
    vcpus           = 8
    memory_gib      = 61
    on_demand_price = 3.06
    launch_latency  = "2m"
    changeover      = "12m" # 0.2 h per (re)start: launch, setup, lost progress
  }

  training {
    command        = ["python", "train.py", "--ckpt", "/mnt/ckpt"]
    drain_grace    = "30s"
    checkpoint_uri = "s3://my-training-bucket/v100-job/"
  }
}
