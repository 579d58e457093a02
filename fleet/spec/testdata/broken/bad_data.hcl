fleet "bert" {
  min_nodes = 2
  max_nodes = 8

  node {
    gpus = 8
  }

  provider "local" {}

  training {
    command = ["python3", "train.py"]

    checkpoint {
      dir = "/mnt/ckpt"
    }

    data {
      source     = "s4://imagenet/train"
      mount_path = "/data/imagenet"
      size_gb    = 150
    }

    data {
      source     = "s3://corpus/tokens"
      mount_path = "/data/corpus"
      mode       = "mount"
      region     = "us-east-1"
    }

    data {
      source            = "fsx://fs-0123456789abcdef0"
      mount_path        = "/mnt/ckpt/shared"
      size_gb           = -2
      read_per_epoch_gb = -1
      region            = "us-east-1"
    }

    data {
      source      = "gs://laion/shards"
      mount_path  = "/data/laion"
      size_gb     = 2000
      region      = "us-central1"
      zone_policy = "required"
    }

    data {
      source      = "efs://fs-0abc"
      mount_path  = "/data/efs"
      size_gb     = 10
      zone_policy = "required"
    }

    data {
      source     = "s3://corpus/more"
      mount_path = "/data/more"
      size_gb    = 10
      region     = "us-east-1"
      network    = "vpc-0123456789abcdef0"
    }

    data {
      source     = "fsx://fs-0fedcba9876543210"
      mount_path = "/data/fsx"
      size_gb    = 10
      region     = "us-east-1"
      network    = "default"
    }
  }
}
