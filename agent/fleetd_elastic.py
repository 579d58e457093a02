"""fleetd_elastic: keep PyTorch DDP workers alive across membership changes.

The helper for fleetd's in-process elastic mode (``training { elastic =
"in-process" }``, docs/agent.md "In-process elastic mode"). Standard library
and torch only: the agent writes this file next to its work dir and puts it on
the workers' PYTHONPATH; a copy works anywhere (it is one file).

    import fleetd_elastic as fe

    el = fe.Elastic(backend="gloo")                        # reads the worker's environment
    model, opt = build()
    sampler = fe.ElasticSampler(len(dataset), batch_size=32, seed=0)
    state = fe.State(model, opt, sampler)                  # what a joiner is handed
    el.start(state, load=load_checkpoint, save=save_checkpoint, ckpt_every=50)
    while state.step < steps:
        idx = sampler.indices(el.rank, el.world_size)      # this rank's samples of the step
        try:
            opt.zero_grad()
            loss_fn(el.model(x[idx]), y[idx]).backward()   # el.model is the DDP wrapper
            opt.step()
        except RuntimeError as e:
            el.failed(e)        # a peer died: rejoin at the last completed step (re-raises other errors)
            continue
        el.step_done()          # step + sampler advance; checkpoint; membership changes happen here
    el.finish()

What it does:

* In in-process mode (``FLEETD_ELASTIC=in-process``) the agent does not kill
  the workers when the rendezvous moves to a new round: it writes the node's
  new assignment to ``FLEETD_ELASTIC_FILE``. ``step_done()`` checks for it with
  one small all-reduce per step, so every member of the old group sees the
  change after the same step; the group then waits until every member's agent
  has told it (normally one round trip), the new round's rank 0 opens the new
  store, the old group is destroyed, and everyone forms the new group with the
  rank, world size and master the agent handed over. Members without the
  newest state (joiners, started fresh by their agent) are sent the model,
  optimizer, step, sampler position and ``State.extra`` by broadcast from a
  survivor: no checkpoint is read. DDP is rebuilt without its start-up
  broadcast. A member whose node was excluded (a notice) leaves at that step
  and exits 0; if every member leaves, rank 0 checkpoints first.
* After a peer died without warning, the step's collective fails:
  ``failed(exc)`` abandons the step (its gradients are dropped; no optimizer
  step was taken), waits for the agent's next round and rejoins; the member
  that completed the most steps hands its state to the others.
* In restart mode (the default) and under torchrun it is a thin wrapper:
  the group forms from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, rank 0
  loads the checkpoint and broadcasts it, and a SIGTERM stops every rank after
  the same step with a checkpoint (fleetd's checkpoint-on-notice contract:
  FLEETD_CHECKPOINT_DONE, exit 0). A peer failure raises ``PeerFailure``.

Events are printed as JSON lines ``{"event": "elastic", "what": ...}`` on
stdout; the agent reads ``hello`` to know the worker follows this protocol.
"""

import datetime
import gc
import json
import math
import os
import signal
import socket
import sys
import time
import weakref

import torch
import torch.distributed as dist

__all__ = ["Elastic", "ElasticSampler", "State", "PeerFailure", "PROTOCOL",
           "AdaptiveBatch", "NoiseScale", "scale_lr"]

# PROTOCOL is the channel format this file speaks (FLEETD_ELASTIC_FILE's
# "version"); the agent writes the same number.
PROTOCOL = 1

MODE_IN_PROCESS = "in-process"
MODE_RESTART = "restart"

EXIT_PEER = 3  # the agent's "lost peer" exit code

# Collective failures: what torch's backends raise when a peer is gone or a
# collective timed out. Anything else is the script's own error.
_COMM_ERRORS = (
    "connection closed by peer", "connection reset", "broken pipe", "timed out", "timeout",
    "gloo", "nccl", "socket", "read error", "write error", "recv", "send", "econnreset",
    "epipe", "connection refused", "no route", "peer", "process group", "processgroup",
    "default process group", "store",
)


class PeerFailure(RuntimeError):
    """A collective failed because a peer is gone (restart mode: the agent
    starts a new round; exit code 3 tells it so)."""


def _now():
    return time.time()


def _emit(what, **fields):
    rec = {"event": "elastic", "what": what}
    rec.update(fields)
    rec.setdefault("time", _now())
    try:
        sys.stdout.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def _hard_exit(code):
    """Leave without destructors: a process group whose peers are gone may
    block in its teardown, and the agent wants a prompt exit code."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _atomic_write(path, text):
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, ".%s.tmp-%d" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tcp_sockets():
    """The process's TCP socket fds (Linux /proc; empty elsewhere)."""
    out = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            fd = int(name)
            if os.readlink("/proc/self/fd/%d" % fd).startswith("socket:"):
                out.add((fd, os.fstat(fd).st_ino))
        except (OSError, ValueError):
            continue
    return out


def _shutdown_sockets(socks):
    """Shuts the sockets down (both directions) without closing their fds:
    a peer blocked reading from this process then fails at once instead of
    after the collective timeout, and this process's own pending reads
    end. The fds stay owned by whoever opened them."""
    n = 0
    for fd, ino in socks:
        try:
            if os.fstat(fd).st_ino != ino:
                continue  # closed and reused meanwhile
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                s.shutdown(socket.SHUT_RDWR)
                n += 1
        except OSError:
            pass
        finally:
            s.close()
    return n


def is_peer_failure(exc):
    """Whether exc looks like a failed collective (a lost peer, a timeout)
    rather than an error of the training code."""
    if isinstance(exc, PeerFailure):
        return True
    if not isinstance(exc, RuntimeError):
        return False
    msg = str(exc).lower()
    return any(s in msg for s in _COMM_ERRORS)


