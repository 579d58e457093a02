#!/usr/bin/env python3
"""fleetd example trainer: elastic data-parallel linear regression, stdlib only.

Every rank holds the same weights. Each step, every rank computes the gradient
of a mean-squared-error loss on its shard of the global mini-batch, rank 0
sums the shards' gradients (a star all-reduce over TCP at MASTER_ADDR:MASTER_PORT)
and broadcasts the average, and every rank applies the same update. Rank 0
checkpoints atomically every --ckpt-every steps (50) and whenever the group
stops; a restarted group resumes from the checkpoint at whatever WORLD_SIZE it
now has (the batch is re-sharded by rank).

It follows torchrun's worker contract (RANK, WORLD_SIZE, MASTER_ADDR, ...)
plus fleetd's FLEETD_CHECKPOINT_URI, FLEETD_DRAIN_FILE and the
checkpoint-on-notice contract (SIGTERM, FLEETD_CHECKPOINT_REQUEST,
FLEETD_CHECKPOINT_DONE, FLEETD_RESUME_STEP), so it runs the same under fleetd's
agent, under torchrun (`--no_python` not needed) or by hand. See
docs/examples.md for the full contract.

Exit codes: 0 finished, or stopped by SIGTERM/SIGINT after checkpointing;
1 unexpected error; 2 bad arguments or configuration; 3 a peer was lost or
the group could not form (the agent restarts the workers in a new round).
"""

import argparse
import errno
import json
import os
import random
import select
import shutil
import socket
import struct
import sys
import time
import traceback

# Progress reports (FLEETD_PROGRESS) through the optional helper next to the
# examples; without it the script trains the same, unreported.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    from fleetd_progress import Reporter
except ImportError:
    Reporter = None
# The worker-contract skeleton the examples share (stdlib only, next to them).
from fleetd_trainer import (DONE_FILE, EXIT_ERROR, EXIT_OK, EXIT_PEER, EXIT_USAGE, PeerLost, StepEnd, StopFlag, add_common_args,
                            UsageError, atomic_write, await_own_signal, checkpoint_dir, emit,
                            env_default, read_checkpoint_request, read_drain_notice, write_error_file)

CKPT_FILE = "checkpoint.json"
STEP_COMPLETE = "COMPLETE"  # marks a step-N/ checkpoint complete (FLEETD_CHECKPOINT_DIR)
CKPT_FORMAT = "fleetd-example-trainer/1"
ACK_TIMEOUT = 3.0  # seconds a live rank 0 needs at most to answer a hello
MAX_MSG = 64 << 20  # a corrupt length prefix must not make us allocate gigabytes


class Stopped(Exception):
    """This process was asked to stop (SIGTERM/SIGINT) before the group formed."""


def env_int(name, default=None):
    v = os.environ.get(name)
    if v is None or v == "":
        if default is None:
            raise UsageError("environment variable %s is required" % name)
        return default
    try:
        return int(v)
    except ValueError:
        raise UsageError("environment %s=%r is not an integer" % (name, v))


def parse_args(argv):
    p = argparse.ArgumentParser(description="fleetd example data-parallel trainer (stdlib only)")
    add_common_args(p)
    p.add_argument("--dim", type=int, default=16, help="features of the synthetic dataset")
    p.add_argument("--samples", type=int, default=2048, help="size of the synthetic dataset")
    p.add_argument("--batch", type=int, default=64, help="global mini-batch, split across ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--connect-timeout", type=float, default=env_default("TRAIN_CONNECT_TIMEOUT", 60.0, float),
                   help="seconds for all ranks to reach rank 0 (env TRAIN_CONNECT_TIMEOUT)")
    p.add_argument("--op-timeout", type=float, default=env_default("TRAIN_OP_TIMEOUT", 10.0, float),
                   help="seconds a collective may wait for a silent peer (env TRAIN_OP_TIMEOUT)")
    p.add_argument("--bind-retry", type=float, default=5.0,
                   help="seconds rank 0 retries a busy MASTER_PORT (the last round may still be closing)")
    p.add_argument("--peer-grace", type=float, default=1.0,
                   help="seconds to wait for our own SIGTERM after the group broke, before exiting 3")
    a = p.parse_args(argv)
    if a.steps < 0 or a.ckpt_every < 1 or a.batch < 1 or a.dim < 1 or a.samples < 1:
        raise UsageError("--steps must be >= 0; --ckpt-every, --batch, --dim, --samples >= 1")
    if a.step_time < 0 or a.op_timeout <= 0 or a.connect_timeout <= 0 or a.resume_wait < 0:
        raise UsageError("--step-time and --resume-wait must be >= 0 and the timeouts > 0")
    a.ckpt_dir = checkpoint_dir(a.ckpt)
    return a


