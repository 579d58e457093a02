# fleetd as three servers on etcd (docs/ha.md): this file is server "a";
# servers "b" and "c" differ only in cluster.name, the listen addresses and
# advertise_url. Each runs an etcd member itself, so the three VMs running
# `fleetd serve -config daemon-ha.hcl` are the whole deployment.

listen        = "10.0.1.5:7777"
advertise_url = "http://10.0.1.5:7777" # what nodes and the other servers use
data_dir      = "/var/lib/fleetd"      # token, the etcd member's data (data_dir/etcd)

cluster {
  session_ttl = "3s" # a dead leader is replaced within about this long (the default)

  embedded_etcd {
    name          = "a"
    listen_peer   = "http://10.0.1.5:2380"
    listen_client = "http://10.0.1.5:2379"
    initial_cluster = {
      a = "http://10.0.1.5:2380"
      b = "http://10.0.2.5:2380"
      c = "http://10.0.3.5:2380"
    }
    client_endpoints = ["http://10.0.1.5:2379", "http://10.0.2.5:2379", "http://10.0.3.5:2379"]
    # Mutual TLS between members and clients (every URL above then https://):
    # tls {
    #   ca_file   = "/etc/fleetd/etcd-ca.pem"
    #   cert_file = "/etc/fleetd/etcd-a.pem"     # server + client auth, SAN 10.0.1.5
    #   key_file  = "/etc/fleetd/etcd-a-key.pem"
    # }
  }

  # Or an etcd cluster you already run:
  # etcd {
  #   endpoints = ["https://etcd-1:2379", "https://etcd-2:2379", "https://etcd-3:2379"]
  #   tls {
  #     ca_file   = "/etc/fleetd/etcd-ca.pem"
  #     cert_file = "/etc/fleetd/etcd-client.pem"
  #     key_file  = "/etc/fleetd/etcd-client-key.pem"
  #   }
  # }
}