class ElasticSampler:
    """The data position of an elastic job, in samples, independent of the
    world size.

    The data is a stream of epochs, each a permutation of ``num_samples``
    indices (seeded by ``seed + epoch``). Every step consumes the next
    ``world_size * batch_size`` indices of the stream; rank r takes the r-th
    slice of ``batch_size``. A step that crosses an epoch's end takes the
    epoch's last samples and the next epoch's first, so no sample is
    skipped or seen twice within an epoch, whatever the world sizes were.
    Its state is one integer (``consumed``), handed to joiners with the model.
    """

    def __init__(self, num_samples, batch_size, seed=0, shuffle=True):
        if num_samples < 1 or batch_size < 1:
            raise ValueError("num_samples and batch_size must be >= 1")
        self.num_samples = int(num_samples)
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.consumed = 0
        self._perms = {}

    @property
    def epoch(self):
        return self.consumed // self.num_samples

    @property
    def position(self):
        """Samples consumed within the current epoch."""
        return self.consumed % self.num_samples

    def _perm(self, epoch):
        p = self._perms.get(epoch)
        if p is None:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(self.seed + epoch)
                p = torch.randperm(self.num_samples, generator=g).tolist()
            else:
                p = list(range(self.num_samples))
            if len(self._perms) > 2:
                self._perms.clear()
            self._perms[epoch] = p
        return p

    def stream(self, start, count):
        """Indices [start, start+count) of the epoch stream."""
        out = []
        while count > 0:
            e, pos = divmod(start, self.num_samples)
            take = min(count, self.num_samples - pos)
            out.extend(self._perm(e)[pos:pos + take])
            start += take
            count -= take
        return out

    def indices(self, rank, world_size):
        """This rank's sample indices for the next step."""
        return self.stream(self.consumed + rank * self.batch_size, self.batch_size)

    def advance(self, world_size):
        self.consumed += world_size * self.batch_size

    def state_dict(self):
        return {"consumed": self.consumed, "num_samples": self.num_samples, "batch_size": self.batch_size,
                "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, sd):
        if sd.get("num_samples") != self.num_samples:
            raise ValueError("sampler state is for %s samples, not %d" % (sd.get("num_samples"), self.num_samples))
        # The position is in samples, so a batch size changed since
        # (AdaptiveBatch) is taken over, not refused.
        self.consumed = int(sd["consumed"])
        self.batch_size = int(sd.get("batch_size") or self.batch_size)


def scale_lr(base_lr, base_batch, batch, rule="sqrt"):
    """The learning rate for global batch ``batch`` of one tuned at
    ``base_batch``: ``"sqrt"`` multiplies it by sqrt(batch / base_batch)
    (AdaptDL's default for adaptive optimizers, Krizhevsky's rule: the
    gradient's noise falls as 1/sqrt(batch)), ``"linear"`` by batch /
    base_batch (Goyal et al.'s rule for SGD, valid while the batch stays
    below the gradient noise scale)."""
    r = float(batch) / float(base_batch)
    if rule == "sqrt":
        return base_lr * r ** 0.5
    if rule == "linear":
        return base_lr * r
    raise ValueError("lr rule %r: want 'sqrt' or 'linear'" % (rule,))


class NoiseScale:
    """The gradient noise scale B_noise = tr(Sigma) / |G|^2 (McCandlish et al.,
    2018), in samples, measured from the same step's gradient at two batch
    sizes: a micro-batch's (b samples) and the step's (B samples, the mean
    of the micro-batches or of the ranks). Their squared norms are unbiased
    estimates of |G|^2 + tr(Sigma)/b and |G|^2 + tr(Sigma)/B, which gives
    both terms; each is averaged with an exponential moving average (the
    single-step estimates are noisy) before the ratio is taken. The
    allocator's statistical efficiency at batch M is (B_noise + M0) /
    (B_noise + M) (docs/sim.md)."""

    def __init__(self, decay=0.9):
        self.decay = float(decay)
        self._g2 = None
        self._tr = None

    def observe(self, small_sq, small_batch, big_sq, big_batch):
        """Take one step's squared gradient norms at the two batch sizes."""
        b, B = float(small_batch), float(big_batch)
        if not (B > b > 0):
            return
        g2 = (B * big_sq - b * small_sq) / (B - b)
        tr = (small_sq - big_sq) / (1.0 / b - 1.0 / B)
        if self._g2 is None:
            self._g2, self._tr = g2, tr
        else:
            d = self.decay
            self._g2 = d * self._g2 + (1 - d) * g2
            self._tr = d * self._tr + (1 - d) * tr

    @property
    def value(self):
        """B_noise in samples; None before any measurement, inf when the
        gradient itself is not yet measurable."""
        if self._g2 is None:
            return None
        if self._g2 <= 0:
            return float("inf")
        return max(self._tr, 0.0) / self._g2


def _grad_sq(params):
    return float(sum(float((p.grad.detach().double() ** 2).sum()) for p in params if p.grad is not None))


class AdaptiveBatch:
    """The global batch size per world size, an opt-in (AdaptDL's
    co-adaptation, docs/agent.md "Adaptive batch size").

    The global batch follows the world size: ``world_size * per_gpu``
    samples per optimizer step, within ``[min_batch, max_batch]`` (the
    bounds the user trusts the model with), or what ``choose(world_size,
    noise_scale)`` returns (e.g. the batch of most goodput), clamped to the
    same bounds. The learning rate of every param group follows it
    (``scale_lr`` from the rates the optimizer had at ``base_batch``), and
    when a rank's share exceeds ``max_per_gpu`` (what fits in its memory)
    the step accumulates gradients over ``accum`` micro-batches of at most
    that size. ``step(loss_of)`` runs one optimizer step that way and feeds
    the gradient noise scale estimate (``noise``), which it reports with
    every batch change and through ``report()``.

        ab = fe.AdaptiveBatch(opt, base_batch=256, per_gpu=64, max_per_gpu=32,
                              min_batch=64, max_batch=2048, rule="sqrt")
        ab.follow(el)                            # after el.start and each step_done()
        sampler.batch_size = ab.local            # this rank's samples per step
    """

    def __init__(self, optimizer, base_batch, per_gpu=None, max_per_gpu=None, min_batch=None, max_batch=None,
                 rule="sqrt", choose=None):
        if base_batch < 1:
            raise ValueError("base_batch must be >= 1")
        scale_lr(1.0, 1, 1, rule)  # validates the rule
        self.optimizer = optimizer
        self.base_batch = int(base_batch)
        self.per_gpu = int(per_gpu or base_batch)
        self.max_per_gpu = int(max_per_gpu) if max_per_gpu else None
        self.min_batch = int(min_batch or 1)
        self.max_batch = int(max_batch) if max_batch else None
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise ValueError("max_batch %d < min_batch %d" % (self.max_batch, self.min_batch))
        self.rule = rule
        self.choose = choose
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.noise = NoiseScale()
        self.world_size = None
        self.batch = self.base_batch
        self.local = self.base_batch
        self.accum, self.micro = 1, self.base_batch

    def batch_for(self, world_size):
        """The global batch at world_size: a multiple of it within the bounds."""
        w = max(int(world_size), 1)
        want = w * self.per_gpu
        if self.choose is not None:
            want = int(self.choose(w, self.noise.value))
        want = max(want, self.min_batch)
        if self.max_batch is not None:
            want = min(want, self.max_batch)
        return max(want // w, 1) * w

    def update(self, world_size):
        """Set batch, local, accum, micro and the learning rates for
        world_size; True when the batch changed."""
        w = max(int(world_size), 1)
        b = self.batch_for(w)
        changed = (b != self.batch) or self.world_size is None
        self.world_size, self.batch = w, b
        self.local = b // w
        cap = self.max_per_gpu or self.local
        self.accum = -(-self.local // cap)
        self.micro = -(-self.local // self.accum)
        for g, lr in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = scale_lr(lr, self.base_batch, b, self.rule)
        if changed:
            _emit("adaptive_batch", **self.report())
        return changed

    def follow(self, el):
        """update(el.world_size): call after el.start and every step_done()."""
        return self.update(el.world_size)

    def step(self, loss_of, indices, params=None, reduce=None, no_sync=None):
        """One optimizer step over this rank's ``indices`` (``local`` of
        them): ``loss_of(idx)`` returns the mean loss of a micro-batch;
        gradients are accumulated over ``accum`` micro-batches (each
        weighted by its share). Under DDP pass ``no_sync=el.model.no_sync``
        so only the last micro-batch's backward all-reduces; without DDP,
        ``reduce(params)``, when given, averages the gradients across ranks.
        With ``accum`` >= 2 the noise scale is measured from the first
        micro-batch's (local) gradient and the step's. Returns the step's
        mean loss."""
        params = list(params if params is not None else
                      (p for g in self.optimizer.param_groups for p in g["params"]))
        self.optimizer.zero_grad()
        n = len(indices)
        total, first = 0.0, None
        for k in range(0, n, self.micro):
            idx = indices[k:k + self.micro]
            last = k + self.micro >= n
            loss = loss_of(idx) * (len(idx) / n)
            if no_sync is not None and not last:
                with no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += float(loss.detach())
            if first is None and not last:
                # The first micro-batch's gradient, scaled back to its own mean.
                first = (_grad_sq(params) * (n / len(idx)) ** 2, len(idx))
        if reduce is not None:
            reduce(params)
        if first is not None:
            self.noise.observe(first[0], first[1], _grad_sq(params), n * (self.world_size or 1))
        self.optimizer.step()
        return total

    def progress_fields(self):
        """The global batch and the measured noise scale for a progress
        report (``fleetd_progress.Reporter.report(step, ..., **ab.progress_fields())``):
        the agent forwards them and fleetd's allocator weighs each fleet
        size by the statistical efficiency of its batch. A noise scale not
        measured yet, or infinite (the gradient within its noise), is left
        out."""
        out = {"batch": self.batch}
        v = self.noise.value
        if v is not None and not math.isinf(v):
            out["noise_scale"] = v
        return out

    def report(self):
        """The batch state and the measured noise scale, as a dict (also
        emitted as an ``adaptive_batch`` event when the batch changes)."""
        out = {"world_size": self.world_size, "batch": self.batch, "local": self.local, "accum": self.accum,
               "lr": self.optimizer.param_groups[0]["lr"]}
        v = self.noise.value
        if v is not None and math.isinf(v):
            # JSON has no infinity: the gradient is within its noise.
            out["noise_dominated"] = True
        elif v is not None:
            out["noise_scale"] = v
        return out


class State:
    """What a member that lacks it (a joiner) is handed by a survivor: the
    model's state_dict, the optimizer's (one optimizer, or a list, e.g.
    SparseAdam for an embedding table and Adam for the rest), the completed
    step count, the sampler position and ``extra`` (anything picklable,
    small)."""

    def __init__(self, model, optimizer=None, sampler=None, step=0, extra=None):
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.step = int(step)
        self.extra = extra if extra is not None else {}

    @property
    def optimizers(self):
        if self.optimizer is None:
            return []
        if isinstance(self.optimizer, (list, tuple)):
            return list(self.optimizer)
        return [self.optimizer]


def _is_placeholder(v):
    return isinstance(v, tuple) and len(v) == 5 and v[0] == "__tensor__"


def _flat_tensors(tensors, bucket_bytes):
    """Split tensors into broadcast units: big ones alone, small ones of one
    dtype coalesced up to bucket_bytes."""
    units, small, size = [], [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if nbytes >= bucket_bytes // 4:
            units.append([t])
            continue
        if small and (small[0].dtype != t.dtype or small[0].device != t.device or size + nbytes > bucket_bytes):
            units.append(small)
            small, size = [], 0
        small.append(t)
        size += nbytes
    if small:
        units.append(small)
    return units


class Elastic:
    """One worker's membership of an elastic job; see the module docstring.

    backend: "gloo" (CPU) or "nccl" (one GPU per local rank; tensors for the
    collectives are put on cuda:LOCAL_RANK). timeout: seconds for forming a
    group and for every collective (a peer whose machine vanished without
    closing its connections is noticed after this). ddp_kwargs: passed to
    DistributedDataParallel. agree_timeout: how long the old group waits for
    every member's agent to announce the new round before the members
    without news are left behind. wait_timeout: how long a member waits for
    a new round after a collective failed (then it exits 3 and the agent
    takes over). save_on_failure: in restart mode, rank 0 checkpoints the
    last completed step when a collective fails (the step is consistent on
    every member), so a lost peer costs no step when rank 0 survives.
    """

    def __init__(self, backend=None, timeout=30.0, ddp_kwargs=None, agree_timeout=10.0, wait_timeout=600.0,
                 bucket_mb=32, install_sigterm=True, save_on_failure=False):
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() and os.environ.get("FLEETD_ELASTIC_BACKEND") != "gloo" else "gloo"
            backend = os.environ.get("FLEETD_ELASTIC_BACKEND", backend)
        self.backend = backend
        self.timeout = float(timeout)
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.agree_timeout = float(agree_timeout)
        self.wait_timeout = float(wait_timeout)
        self.bucket_bytes = int(bucket_mb * 2 ** 20)
        self.save_on_failure = bool(save_on_failure)
        self.mode = os.environ.get("FLEETD_ELASTIC", "") or MODE_RESTART
        self.channel = os.environ.get("FLEETD_ELASTIC_FILE", "") if self.mode == MODE_IN_PROCESS else ""
        if self.mode == MODE_IN_PROCESS and not self.channel:
            raise RuntimeError("FLEETD_ELASTIC=in-process without FLEETD_ELASTIC_FILE")
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        if backend == "nccl":
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.rank = int(os.environ.get("RANK", "0") or 0)
        self.world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.round = int(os.environ.get("FLEETD_ROUND", "0") or 0)
        self.run_id = os.environ.get("TORCHELASTIC_RUN_ID", "") or "none"
        self.model = None  # the DDP wrapper once started
        self.state = None
        self.has_state = False  # this process holds the job's state (trained, loaded or handed)
        self.sigterm = None
        self.rounds_joined = 0
        self._load = self._save = None
        self._ckpt_every = 0
        self._saved_step = None
        self._store = None
        self._next_store = None  # (round, TCPStore) opened ahead as the next round's master
        self._pending = None  # a join the old group trains on through (see reconfigure)
        self._graveyard = []  # broken groups kept referenced: their destructors may block
        self._group_sockets = set()  # (fd, inode) of the current group's TCP connections
        self._channel_seen = None  # (inode, mtime_ns, size) of the channel file last read
        self._news = None  # the newest channel message
        if install_sigterm:
            for s in (signal.SIGTERM, signal.SIGINT):
                signal.signal(s, self._on_signal)
        _emit("hello", protocol=PROTOCOL, mode=self.mode, pid=os.getpid(), local_rank=self.local_rank,
              rank=self.rank, world_size=self.world_size, round=self.round, backend=backend)

    # ---- signals -------------------------------------------------------

    def _on_signal(self, signum, frame):
        if self.sigterm is None:
            self.sigterm = signal.Signals(signum).name

    # ---- the channel ---------------------------------------------------

    def _read_channel(self):
        """The newest message in FLEETD_ELASTIC_FILE (cheap when unchanged:
        one stat)."""
        if not self.channel:
            return self._news
        try:
            st = os.stat(self.channel)
        except OSError:
            return self._news
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._channel_seen:
            return self._news
        try:
            with open(self.channel) as f:
                msg = json.load(f)
        except (OSError, ValueError):
            return self._news  # being replaced: read it next time
        self._channel_seen = key
        if isinstance(msg, dict) and msg.get("version") == PROTOCOL:
            self._news = msg
        return self._news

    def _newer(self):
        """A message about a round after the one this worker is in, or None."""
        m = self._read_channel()
        if m is None:
            return None
        if m.get("state") == "leave":
            return m
        if int(m.get("round", 0)) > self.round:
            return m
        return None

    def _wait_news(self, why, deadline=None):
        """Waits for an assignment of a later round (or leave); waiting
        messages keep it waiting without a deadline."""
        last_state = None
        while True:
            m = self._newer()
            if m is not None:
                st = m.get("state")
                if st in ("assigned", "leave"):
                    return m
                if st != last_state:
                    _emit("waiting", round=m.get("round"), state=st, reason=m.get("reason", ""), why=why)
                    last_state = st
                deadline = None  # the agent says a round is forming: wait for it
            if self.sigterm is not None:
                return {"state": "leave", "reason": "signal " + self.sigterm}
            if deadline is not None and _now() > deadline:
                return None
            time.sleep(0.005)

    # ---- groups ----------------------------------------------------------

    def _tensor(self, values, dtype=torch.float64):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _open_master_store(self, addr, port, world):
        return dist.TCPStore(addr, port, world, True, datetime.timedelta(seconds=self.timeout), False)

    def _probe(self, addr, port, deadline):
        """Waits until the master's store accepts connections: torch < 2.4's
        store client retries a refused connect only once a second."""
        while True:
            try:
                with socket.create_connection((addr, port), timeout=1.0):
                    return True
            except OSError:
                pass
            if _now() > deadline:
                return False
            if self.channel and self._newer() is not None and int(self._news.get("round", 0)) > self._joining:
                return False  # a later round replaced this one
            time.sleep(0.01)

    def _form(self, rank, world, addr, port, rnd):
        """Forms the default group of round rnd (the store is rank 0's)."""
        t = datetime.timedelta(seconds=self.timeout)
        if rank == 0:
            if self._next_store is not None and self._next_store[0] == rnd:
                store = self._next_store[1]
            else:
                store = self._open_master_store(addr, port, world)
        else:
            if not self._probe(addr, port, _now() + self.timeout):
                raise PeerFailure("the store of round %d at %s:%d did not answer" % (rnd, addr, port))
            store = dist.TCPStore(addr, port, world, False, t)
            if self.mode == MODE_IN_PROCESS and not self.has_state:
                store.add(self._ready_key(rnd), 1)  # survivors train on until every joiner got here
        self._next_store = None
        self._store = store
        prefix = dist.PrefixStore("fleetd/%s/%d" % (self.run_id, rnd), store)
        before = _tcp_sockets()
        try:
            dist.init_process_group(self.backend, store=prefix, rank=rank, world_size=world, timeout=t)
        finally:
            # The group's connections (gloo's full mesh): what abort shuts.
            self._group_sockets = _tcp_sockets() - before

    def _drop_group(self, broken):
        if broken and self._group_sockets:
            # Abort: peers blocked on this member fail now, not after the
            # timeout, and so do those blocked on them; the failure reaches
            # every survivor within milliseconds.
            n = _shutdown_sockets(self._group_sockets)
            _emit("aborted", round=self.round, rank=self.rank, sockets=n)
        self._group_sockets = set()
        if not dist.is_initialized():
            return
        if broken:
            # A group with a failed collective: keep it referenced so its
            # destructor (which may wait for a dead peer) never runs.
            try:
                self._graveyard.append(dist.distributed_c10d._get_default_group())
            except Exception:
                pass
        old = weakref.ref(self.model) if self.model is not None else None
        self.model = None
        if old is not None and old() is not None:
            gc.collect()  # the old DDP (its reducer's autograd hooks) must go before the next one
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        if broken:
            self._graveyard.append(self._store)
        self._store = None

    # ---- state -------------------------------------------------------------

    def _tensors_of(self, sd):
        return [v for v in sd.values() if torch.is_tensor(v)]

    def _opt_layout(self, opts):
        """The optimizers' state_dicts with tensors replaced by
        placeholders, and the tensors in order."""
        tensors = []
        metas = []
        for opt in opts:
            sd = opt.state_dict()
            state = {}
            for pid, ps in sd["state"].items():
                e = {}
                for k, v in ps.items():
                    if torch.is_tensor(v):
                        e[k] = ("__tensor__", len(tensors), tuple(v.shape), str(v.dtype).replace("torch.", ""),
                                v.device.type)
                        tensors.append(v)
                    else:
                        e[k] = v
                state[pid] = e
            metas.append({"state": state, "param_groups": sd["param_groups"]})
        return metas, tensors

    def _broadcast_state(self, src, group=None):
        """Hands the state of rank src to every member (model tensors in
        place, optimizer state rebuilt), by broadcast."""
        st = self.state
        start = _now()
        model_sd = st.model.state_dict()
        meta = None
        opt_tensors = []
        if self.rank == src:
            opt_meta, opt_tensors = self._opt_layout(st.optimizers)
            meta = {"step": st.step, "extra": st.extra, "opt": opt_meta,
                    "sampler": st.sampler.state_dict() if st.sampler is not None else None,
                    "model": [(k, tuple(v.shape)) for k, v in model_sd.items() if torch.is_tensor(v)]}
        box = [meta]
        dist.broadcast_object_list(box, src=src, group=group)
        meta = box[0]
        mine = [(k, tuple(v.shape)) for k, v in model_sd.items() if torch.is_tensor(v)]
        if mine != [(k, tuple(s)) for k, s in meta["model"]]:
            raise RuntimeError("the survivors' model has other parameters than this one")
        if len(meta["opt"]) != len(st.optimizers):
            raise RuntimeError("the survivors have %d optimizers, this worker %d" % (len(meta["opt"]), len(st.optimizers)))
        if self.rank != src:
            slots = {}
            for om in meta["opt"]:
                for e in om["state"].values():
                    for v in e.values():
                        if _is_placeholder(v):
                            dev = self.device if v[4] != "cpu" else torch.device("cpu")
                            slots[v[1]] = torch.empty(v[2], dtype=getattr(torch, v[3]), device=dev)
            opt_tensors = [slots[i] for i in range(len(slots))]
        tensors = self._tensors_of(model_sd) + list(opt_tensors)
        nbytes = 0
        for unit in _flat_tensors(tensors, self.bucket_bytes):
            nbytes += sum(t.numel() * t.element_size() for t in unit)
            if len(unit) == 1 and unit[0].is_contiguous() and unit[0].device.type == self.device.type:
                dist.broadcast(unit[0], src=src, group=group)
                continue
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in unit]) if len(unit) > 1 \
                else unit[0].detach().reshape(-1).to(self.device, copy=True)
            dist.broadcast(flat, src=src, group=group)
            if self.rank != src:
                off = 0
                for t in unit:
                    n = t.numel()
                    t.copy_(flat[off:off + n].view_as(t))
                    off += n
        if self.rank != src:
            for opt, om in zip(st.optimizers, meta["opt"]):
                sd = {"param_groups": om["param_groups"], "state": {}}
                for pid, e in om["state"].items():
                    sd["state"][pid] = {k: opt_tensors[v[1]] if _is_placeholder(v) else v for k, v in e.items()}
                opt.load_state_dict(sd)
            if meta["sampler"] is not None and st.sampler is not None:
                st.sampler.load_state_dict(meta["sampler"])
            st.step = int(meta["step"])
            st.extra = meta["extra"]
        took = max(_now() - start, 1e-9)
        return nbytes, took

    def _sync_state(self):
        """After a group formed: members that lack the newest state get it
        from a member that has it; nobody has it: rank 0 loads the
        checkpoint (load callback) and hands it to all."""
        st = self.state
        mine = self._tensor([1 if self.has_state else 0, st.step if self.has_state else -1], torch.int64)
        allv = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(allv, mine)
        allv = [(int(v[0]), int(v[1])) for v in allv]
        holders = [(r, s) for r, (h, s) in enumerate(allv) if h]
        loaded = None
        if not holders:
            src = 0
            if self.rank == 0 and self._load is not None:
                t0 = _now()
                loaded = bool(self._load(st))
                if loaded:
                    self._saved_step = st.step
                    _emit("loaded", round=self.round, rank=self.rank, step=st.step, took=_now() - t0)
            need = self.world_size > 1
            why = "checkpoint" if loaded else "initial"
        else:
            top = max(s for _, s in holders)
            src = min(r for r, s in holders if s == top)
            need = any(not h or s != top for h, s in allv)
            why = "joiners" if any(not h for h, _ in allv) else "behind"
        if need:
            if holders:
                members = sorted({src} | {r for r, (h, s) in enumerate(allv) if not h or s != allv[src][1]})
            else:
                members = list(range(self.world_size))
            group = None
            if len(members) < self.world_size:
                # Only the members that need the state (and the source)
                # take part: a broadcast costs more with every receiver.
                group = dist.new_group(ranks=members)
            if self.rank in members:
                nbytes, took = self._broadcast_state(src, group)
                _emit("synced", round=self.round, rank=self.rank, src=src, sent=self.rank == src, step=st.step,
                      bytes=nbytes, seconds=round(took, 4), mib_per_s=round(nbytes / took / 2 ** 20, 1), why=why,
                      receivers=len(members) - 1)
            if group is not None:
                dist.barrier()  # the others wait for the state to land
                try:
                    dist.destroy_process_group(group)
                except Exception:
                    pass
        self.has_state = True

    def _wrap(self):
        """Builds DDP around the model without its start-up broadcast (the
        state was just made equal on every member)."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        import torch.nn.parallel.distributed as ddp_mod
        kw = dict(self.ddp_kwargs)
        if self.device.type == "cuda":
            kw.setdefault("device_ids", [self.device.index])
        old = ddp_mod._sync_module_states if hasattr(ddp_mod, "_sync_module_states") else None
        try:
            import inspect
            if "init_sync" in inspect.signature(DDP.__init__).parameters:
                kw.setdefault("init_sync", False)
            elif old is not None:
                ddp_mod._sync_module_states = lambda *a, **k: None
            self.model = DDP(self.state.model, **kw)
        finally:
            if old is not None:
                ddp_mod._sync_module_states = old

    # ---- joining -----------------------------------------------------------

    def _apply_env(self, msg):
        """The round's worker environment (RANK, WORLD_SIZE, MASTER_*,
        FLEETD_ROUND, the per-round files) for this local rank."""
        for w in msg.get("workers", []):
            if int(w.get("local_rank", -1)) == self.local_rank:
                os.environ.update({str(k): str(v) for k, v in (w.get("env") or {}).items()})
                return
        raise RuntimeError("the agent's round %s has no worker with LOCAL_RANK=%d" % (msg.get("round"), self.local_rank))

    def _join(self, msg, why):
        """Forms the group of the round msg assigns, syncs the state and
        rebuilds DDP. msg None: the round of the environment."""
        t0 = _now()
        while True:
            if msg is not None:
                if msg.get("state") == "leave":
                    _emit("leave", round=self.round, rank=self.rank, step=self.state.step, reason=msg.get("reason", ""))
                    _hard_exit(0)
                self._apply_env(msg)
            a = msg["assignment"] if msg is not None else None
            rnd = int(a["round"]) if a else self.round
            rank = int(a["rank_offset"]) + self.local_rank if a else self.rank
            world = int(a["world_size"]) if a else self.world_size
            addr = a["master_addr"] if a else os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = int(a["master_port"]) if a else int(os.environ.get("MASTER_PORT", "29500"))
            self._joining = rnd
            try:
                self._form(rank, world, addr, port, rnd)
                self.rank, self.world_size, self.round = rank, world, rnd
                self._sync_state()
                self._wrap()
                break
            except Exception as e:
                if not is_peer_failure(e):
                    raise
                _emit("join-failed", round=rnd, rank=rank, error=str(e).splitlines()[0] if str(e) else repr(e))
                self._drop_group(broken=True)
                self.round = max(self.round, rnd) if self.mode == MODE_IN_PROCESS else self.round
                if self.mode != MODE_IN_PROCESS:
                    self._exit_peer("the group of round %d did not form: %s" % (rnd, e))
                msg = self._wait_news("the group of round %d did not form" % rnd, _now() + self.wait_timeout)
                if msg is None:
                    self._exit_peer("no new round within %ss after round %d failed to form" % (self.wait_timeout, rnd))
        self.rounds_joined += 1
        _emit("joined", round=self.round, rank=self.rank, world_size=self.world_size, step=self.state.step,
              took=round(_now() - t0, 4), why=why, master="%s:%s" % (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")))

    def _exit_peer(self, why):
        _emit("peer-lost", round=self.round, rank=self.rank, step=self.state.step if self.state else 0, why=why,
              exit_code=EXIT_PEER)
        _hard_exit(EXIT_PEER)

    # ---- the public API ----------------------------------------------------

    def start(self, state, load=None, save=None, ckpt_every=0):
        """Joins the job: forms the group of the current round and gets the
        state, from a survivor or (nobody has it) through load on rank 0.

        load(state) -> bool, on rank 0 only: load the newest checkpoint into
        state (model, optimizer, step, sampler, extra); False if there is
        none. save(state), on rank 0 only: write a checkpoint of state.
        ckpt_every: save every that many steps (0: never from here).
        """
        self.state = state
        self._load, self._save, self._ckpt_every = load, save, int(ckpt_every)
        msg = None
        if self.mode == MODE_IN_PROCESS:
            m = self._read_channel()
            if m is not None and int(m.get("round", 0)) >= self.round and m.get("state") in ("assigned", "leave"):
                msg = m  # the agent's newest word beats the environment it was started with
        self._join(msg, "start")
        return self

    def should_reconfigure(self):
        """Collective, at a step boundary: True when some member's agent
        announced a new round (or some member was signalled). Every member
        gets the same answer after the same step."""
        if self._pending is not None:
            return self._pending_step()
        news = self._newer() if self.mode == MODE_IN_PROCESS else None
        flags = self._tensor([float(news is not None), float(self.sigterm is not None)])
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        except RuntimeError as e:
            self.failed(e)
            return False
        if flags[1].item() > 0 and self.mode != MODE_IN_PROCESS:
            self._stop_for_signal()
        return flags[0].item() > 0 or flags[1].item() > 0

    def _pending_step(self):
        """A join is pending: at this boundary, switch once the new round's
        master sees every joiner registered on its store (or after
        wait_timeout); go back to a full reconfigure if the round changed
        again or a member was signalled."""
        p = self._pending
        newer = self._newer()
        changed = newer is not None and (int(newer.get("round", 0)) != p["round"] or newer.get("state") != "assigned")
        ready = False
        if self._next_store is not None and self._next_store[0] == p["round"]:
            try:
                ready = self._next_store[1].add(self._ready_key(p["round"]), 0) >= p["expected"]
            except RuntimeError:
                ready = True  # the store failed: switch, and let the new group's formation tell
        flags = self._tensor([float(changed), float(self.sigterm is not None),
                              float(ready or _now() - p["since"] > self.wait_timeout)])
        try:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        except RuntimeError as e:
            self._pending = None
            self.failed(e)
            return False
        if flags[0].item() > 0 or flags[1].item() > 0:
            self._pending = None
            return True  # a full reconfigure with the newest news
        if flags[2].item() > 0:
            self._pending = None
            _emit("joiners-ready", round=self.round, next_round=p["round"], step=self.state.step,
                  waited=round(_now() - p["since"], 4))
            self._switch(p["news"], True, False, self.round, self.rank, p["since"])
        return False

    def _ready_key(self, rnd):
        return "fleetd/%s/%d/joiners-ready" % (self.run_id, rnd)

    def step_done(self):
        """Ends a completed step: counts it, advances the sampler by the
        step's samples, checkpoints every ckpt_every steps (rank 0), and
        follows a membership change at this boundary."""
        st = self.state
        st.step += 1
        if st.sampler is not None:
            st.sampler.advance(self.world_size)
        if self._ckpt_every and st.step % self._ckpt_every == 0:
            self.checkpoint("periodic")
        if self.should_reconfigure():
            self.reconfigure()

    def checkpoint(self, reason):
        """Rank 0 saves (if a save callback was given and this step was not
        saved yet)."""
        if self.rank == 0 and self._save is not None and self._saved_step != self.state.step:
            t0 = _now()
            self._save(self.state)
            self._saved_step = self.state.step
            _emit("saved", round=self.round, step=self.state.step, reason=reason, took=round(_now() - t0, 4))
            return True
        return False

    def _stop_for_signal(self):
        """Restart mode, a member was signalled: checkpoint-on-notice. Rank
        0 saves this step; nobody exits before it is on disk; the signalled
        members confirm it in FLEETD_CHECKPOINT_DONE and exit 0, the others
        exit 3 unless their own signal follows within a second."""
        saved = self.checkpoint("stop")
        ok = self._tensor([float(saved or (self._saved_step == self.state.step and self._save is not None))])
        try:
            dist.broadcast(ok, src=0)
        except RuntimeError:
            ok[0] = 0
        deadline = _now() + 1.0
        while self.sigterm is None and _now() < deadline:
            time.sleep(0.02)
        if self.sigterm is None:
            self._exit_peer("a peer was stopped at step %d" % self.state.step)
        done = os.environ.get("FLEETD_CHECKPOINT_DONE")
        if ok.item() > 0 and done:
            _atomic_write(done, "%d\n" % self.state.step)
        _emit("stop", round=self.round, rank=self.rank, step=self.state.step, signal=self.sigterm,
              checkpointed=bool(ok.item() > 0))
        _hard_exit(0)

    def reconfigure(self):
        """After should_reconfigure() said so: agree with the old group on
        who stays, leave it at this step, and join the next round."""
        t0 = _now()
        old_round, old_rank, old_world = self.round, self.rank, self.world_size
        deadline = t0 + self.agree_timeout
        while True:
            news = self._newer()
            told = news is not None
            signalled = self.sigterm is not None
            leaving = signalled or (told and news.get("state") == "leave")
            # SUM of [told by the agent, leaving, signalled, gave up]
            v = self._tensor([float(told), float(leaving), float(signalled), float(_now() > deadline)])
            try:
                dist.all_reduce(v, op=dist.ReduceOp.SUM)
            except RuntimeError as e:
                return self.failed(e)
            n_told, n_leaving, n_signalled, gave_up = (int(x) for x in v.tolist())
            informed = n_told + n_signalled  # a member may count twice: bounded below
            # Done when every member knows its fate; at once when only
            # signals came (an agent's shutdown: its node leaves the
            # rendezvous only after its workers are gone, so the others'
            # news would wait for this very group).
            if informed >= old_world or gave_up or (n_told == 0 and n_signalled > 0):
                break
            time.sleep(0.003)
        everyone_leaves = n_leaving >= old_world
        _emit("agreed", round=old_round, rank=old_rank, step=self.state.step, leaving=leaving,
              members_leaving=n_leaving, members_told=n_told, took=round(_now() - t0, 4),
              next_round=news.get("round") if news else None)
        if everyone_leaves:
            # Nobody stays: the job's state survives only in a checkpoint.
            saved = self.checkpoint("leave")
            ok = self._tensor([float(saved or (self._save is not None and self._saved_step == self.state.step))])
            try:
                dist.broadcast(ok, src=0)
            except RuntimeError:
                ok[0] = 0
            done = os.environ.get("FLEETD_CHECKPOINT_DONE")
            if ok.item() > 0 and done:
                _atomic_write(done, "%d\n" % self.state.step)
            _emit("leave", round=old_round, rank=old_rank, step=self.state.step, checkpointed=bool(ok.item() > 0),
                  reason="every member leaves")
            _hard_exit(0)
        # The next round's rank 0 (a survivor whenever there is one: the
        # rendezvous ranks survivors first) opens its store while the old
        # group still stands, so nobody meets a closed port.
        if told and news.get("state") == "assigned" and not leaving:
            a = news["assignment"]
            if int(a["rank_offset"]) + self.local_rank == 0:
                try:
                    self._next_store = (int(a["round"]), self._open_master_store(
                        a["master_addr"], int(a["master_port"]), int(a["world_size"])))
                except RuntimeError as e:
                    _emit("warning", round=old_round, message="opening the next round's store failed: %s" % e)
        # A pure join (nobody leaves, every member told of the same round):
        # train on in the old group until the joiners are ready, so their
        # start (interpreter, model construction) costs the survivors
        # nothing; the switch comes at a later agreed step.
        if told and not leaving and n_leaving == 0 and n_signalled == 0 and news.get("state") == "assigned":
            a = news["assignment"]
            joiners = int(a["world_size"]) - old_world
            rr = self._tensor([float(a["round"]), -float(a["round"])])
            try:
                dist.all_reduce(rr, op=dist.ReduceOp.MAX)
            except RuntimeError as e:
                return self.failed(e)
            if joiners > 0 and rr[0].item() == -rr[1].item():
                self._pending = {"round": int(a["round"]), "news": news, "expected": joiners, "since": _now()}
                _emit("joiners-pending", round=old_round, next_round=int(a["round"]), step=self.state.step,
                      joiners=joiners)
                return self.model
        return self._switch(news, told, leaving, old_round, old_rank, t0)

    def _switch(self, news, told, leaving, old_round, old_rank, t0):
        """The agreed step: the old group's last barrier, then leave (exit
        0) or drop the group and join the next round."""
        t_agreed = _now()
        try:
            dist.barrier()
        except RuntimeError as e:
            if leaving:
                news = news or {}
            else:
                return self.failed(e)
        t_barrier = _now()
        if leaving:
            _emit("leave", round=old_round, rank=old_rank, step=self.state.step,
                  reason=(news or {}).get("reason", "") or ("excluded" if told else "signal %s" % self.sigterm))
            _hard_exit(0)
        self._drop_group(broken=False)
        t_dropped = _now()
        if not told or news.get("state") != "assigned":
            # Waiting for a round to form (no deadline while the agent says
            # one is forming), or not told yet.
            news = self._wait_news("round %d ended" % old_round, _now() + self.wait_timeout)
            if news is None:
                self._exit_peer("no new round within %ss" % self.wait_timeout)
        self._join(news, "new round")
        _emit("reconfigured", round=self.round, from_round=old_round, rank=self.rank, world_size=self.world_size,
              step=self.state.step, took=round(_now() - t0, 4), agree=round(t_agreed - t0, 4),
              barrier=round(t_barrier - t_agreed, 4), drop=round(t_dropped - t_barrier, 4),
              join=round(_now() - t_dropped, 4))
        return self.model

    def failed(self, exc):
        """Call with the RuntimeError a training step raised; anything but a
        failed collective is re-raised.

        In-process mode: the step is abandoned (its gradients dropped; the
        optimizer step was not taken) and the worker rejoins at its last
        completed step once its agent announces the next round; returns the
        new DDP model. Restart mode: the worker exits 0 if it was signalled
        (within a second), else 3 (a lost peer: the agent starts the next
        round); with save_on_failure, rank 0 first checkpoints the last
        completed step."""
        if not is_peer_failure(exc):
            raise exc
        msg = str(exc).splitlines()[0] if str(exc) else repr(exc)
        t0 = _now()
        old_round = self.round
        _emit("collective-failed", round=old_round, rank=self.rank, step=self.state.step if self.state else 0,
              error=msg)
        if self.mode != MODE_IN_PROCESS:
            if self.state is not None and self.save_on_failure:
                self.checkpoint("peer-lost")
            deadline = _now() + 1.0
            while self.sigterm is None and _now() < deadline:
                time.sleep(0.02)
            if self.sigterm is not None:
                _emit("stop", round=self.round, rank=self.rank, step=self.state.step if self.state else 0,
                      signal=self.sigterm, aborted=msg)
                _hard_exit(0)
            self._exit_peer(msg)
        self._drop_group(broken=True)
        if self.state is not None:
            for opt in self.state.optimizers:
                opt.zero_grad(set_to_none=True)
        news = self._wait_news("a collective failed", _now() + self.wait_timeout)
        if news is None:
            self._exit_peer("no new round within %ss after a collective failed" % self.wait_timeout)
        self._join(news, "after a failure")
        _emit("reconfigured", round=self.round, from_round=old_round, rank=self.rank, world_size=self.world_size,
              step=self.state.step, took=round(_now() - t0, 4), failure=True)
        return self.model

    def finish(self):
        """The run is complete: wait for every member, then release the
        group, its stores and the DDP wrapper now rather than in the
        interpreter's teardown (where their destructors run in no useful
        order)."""
        try:
            dist.barrier()
        except RuntimeError:
            pass
        self.model = None  # the DDP wrapper holds the group
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        self._store = self._next_store = None
        self._graveyard.clear()  # their connections were shut down when they broke
        gc.collect()