class Env:
    """torchrun's worker environment (plus fleetd's extras)."""

    def __init__(self):
        self.rank = env_int("RANK", 0)
        self.world_size = env_int("WORLD_SIZE", 1)
        self.local_rank = env_int("LOCAL_RANK", self.rank)
        self.group_rank = env_int("GROUP_RANK", 0)
        self.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0)
        self.run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
        self.master_addr = os.environ.get("MASTER_ADDR", "")
        self.master_port = 0
        self.node_id = os.environ.get("FLEETD_NODE_ID", "")
        self.drain_file = os.environ.get("FLEETD_DRAIN_FILE", "")
        self.round = os.environ.get("FLEETD_ROUND", "")
        # Checkpoint on notice (docs/agent.md): why the agent's SIGTERM came,
        # where to confirm the checkpoint, and the step the last one reached.
        self.checkpoint_request = os.environ.get("FLEETD_CHECKPOINT_REQUEST", "")
        self.checkpoint_done = os.environ.get("FLEETD_CHECKPOINT_DONE", "")
        self.resume_step = env_int("FLEETD_RESUME_STEP", -1)
        if self.resume_step < 0:
            self.resume_step = None
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise UsageError("RANK=%d is outside WORLD_SIZE=%d" % (self.rank, self.world_size))
        if self.world_size > 1:
            if not self.master_addr:
                raise UsageError("environment variable MASTER_ADDR is required when WORLD_SIZE > 1")
            self.master_port = env_int("MASTER_PORT")
            if not 0 < self.master_port < 65536:
                raise UsageError("MASTER_PORT=%d is not a TCP port" % self.master_port)


# --- the model --------------------------------------------------------------

class Dataset:
    """y = w*.x + b* + noise, generated from the seed so every rank sees the
    same data without any shared storage."""

    def __init__(self, samples, dim, seed):
        rng = random.Random(seed)
        self.true_w = [rng.uniform(-2.0, 2.0) for _ in range(dim)]
        self.true_b = rng.uniform(-1.0, 1.0)
        self.x = []
        self.y = []
        for _ in range(samples):
            xi = [rng.gauss(0.0, 1.0) for _ in range(dim)]
            self.x.append(xi)
            self.y.append(sum(w * v for w, v in zip(self.true_w, xi)) + self.true_b + rng.gauss(0.0, 0.1))

    def shard(self, step, batch, rank, world_size):
        """Indices of this rank's part of global batch `step`: batch j of the
        step goes to rank j % world_size, so the global batch (and hence the
        trajectory) does not depend on the world size."""
        n = len(self.x)
        base = step * batch
        return [(base + j) % n for j in range(rank, batch, world_size)]


def local_gradient(ds, idx, w, b):
    """Sums (not means) over the shard, so rank 0 can form the exact
    global-batch mean whatever the shard sizes are."""
    gw = [0.0] * len(w)
    gb = 0.0
    loss = 0.0
    for i in idx:
        xi = ds.x[i]
        err = sum(wj * xj for wj, xj in zip(w, xi)) + b - ds.y[i]
        loss += err * err
        g = 2.0 * err
        for j, xj in enumerate(xi):
            gw[j] += g * xj
        gb += g
    return gw, gb, loss, len(idx)


# --- wire protocol: 4-byte big-endian length + JSON -------------------------

