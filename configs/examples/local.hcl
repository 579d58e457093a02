# A demo fleet that runs entirely on this machine with the embedded `local`
# provider: every "VM" is a real `fleetd agent` process with its own loopback
# address and metadata emulator, so spot interruptions can be injected
# without a cloud account.
#
#   fleetd serve -dev
#   fleetd validate configs/examples/local.hcl
#   fleetd apply -auto-approve configs/examples/local.hcl
#
# See docs/spec.md for every attribute.

variable "steps" {
  type        = number
  default     = 600
  description = "Training steps the job runs in total."
}

variable "checkpoint_dir" {
  type        = string
  default     = "/tmp/fleetd-demo/checkpoints"
  description = "Where workers checkpoint; survives node loss (shared by all local nodes)."
}

fleet "demo" {
  min_nodes     = 2 # below this, training pauses until replacements join
  max_nodes     = 4
  desired_nodes = 3 # a fixed target: the autoscaler keeps 3 nodes when it can

  node {
    gpus      = 1
    gpu_types = ["sim-gpu"]
    spot      = true
  }

  placement {
    strategy           = "price-capacity"
    colocate           = "region"                   # local zones share one machine: let replacements use either
    on_demand_fallback = "after 2m below min_nodes" # short, so the demo shows it
  }

  provider "local" {
    zones = ["local-a", "local-b"]

    # One simulated instance type; prices are what the planner ranks by.
    instance_types = {
      "sim-gpu-1" = {
        gpus            = 1
        gpu_type        = "sim-gpu"
        vcpus           = 4
        memory_gib      = 16
        spot_price      = 0.35
        on_demand_price = 1.10
      }
    }

    # Spot capacity per zone: local-a holds the whole fleet, local-b only two.
    capacity = {
      "local-a" = 4
      "local-b" = 2
    }

    notice_lead = "30s" # how long before an injected interruption the node is warned
  }

  training {
    # Workers run in the repository (resolved where the spec lives), so the
    # relative script path works for every local node.
    command        = ["python3", "examples/trainer/train.py", "--steps", tostring(var.steps), "--step-time", "0.1"]
    workdir        = abspath("../..")
    nproc_per_node = 1
    max_restarts   = 10
    drain_grace    = "20s"
    checkpoint_uri = "file://${var.checkpoint_dir}"
    env = {
      PYTHONUNBUFFERED = "1"
    }
  }

  # Tight timings suit processes on one machine; clouds want the defaults.
  rendezvous {
    last_call  = "2s"
    heartbeat  = "1s"
    dead_after = "5s"
  }
}
