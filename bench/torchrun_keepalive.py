"""torchrun with a settable rendezvous keep-alive, as later torch releases allow.

    python3 bench/torchrun_keepalive.py [torchrun arguments...]

is `python3 -m torch.distributed.run [torchrun arguments...]` except that two
keys of --rdzv_conf take effect on torch 1.13 (Debian's python3-torch):

    keep_alive_interval=SECONDS     how often a node renews its heartbeat
    keep_alive_max_attempt=N        missed heartbeats before it counts as dead

torch 1.13 hard-codes both (DynamicRendezvousHandler.from_backend: 5 s and 3,
so a silent node is dropped after 15 s) and ignores those keys; later
releases read the same keys from --rdzv_conf. The benchmarks use this to run
torchrun at fleetd's own timeouts (heartbeat 2 s, dead after 10 s: interval 2,
5 attempts) beside torchrun at its defaults. Nothing else is changed: the
handler, the agent and the workers are torch's own.
"""

import sys
from datetime import timedelta


def rdzv_conf(argv):
    """The value of the first --rdzv_conf/--rdzv-conf in argv ("" if none)."""
    for i, a in enumerate(argv):
        for flag in ("--rdzv_conf", "--rdzv-conf"):
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(flag + "="):
                return a[len(flag) + 1:]
    return ""


def keep_alive(conf):
    """(interval seconds or None, max attempts or None) from a --rdzv_conf value."""
    interval, attempts = None, None
    for kv in conf.split(","):
        key, _, value = kv.partition("=")
        key = key.strip()
        if key == "keep_alive_interval":
            interval = float(value)
        elif key == "keep_alive_max_attempt":
            attempts = int(value)
    if interval is not None and interval <= 0 or attempts is not None and attempts < 1:
        raise SystemExit("torchrun_keepalive: keep_alive_interval must be > 0 and keep_alive_max_attempt >= 1")
    return interval, attempts


def patch(argv):
    """Make the dynamic rendezvous handlers built from now on use argv's
    keep-alive keys. from_backend passes the hard-coded values as keyword
    arguments to RendezvousSettings, looked up in its module at call time, so
    a wrapper there sees and replaces them."""
    interval, attempts = keep_alive(rdzv_conf(argv))
    if interval is None and attempts is None:
        return
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    settings = dr.RendezvousSettings

    def with_keep_alive(*args, **kwargs):
        if interval is not None:
            kwargs["keep_alive_interval"] = timedelta(seconds=interval)
        if attempts is not None:
            kwargs["keep_alive_max_attempt"] = attempts
        s = settings(*args, **kwargs)
        print("torchrun_keepalive: rendezvous %s keep-alive every %ss, dead after %d missed"
              % (s.run_id, s.keep_alive_interval.total_seconds(), s.keep_alive_max_attempt),
              file=sys.stderr, flush=True)
        return s

    dr.RendezvousSettings = with_keep_alive


def main():
    patch(sys.argv[1:])
    from torch.distributed import run

    sys.argv[0] = "torchrun"
    run.main()


if __name__ == "__main__":
    main()