def send_msg(sock, obj):
    data = json.dumps(obj, separators=(",", ":")).encode()
    try:
        sock.sendall(struct.pack("!I", len(data)) + data)
    except (OSError, socket.timeout) as e:
        raise PeerLost("send failed: %s" % e)


class Conn:
    def __init__(self, sock, name):
        self.sock = sock
        self.name = name
        self.buf = bytearray()

    def fill(self):
        """Read what is available (select said readable); EOF is a lost peer."""
        try:
            data = self.sock.recv(1 << 16)
        except (OSError, socket.timeout) as e:
            raise PeerLost("%s: %s" % (self.name, e))
        if not data:
            raise PeerLost("%s closed the connection" % self.name)
        self.buf += data

    def pop(self):
        if len(self.buf) < 4:
            return None
        (n,) = struct.unpack("!I", bytes(self.buf[:4]))
        if n > MAX_MSG:
            raise PeerLost("%s sent a %d-byte message" % (self.name, n))
        if len(self.buf) < 4 + n:
            return None
        data = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        try:
            m = json.loads(data)
        except ValueError:
            raise PeerLost("%s sent malformed JSON" % self.name)
        if not isinstance(m, dict):
            raise PeerLost("%s sent a JSON %s, not an object" % (self.name, type(m).__name__))
        return m

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def recv_all(conns, timeout, stop=None, what="message"):
    """One message from each conn, read concurrently so a dead peer is seen at
    once even while a slow one is still computing. Returns {conn: msg}."""
    deadline = time.monotonic() + timeout
    got = {}
    pending = list(conns)
    while True:
        for c in list(pending):
            m = c.pop()
            if m is not None:
                got[c] = m
                pending.remove(c)
        if not pending:
            return got
        if stop is not None and stop.set:
            raise Stopped()
        left = deadline - time.monotonic()
        if left <= 0:
            raise PeerLost("timed out after %.1fs waiting for %s from %s"
                           % (timeout, what, ", ".join(c.name for c in pending)))
        ready, _, _ = select.select([c.sock for c in pending], [], [], min(left, 0.2))
        for c in pending:
            if c.sock in ready:
                c.fill()


# --- checkpoints ------------------------------------------------------------

def step_layout(ckpt_dir):
    """fleetd's travelling checkpoints (training.checkpoint, docs/checkpoints.md):
    when the checkpoint dir is FLEETD_CHECKPOINT_DIR, each checkpoint is its
    own step-N/ directory, complete once it holds COMPLETE; the agent uploads
    complete ones and restores the latest on a new node."""
    d = os.environ.get("FLEETD_CHECKPOINT_DIR", "")
    return bool(d) and bool(ckpt_dir) and os.path.abspath(d) == os.path.abspath(ckpt_dir)


def newest_step_dir(ckpt_dir):
    """The newest complete step-N/ directory, or None."""
    best = None
    try:
        names = os.listdir(ckpt_dir)
    except FileNotFoundError:
        return None
    for name in names:
        if not name.startswith("step-") or not name[5:].isdigit():
            continue
        if not os.path.exists(os.path.join(ckpt_dir, name, STEP_COMPLETE)):
            continue  # still being written
        if best is None or int(name[5:]) > best[0]:
            best = (int(name[5:]), os.path.join(ckpt_dir, name))
    return best and best[1]


def read_checkpoint(ckpt_dir, dim):
    if not ckpt_dir:
        return None
    path = os.path.join(ckpt_dir, CKPT_FILE)
    if step_layout(ckpt_dir):
        d = newest_step_dir(ckpt_dir)
        if d is None:
            return None
        path = os.path.join(d, CKPT_FILE)
    try:
        with open(path) as f:
            ck = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UsageError("checkpoint %s is unreadable: %s" % (path, e))
    if ck.get("format") != CKPT_FORMAT:
        raise UsageError("checkpoint %s has format %r, want %r" % (path, ck.get("format"), CKPT_FORMAT))
    if len(ck.get("weights", [])) != dim:
        raise UsageError("checkpoint %s has %d weights, the model has --dim %d"
                         % (path, len(ck.get("weights", [])), dim))
    return ck


