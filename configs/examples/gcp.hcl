# Fine-tuning on GCE Spot VMs: A100 machines in two zones of us-central1.
#
# The accelerator-optimized machine types carry their GPUs, so no
# `accelerators` attribute is needed. Spot VMs get a 30 s preemption notice;
# the drain grace is shorter than that so workers checkpoint in time.

fleet "llama-ft" {
  min_nodes = 1
  max_nodes = 4

  node {
    gpus      = 8
    gpu_types = ["A100"]
  }

  placement {
    strategy           = "capacity" # prefer the zone most likely to keep the nodes
    colocate           = "zone"
    on_demand_fallback = "never" # this job can wait for spot capacity
  }

  provider "gcp" {
    project         = "my-ml-project"
    zones           = ["us-central1-a", "us-central1-c"]
    machine_types   = ["a2-highgpu-8g", "a2-ultragpu-8g"]
    image           = "projects/deeplearning-platform-release/global/images/family/pytorch-latest-gpu"
    disk_size_gb    = 500
    service_account = "fleetd-node@my-ml-project.iam.gserviceaccount.com"
    scopes          = ["https://www.googleapis.com/auth/cloud-platform"]
  }

  training {
    setup          = ["pip install --quiet transformers==4.44.2 datasets"]
    command        = ["python", "/opt/ft/finetune.py", "--model", "llama-3-8b"]
    nproc_per_node = 8
    drain_grace    = "25s"
    checkpoint_uri = "gs://my-ml-bucket/llama-ft/"
    env = {
      NCCL_DEBUG = "WARN"
      HF_HOME    = "/mnt/hf"
    }
  }

  # GCE metadata and the network are a little slower to notice a lost node.
  rendezvous {
    last_call  = "10s"
    heartbeat  = "3s"
    dead_after = "15s"
  }
}
