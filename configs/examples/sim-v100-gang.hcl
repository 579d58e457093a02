# An 8-node data-parallel job on AWS p3.2xlarge (1×V100) spot, replayed on
# the bundled V100 trace with every zone's 0/1 probe standing for a pool of
# 8 instances (capacity_scale), to compare the goodput autoscaler with a
# fleet fixed at max_nodes for job shapes after published measurements:
#
#   fleetd sim -spec configs/examples/sim-v100-gang.hcl -job-shapes near-linear,comm-bound -windows 300
#
# The deadline below is the trace's first tick plus 96 h: twice the work at
# max_nodes. See docs/sim.md and docs/autoscale.md.

fleet "v100-gang" {
  min_nodes = 1
  max_nodes = 8 # no desired_nodes: the autoscaler sizes the fleet (goodput policy)

  deadline = "2023-02-19T22:08:16Z" # 96 h after the trace starts
  work     = "48h"                  # training time left at max_nodes

  node {
    gpus      = 1
    gpu_types = ["V100"]
  }

  placement {
    colocate           = "zone"
    on_demand_fallback = "deadline"
    scale              = "goodput"
  }

  provider "sim" {
    trace           = "configs/traces/aws-v100-2023-02-15"
    cloud           = "aws"
    instance_type   = "p3.2xlarge"
    gpu_type        = "V100"
    vcpus           = 8
    memory_gib      = 61
    on_demand_price = 3.06
    launch_latency  = "2m"
    changeover      = "12m"
    capacity_scale  = 8 # an available zone holds 8 spot instances
  }

  training {
    command        = ["python", "train.py", "--ckpt", "/mnt/ckpt"]
    drain_grace    = "30s"
    checkpoint_uri = "s3://my-training-bucket/v100-gang/"
  }
}