def save_step_dir(ckpt_dir, step, data):
    """Write step-N/ under a dot-name, COMPLETE last, then rename it into
    place: the agent never sees half of it."""
    final = os.path.join(ckpt_dir, "step-%d" % step)
    tmp = os.path.join(ckpt_dir, ".step-%d.tmp-%d" % (step, os.getpid()))
    os.makedirs(tmp, exist_ok=True)
    atomic_write(os.path.join(tmp, CKPT_FILE), data)
    atomic_write(os.path.join(tmp, STEP_COMPLETE), json.dumps({"step": step}) + "\n")
    if os.path.isdir(final):
        shutil.rmtree(final)  # the same step saved again (a stop right after a periodic save)
    os.replace(tmp, final)
    return os.path.join(final, CKPT_FILE)


def read_request(env):
    """The agent's checkpoint request (FLEETD_CHECKPOINT_REQUEST), if it is
    addressed to this round: {round, reason, leaving, deadline, ...}."""
    return read_checkpoint_request(env.checkpoint_request, env.round or None)


def confirm_checkpoint(env, step):
    """Tell the agent the group's checkpoint at `step` is durable: the next
    round gets FLEETD_RESUME_STEP=step."""
    if env.checkpoint_done:
        atomic_write(env.checkpoint_done, "%d\n" % step)
    emit("checkpointed", rank=env.rank, step=step, file=env.checkpoint_done)


class Trainer(StepEnd):
    def __init__(self, args, env, stop):
        self.a = args
        self.env = env
        self.stop = stop
        self.ds = Dataset(args.samples, args.dim, args.seed)
        self.w = [0.0] * args.dim
        self.b = 0.0
        self.step = 0
        self.loss = None
        self.saved_step = -1  # last step this process checkpointed (or resumed from)
        self.drained = False
        self.drain_notice = None
        self.master = None  # rank>0: Conn to rank 0
        self.peers = []  # rank 0: Conns to ranks 1..W-1, in rank order
        # Progress reports on rank 0 (a no-op elsewhere and outside fleetd).
        self.progress = Reporter(total_steps=args.steps) if Reporter else None

    def report_progress(self, force=False):
        if self.progress is not None:
            self.progress.report(self.step, samples=self.step * self.a.batch, loss=self.loss, force=force)

    # -- group formation --

    def form_group(self):
        """Rank 0 serves, the others dial in; rank 0 picks the newest
        checkpoint any rank can see and hands it to everyone, so only one
        rank needs the checkpoint storage."""
        own = read_checkpoint(self.a.ckpt_dir, self.a.dim)
        if self.env.rank == 0:
            own = self.await_resume_step(own)
        if self.env.world_size == 1:
            return self.adopt(own, -1 if own is None else 0)
        if self.env.rank == 0:
            return self.serve(own)
        return self.dial(own)

    def await_resume_step(self, own):
        """FLEETD_RESUME_STEP says the last round confirmed a checkpoint at
        that step: wait (--resume-wait) until storage shows it, as an object
        store may lag; resuming from an older one would recompute steps."""
        want = self.env.resume_step
        if want is None or not self.a.ckpt_dir:
            return own
        deadline = time.monotonic() + self.a.resume_wait
        while (own is None or own["step"] < want) and time.monotonic() < deadline and not self.stop.set:
            time.sleep(0.1)
            own = read_checkpoint(self.a.ckpt_dir, self.a.dim)
        return own

    def hello_ok(self, m):
        if m.get("t") != "hello":
            return "expected hello, got %r" % m.get("t")
        if m.get("world_size") != self.env.world_size:
            return "peer has WORLD_SIZE=%r, rank 0 has %d" % (m.get("world_size"), self.env.world_size)
        if m.get("run_id") != self.env.run_id:
            return "peer has TORCHELASTIC_RUN_ID=%r, rank 0 has %r" % (m.get("run_id"), self.env.run_id)
        r = m.get("rank")
        if not isinstance(r, int) or not 0 < r < self.env.world_size:
            return "peer rank %r is not in 1..%d" % (r, self.env.world_size - 1)
        return None

    def listen(self):
        addr, port = self.env.master_addr, self.env.master_port
        deadline = time.monotonic() + self.a.bind_retry
        while True:
            infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            family, _, _, _, sockaddr = infos[0]
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(sockaddr)
                s.listen(max(16, self.env.world_size))
                return s
            except OSError as e:
                s.close()
                if e.errno == errno.EADDRNOTAVAIL:
                    # MASTER_ADDR is not on our interfaces (NAT, public IP):
                    # serve on every address instead, as torch's TCPStore does.
                    addr = "::" if family == socket.AF_INET6 else "0.0.0.0"
                    continue
                if e.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                    raise PeerLost("rank 0 cannot listen on %s:%d: %s" % (addr, port, e))
                if self.stop.set:
                    raise Stopped()
                time.sleep(0.1)

    def serve(self, own):
        ls = self.listen()
        waiting = []  # accepted, hello not yet read
        joined = {}  # rank -> (Conn, hello)
        try:
            deadline = time.monotonic() + self.a.connect_timeout
            while len(joined) < self.env.world_size - 1:
                if self.stop.set:
                    raise Stopped()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(range(1, self.env.world_size)) - set(joined))
                    raise PeerLost("timed out after %.0fs waiting for ranks %s to connect"
                                   % (self.a.connect_timeout, missing))
                members = [c for c, _ in joined.values()]
                ready, _, _ = select.select([ls] + [c.sock for c in waiting + members], [], [], min(left, 0.2))
                if ls in ready:
                    try:
                        s, peer = ls.accept()
                    except OSError:
                        continue  # the client gave up already
                    s.settimeout(self.a.op_timeout)
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    waiting.append(Conn(s, "connection from %s" % (peer[0],)))
                for c in members:
                    if c.sock in ready:
                        c.fill()  # a member hung up (PeerLost) or spoke out of turn
                        raise PeerLost("%s sent data before the group formed" % c.name)
                for c in list(waiting):
                    if c.sock not in ready:
                        continue
                    try:
                        c.fill()
                        m = c.pop()
                    except PeerLost:
                        waiting.remove(c)  # a stray or stale client; not a group member yet
                        c.close()
                        continue
                    if m is None:
                        continue
                    waiting.remove(c)
                    why = self.hello_ok(m)
                    if why is None and m["rank"] in joined:
                        why = "rank %d already joined" % m["rank"]
                    try:
                        send_msg(c.sock, {"t": "ack"} if why is None else {"t": "reject", "error": why})
                    except PeerLost:
                        c.close()
                        continue
                    if why is not None:
                        c.close()
                        emit("reject", rank=0, reason=why)
                        continue
                    c.name = "rank %d" % m["rank"]
                    joined[m["rank"]] = (c, m)
        except BaseException:
            for c, _ in joined.values():
                c.close()
            raise
        finally:
            ls.close()  # no late joiners: the group of this round is fixed
            for c in waiting:
                c.close()
        self.peers = [joined[r][0] for r in range(1, self.env.world_size)]
        # Newest checkpoint wins; ours on a tie, so the writer's view is kept.
        best, src = own, (0 if own is not None else -1)
        for r in range(1, self.env.world_size):
            ck = joined[r][1].get("ckpt")
            if ck is not None and (best is None or ck["step"] > best["step"]):
                best, src = ck, r
        if best is not None and best.get("format") != CKPT_FORMAT:
            raise UsageError("rank %d offered a checkpoint of format %r" % (src, best.get("format")))
        done = self.done_marker_exists() or (best is not None and best["step"] >= self.a.steps)
        welcome = {"t": "welcome", "ckpt": best, "source_rank": src, "done": done}
        for c in self.peers:
            send_msg(c.sock, welcome)
        return self.adopt(best, src, done)

    def dial(self, own):
        addr, port = self.env.master_addr, self.env.master_port
        deadline = time.monotonic() + self.a.connect_timeout
        delay = 0.05
        last_err = "no answer"
        hello = {"t": "hello", "rank": self.env.rank, "world_size": self.env.world_size,
                 "run_id": self.env.run_id, "ckpt": own}
        while True:
            if self.stop.set:
                raise Stopped()
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerLost("timed out after %.0fs connecting to rank 0 at %s:%d (%s)"
                               % (self.a.connect_timeout, addr, port, last_err))
            c = None
            try:
                s = socket.create_connection((addr, port), timeout=min(left, 2.0))
                s.settimeout(self.a.op_timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c = Conn(s, "rank 0")
                send_msg(s, hello)
                # A live rank 0 acks at once; silence means we reached
                # something else on the port (say, a closing listener of the
                # previous round), so hang up and dial again.
                m = recv_all([c], min(ACK_TIMEOUT, max(0.1, left)), self.stop, "an ack")[c]
            except (OSError, PeerLost) as e:
                last_err = str(e)
                if c is not None:
                    c.close()
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 2, 0.5)
                continue
            if m.get("t") == "reject":
                c.close()
                raise PeerLost("rank 0 rejected us: %s" % m.get("error"))
            if m.get("t") != "ack":
                c.close()
                raise PeerLost("rank 0 sent %r instead of an ack" % m.get("t"))
            self.master = c
            break
        # Rank 0 times out on its own and hangs up, so wait a little longer.
        left = max(0.0, deadline - time.monotonic()) + ACK_TIMEOUT
        m = recv_all([self.master], left, self.stop, "the welcome")[self.master]
        if m.get("t") == "reject":
            raise PeerLost("rank 0 rejected us: %s" % m.get("error"))
        if m.get("t") != "welcome":
            raise PeerLost("rank 0 sent %r instead of a welcome" % m.get("t"))
        ck = m.get("ckpt")
        if ck is not None and len(ck.get("weights", [])) != self.a.dim:
            raise UsageError("rank 0's checkpoint has %d weights, the model has --dim %d"
                             % (len(ck.get("weights", [])), self.a.dim))
        return self.adopt(ck, m.get("source_rank", -1), bool(m.get("done")))

    def done_marker_exists(self):
        return bool(self.a.ckpt_dir) and os.path.exists(os.path.join(self.a.ckpt_dir, DONE_FILE))

    def adopt(self, ck, src, done=None):
        if done is None:
            done = self.done_marker_exists() or (ck is not None and ck["step"] >= self.a.steps)
        if ck is not None:
            self.w = [float(v) for v in ck["weights"]]
            self.b = float(ck["bias"])
            self.step = int(ck["step"])
            self.loss = ck.get("loss")
            self.saved_step = self.step
            emit("resume", rank=self.env.rank, world_size=self.env.world_size, step=self.step,
                 from_world_size=ck.get("world_size"), source_rank=src, loss=self.loss,
                 expected_step=self.env.resume_step)
        if self.env.resume_step is not None and self.step < self.env.resume_step:
            emit("warning", rank=self.env.rank, step=self.step,
                 message="FLEETD_RESUME_STEP=%d, but the newest checkpoint found is at step %d: "
                         "%d steps are recomputed" % (self.env.resume_step, self.step,
                                                      self.env.resume_step - self.step))
        return done

    # -- training --

    def check_drain(self):
        if self.drain_notice is None:
            self.drain_notice = read_drain_notice(self.env.drain_file)
        return self.drain_notice is not None

    def allreduce(self, contrib):
        """Sum the ranks' gradient sums at rank 0 (in rank order, so the
        result is bit-identical for every rank) and broadcast the mean."""
        if self.env.world_size == 1:
            parts = [contrib]
        elif self.env.rank != 0:
            send_msg(self.master.sock, contrib)
            m = recv_all([self.master], self.a.op_timeout, None, "step %d" % contrib["step"])[self.master]
            if m.get("t") != "update" or m.get("step") != contrib["step"]:
                raise PeerLost("rank 0 sent %r for step %r, expected an update for step %d"
                               % (m.get("t"), m.get("step"), contrib["step"]))
            return m
        else:
            got = recv_all(self.peers, self.a.op_timeout, None, "step %d" % contrib["step"])
            parts = [contrib] + [got[c] for c in self.peers]
            for c, p in zip(self.peers, parts[1:]):
                if p.get("t") != "grad" or p.get("step") != contrib["step"]:
                    raise PeerLost("%s sent %r for step %r during step %d"
                                   % (c.name, p.get("t"), p.get("step"), contrib["step"]))
        n = sum(p["n"] for p in parts)
        gw = [0.0] * self.a.dim
        gb = 0.0
        loss = 0.0
        for p in parts:
            for j, v in enumerate(p["gw"]):
                gw[j] += v
            gb += p["gb"]
            loss += p["loss"]
        n = max(n, 1)
        upd = {"t": "update", "step": contrib["step"],
               "gw": [v / n for v in gw], "gb": gb / n, "loss": loss / n,
               "stop": any(p["stop"] for p in parts),
               "drain": any(p["drain"] for p in parts)}
        for c in self.peers:
            send_msg(c.sock, upd)
        return upd

    def save(self, reason):
        if self.env.rank != 0 or not self.a.ckpt_dir or self.step == self.saved_step:
            return
        os.makedirs(self.a.ckpt_dir, exist_ok=True)
        path = os.path.join(self.a.ckpt_dir, CKPT_FILE)
        body = {"format": CKPT_FORMAT, "step": self.step, "weights": self.w, "bias": self.b,
                "loss": self.loss, "world_size": self.env.world_size, "time": time.time(),
                "run_id": self.env.run_id, "restart_count": self.env.restart_count,
                "config": {"dim": self.a.dim, "samples": self.a.samples, "batch": self.a.batch,
                           "lr": self.a.lr, "seed": self.a.seed}}
        if step_layout(self.a.ckpt_dir):
            path = save_step_dir(self.a.ckpt_dir, self.step, json.dumps(body, separators=(",", ":")) + "\n")
        else:
            atomic_write(path, json.dumps(body, separators=(",", ":")) + "\n")
        self.saved_step = self.step
        emit("checkpoint", rank=0, step=self.step, reason=reason, path=path)

    def confirm_saved(self):
        """Nobody leaves before the group's checkpoint is on disk: rank 0
        sends every rank the step it saved, and each rank then confirms it
        (FLEETD_CHECKPOINT_DONE). A new round starts on a node only once its
        old workers are gone, so it always finds this checkpoint."""
        saved = bool(self.a.ckpt_dir) and self.saved_step == self.step
        if self.env.world_size > 1 and self.env.rank == 0:
            for c in self.peers:
                try:
                    send_msg(c.sock, {"t": "saved", "step": self.step, "ok": saved})
                except PeerLost:
                    pass  # a peer that is gone needs no confirmation
        elif self.env.world_size > 1:
            try:
                m = recv_all([self.master], self.a.op_timeout, None, "the checkpoint confirmation")[self.master]
            except PeerLost as e:
                emit("warning", rank=self.env.rank, step=self.step, message="checkpoint not confirmed: %s" % e)
                return
            saved = m.get("t") == "saved" and bool(m.get("ok")) and m.get("step") == self.step
        if saved:
            confirm_checkpoint(self.env, self.step)

    def write_done(self):
        if self.env.rank != 0 or not self.a.ckpt_dir:
            return
        atomic_write(os.path.join(self.a.ckpt_dir, DONE_FILE),
                     json.dumps({"step": self.step, "time": time.time(), "script": "train.py"}) + "\n")

    def run_steps(self):
        """Returns when the run is done or the group agreed to stop; the
        second value says which (True: stop requested by someone)."""
        self.report_progress(force=True)  # where this round starts
        while self.step < self.a.steps:
            if self.a.step_time > 0:
                time.sleep(self.a.step_time)  # simulated compute; SIGTERM lands here mostly
            idx = self.ds.shard(self.step, self.a.batch, self.env.rank, self.env.world_size)
            gw, gb, loss, n = local_gradient(self.ds, idx, self.w, self.b)
            upd = self.allreduce({"t": "grad", "step": self.step, "gw": gw, "gb": gb, "loss": loss,
                                  "n": n, "stop": self.stop.set, "drain": self.check_drain()})
            # The same update on every rank keeps the replicas identical.
            self.w = [w - self.a.lr * g for w, g in zip(self.w, upd["gw"])]
            self.b = self.b - self.a.lr * upd["gb"]
            self.step += 1
            self.loss = upd["loss"]
            emit("step", step=self.step, world_size=self.env.world_size, rank=self.env.rank,
                 loss=self.loss)
            self.report_progress()
            end = self.after_step(self.env.rank, upd["stop"], upd["drain"])
            if end is not None:
                return self.end_run(end)
        return self.end_run("done")

    def close(self):
        for c in self.peers + ([self.master] if self.master else []):
            c.close()


def main(argv):
    stop = StopFlag()
    stop.install()
    try:
        args = parse_args(argv)
        env = Env()
    except UsageError as e:
        emit("error", error=str(e), exit_code=EXIT_USAGE)
        write_error_file(e)
        return EXIT_USAGE
    t = Trainer(args, env, stop)
    emit("start", rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
         group_rank=env.group_rank, restart_count=env.restart_count, run_id=env.run_id,
         node_id=env.node_id, master="%s:%d" % (env.master_addr, env.master_port) if env.world_size > 1 else "",
         ckpt_dir=args.ckpt_dir, steps=args.steps, pid=os.getpid(), resume_step=env.resume_step)
    try:
        try:
            done = t.form_group()
        except Stopped:
            emit("stop", rank=env.rank, signal=stop.signal, step=t.step, exit_code=EXIT_OK, request=read_request(env))
            return EXIT_OK
        if done:
            emit("done", rank=env.rank, world_size=env.world_size, step=t.step, weights=t.w, bias=t.b,
                 loss=t.loss, already=True)
            return EXIT_OK
        try:
            stopped = t.run_steps()
        except PeerLost as e:
            # Every completed step is consistent on every rank: keep it.
            t.save("peer-lost")
            t.close()
            if await_own_signal(stop, 0 if stop.set else args.peer_grace):
                emit("stop", rank=env.rank, signal=stop.signal, step=t.step, aborted=str(e), exit_code=EXIT_OK,
                     request=read_request(env))
                return EXIT_OK
            emit("error", rank=env.rank, step=t.step, error=str(e), exit_code=EXIT_PEER)
            write_error_file(e)
            return EXIT_PEER
        if stopped:
            t.close()
            if await_own_signal(stop, args.peer_grace):
                emit("stop", rank=env.rank, signal=stop.signal, step=t.step, exit_code=EXIT_OK, request=read_request(env))
                return EXIT_OK
            e = PeerLost("a peer was stopped at step %d" % t.step)
            emit("error", rank=env.rank, step=t.step, error=str(e), exit_code=EXIT_PEER)
            write_error_file(e)
            return EXIT_PEER
        emit("done", rank=env.rank, world_size=env.world_size, step=t.step, weights=t.w, bias=t.b, loss=t.loss)
        return EXIT_OK
    except UsageError as e:
        emit("error", rank=env.rank, error=str(e), exit_code=EXIT_USAGE)
        write_error_file(e)
        return EXIT_USAGE
    except PeerLost as e:  # the group never formed
        if stop.set:
            emit("stop", rank=env.rank, signal=stop.signal, step=t.step, aborted=str(e), exit_code=EXIT_OK)
            return EXIT_OK
        emit("error", rank=env.rank, error=str(e), exit_code=EXIT_PEER)
        write_error_file(e)
        return EXIT_PEER
    except Exception as e:
        emit("error", rank=env.rank, error="%s: %s" % (type(e).__name__, e), exit_code=EXIT_ERROR)
        write_error_file(e)
        traceback.print_exc()
        return EXIT_ERROR
    finally:
        t.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
