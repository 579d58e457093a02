#!/usr/bin/env python3
"""fleetd example: an ordinary torchrun-style PyTorch DDP script that checkpoints.

Nothing here is fleetd-specific except a few optional environment variables:
FLEETD_CHECKPOINT_URI (where to checkpoint; `--ckpt` works too),
FLEETD_DRAIN_FILE (checkpoint at once when it appears) and the
checkpoint-on-notice contract: on SIGTERM every rank stops after the same step,
rank 0 checkpoints it, and once it is saved each rank writes the step to
FLEETD_CHECKPOINT_DONE; FLEETD_RESUME_STEP names the step the next round should
find (lines marked "checkpoint on notice"). The process group is formed the
standard way (gloo, init_method="env://" from RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so the same file runs unmodified under `torchrun` and under
fleetd's agent. See docs/examples.md and docs/agent.md.

Exit codes: 0 finished, or stopped by SIGTERM/SIGINT after checkpointing;
1 unexpected error; 2 bad arguments or configuration; 3 a peer was lost or the
group could not form (the agent restarts the workers in a new round).
"""

import argparse
import datetime
import hashlib
import itertools
import json
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

# Progress reports (FLEETD_PROGRESS) through the optional helper next to the
# examples; without it the script trains the same, unreported.
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    from fleetd_progress import Reporter
except ImportError:
    Reporter = None
# The worker-contract skeleton the examples share (stdlib only, next to them).
from fleetd_trainer import (DONE_FILE, EXIT_ERROR, EXIT_OK, EXIT_PEER, EXIT_USAGE, PeerLost, StepEnd, StopFlag, add_common_args,
                            UsageError, atomic_save, atomic_write, await_own_signal, checkpoint_dir,
                            emit, env_default, hard_exit, read_checkpoint_request, read_drain_notice, write_error_file)

CKPT_FILE = "checkpoint.pt"
CKPT_FORMAT = "fleetd-example-ddp/1"


def parse_args(argv):
    p = argparse.ArgumentParser(description="fleetd example: elastic PyTorch DDP (gloo)")
    add_common_args(p)
    # Scaling knobs (docs/examples.md): simulated compute that shrinks with the
    # world size, and a world size beyond which throughput stops growing.
    p.add_argument("--sample-time", type=float, default=env_default("TRAIN_SAMPLE_TIME", 0.0, float),
                   help="extra seconds of simulated compute per sample of a rank's share of the batch, "
                        "so throughput grows with the world size (env TRAIN_SAMPLE_TIME)")
    p.add_argument("--scale-limit", type=int, default=env_default("TRAIN_SCALE_LIMIT", 0, int),
                   help="beyond this world size a step takes as long as at it (an extra sleep standing in "
                        "for communication that grows with the world size): throughput stops scaling; "
                        "0: off (env TRAIN_SCALE_LIMIT)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=64, help="global batch; each rank takes batch // WORLD_SIZE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=env_default("TRAIN_PG_TIMEOUT", 30.0, float),
                   help="process-group timeout in seconds, for init and every collective "
                        "(torch's default is 30 min; env TRAIN_PG_TIMEOUT)")
    p.add_argument("--peer-grace", type=float, default=1.0,
                   help="seconds to wait for our own SIGTERM after the group broke, before exiting 3")
    a = p.parse_args(argv)
    if a.steps < 0 or a.ckpt_every < 1 or a.batch < 1 or a.samples < 1 or a.dim < 1 or a.hidden < 1:
        raise UsageError("--steps must be >= 0; --ckpt-every, --batch, --samples, --dim, --hidden >= 1")
    if a.step_time < 0 or a.timeout <= 0 or a.resume_wait < 0 or a.sample_time < 0 or a.scale_limit < 0:
        raise UsageError("--step-time, --sample-time, --scale-limit and --resume-wait must be >= 0 and --timeout > 0")
    a.ckpt_dir = checkpoint_dir(a.ckpt)
    return a


def standalone_env():
    """`python3 ddp_train.py` without a launcher: a world of one."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)


def synthetic_dataset(samples, dim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim, generator=g)
    a = torch.randn(dim, generator=g) / dim ** 0.5
    y = torch.sin(2.0 * (x @ a)) + 0.5 * (x[:, 0] * x[:, 1]) + 0.05 * torch.randn(samples, generator=g)
    return TensorDataset(x, y.unsqueeze(1))


def param_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def atomic_torch_save(obj, path):
    atomic_save(path, lambda f: torch.save(obj, f), binary=True, sync_dir=False)


def atomic_write_text(path, text):
    atomic_write(path, text, sync_dir=False)


def resume_step():
    """Checkpoint on notice: the step the agent's last round confirmed
    (FLEETD_RESUME_STEP), or None."""
    v = os.environ.get("FLEETD_RESUME_STEP", "")
    try:
        return int(v) if v else None
    except ValueError:
        raise UsageError("environment FLEETD_RESUME_STEP=%r is not an integer" % v)


def load_checkpoint(args, want=None):
    """The checkpoint, waiting up to --resume-wait for one at step `want`
    or later (an object store may show a new file late)."""
    if not args.ckpt_dir:
        return None
    path = os.path.join(args.ckpt_dir, CKPT_FILE)
    deadline = time.monotonic() + args.resume_wait
    while True:
        ck = load_checkpoint_file(args, path)
        if want is None or (ck is not None and ck["step"] >= want) or time.monotonic() >= deadline:
            return ck
        time.sleep(0.1)


def load_checkpoint_file(args, path):
    if not os.path.exists(path):
        return None
    try:
        ck = torch.load(path, map_location="cpu")
    except Exception as e:
        raise UsageError("checkpoint %s is unreadable: %s" % (path, e))
    if not isinstance(ck, dict) or ck.get("format") != CKPT_FORMAT:
        raise UsageError("checkpoint %s is not a %s checkpoint" % (path, CKPT_FORMAT))
    cfg = ck.get("config", {})
    if (cfg.get("dim"), cfg.get("hidden")) != (args.dim, args.hidden):
        raise UsageError("checkpoint %s is for --dim %s --hidden %s, not %d/%d"
                         % (path, cfg.get("dim"), cfg.get("hidden"), args.dim, args.hidden))
    return ck


class Run(StepEnd):
    def __init__(self, args, stop):
        self.a = args
        self.stop = stop
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        torch.manual_seed(args.seed)
        self.model = MLP(args.dim, args.hidden)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        self.step = 0
        self.loss = None
        self.saved_step = -1
        self.drained = False
        self.drain_notice = None
        # Progress reports on rank 0 (a no-op elsewhere and outside fleetd).
        self.progress = Reporter(total_steps=args.steps) if Reporter else None
        self.samples = 0

    def report_progress(self, force=False):
        if self.progress is not None:
            self.progress.report(self.step, samples=self.samples, loss=self.loss, force=force)

    def simulated_step_time(self, per_rank):
        """--step-time, plus --sample-time per sample of this rank's share; past
        --scale-limit, a step lasts as long as at the limit."""
        t = self.a.step_time + per_rank * self.a.sample_time
        limit = self.a.scale_limit
        if limit and self.world_size > limit:
            t += self.a.sample_time * (max(1, self.a.batch // limit) - per_rank)
        return t

    def resume(self):
        """Rank 0 reads the checkpoint and hands it to everyone, so only the
        writer needs the storage; weights *and* momentum then match on every
        rank before DDP wraps the model."""
        payload = [None]
        want = resume_step()
        if self.rank == 0:
            ck = load_checkpoint(self.a, want)
            done = self.a.ckpt_dir != "" and os.path.exists(os.path.join(self.a.ckpt_dir, DONE_FILE))
            payload = [{"ckpt": ck, "done": done}]
        dist.broadcast_object_list(payload, src=0)
        ck, done = payload[0]["ckpt"], payload[0]["done"]
        if ck is not None:
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
            self.step = int(ck["step"])
            self.loss = ck.get("loss")
            self.saved_step = self.step
            emit("resume", rank=self.rank, world_size=self.world_size, step=self.step,
                 from_world_size=ck.get("world_size"), loss=self.loss, expected_step=want)
        if want is not None and self.step < want:
            emit("warning", rank=self.rank, step=self.step,
                 message="FLEETD_RESUME_STEP=%d, but the newest checkpoint found is at step %d: "
                         "%d steps are recomputed" % (want, self.step, want - self.step))
        return done or self.step >= self.a.steps

    def save(self, reason):
        if self.rank != 0 or not self.a.ckpt_dir or self.step == self.saved_step:
            return
        os.makedirs(self.a.ckpt_dir, exist_ok=True)
        path = os.path.join(self.a.ckpt_dir, CKPT_FILE)
        atomic_torch_save({
            "format": CKPT_FORMAT, "step": self.step, "loss": self.loss, "world_size": self.world_size,
            "time": time.time(), "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "run_id": os.environ.get("TORCHELASTIC_RUN_ID", ""),
            "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            "config": {"dim": self.a.dim, "hidden": self.a.hidden, "samples": self.a.samples,
                       "batch": self.a.batch, "lr": self.a.lr, "seed": self.a.seed},
        }, path)
        self.saved_step = self.step
        emit("checkpoint", rank=0, step=self.step, reason=reason, path=path)

    def confirm_saved(self):
        """Checkpoint on notice: nobody leaves before rank 0's checkpoint is
        on disk (the broadcast waits for rank 0, which sends after saving),
        then every rank tells the agent the step (FLEETD_CHECKPOINT_DONE)."""
        saved = torch.tensor([float(bool(self.a.ckpt_dir) and self.saved_step == self.step)])
        try:
            dist.broadcast(saved, src=0)
        except RuntimeError as e:
            emit("warning", rank=self.rank, step=self.step, message="checkpoint not confirmed: %s" % e)
            return
        if saved.item() > 0:
            done = os.environ.get("FLEETD_CHECKPOINT_DONE")
            if done:
                atomic_write_text(done, "%d\n" % self.step)
            emit("checkpointed", rank=self.rank, step=self.step, file=done)

    def write_done(self):
        if self.rank == 0 and self.a.ckpt_dir:
            atomic_write_text(os.path.join(self.a.ckpt_dir, DONE_FILE),
                              json.dumps({"step": self.step, "time": time.time(), "script": "ddp_train.py"}) + "\n")

    def check_drain(self):
        if self.drain_notice is None:
            self.drain_notice = read_drain_notice(os.environ.get("FLEETD_DRAIN_FILE", ""))
        return self.drain_notice is not None

    def train(self):
        """Returns False when the run is done, True when the group agreed to
        stop (some rank got SIGTERM). Raises PeerLost when a collective fails."""
        ds = synthetic_dataset(self.a.samples, self.a.dim, self.a.seed)
        sampler = DistributedSampler(ds, num_replicas=self.world_size, rank=self.rank, shuffle=True,
                                     seed=self.a.seed, drop_last=True)
        per_rank = max(1, self.a.batch // self.world_size)
        loader = DataLoader(ds, batch_size=per_rank, sampler=sampler, drop_last=True)
        steps_per_epoch = len(loader)
        if steps_per_epoch == 0:
            raise UsageError("--samples %d is too small for a per-rank batch of %d at WORLD_SIZE=%d"
                             % (self.a.samples, per_rank, self.world_size))
        ddp = DDP(self.model)
        loss_fn = nn.MSELoss()
        epoch, it = None, None
        pause = self.simulated_step_time(per_rank)
        self.samples = self.step * self.a.batch
        self.report_progress(force=True)  # where this round starts
        while self.step < self.a.steps:
            # The step number is the data position: epoch and batch follow from
            # it, so a resumed run (at any world size) continues the schedule.
            e, k = divmod(self.step, steps_per_epoch)
            if e != epoch:
                epoch = e
                sampler.set_epoch(epoch)
                it = itertools.islice(iter(loader), k, None)
            x, y = next(it)
            if pause > 0:
                time.sleep(pause)
            try:
                self.opt.zero_grad()
                loss = loss_fn(ddp(x), y)
                loss.backward()  # DDP all-reduces (averages) the gradients here
                # One small collective carries everyone's stop/drain flags and
                # the loss, so all ranks decide the same thing at the same step.
                flags = torch.tensor([float(self.stop.set), float(self.check_drain()), loss.item()])
                dist.all_reduce(flags, op=dist.ReduceOp.SUM)
            except RuntimeError as e:
                raise PeerLost(str(e).splitlines()[0] if str(e) else repr(e))
            self.opt.step()  # only after every collective of the step succeeded
            self.step += 1
            self.loss = flags[2].item() / self.world_size
            emit("step", step=self.step, world_size=self.world_size, rank=self.rank, loss=self.loss)
            self.samples += per_rank * self.world_size
            self.report_progress()
            end = self.after_step(self.rank, flags[0].item() > 0, flags[1].item() > 0)
            if end is not None:
                return self.end_run(end)
        return self.end_run("done")


def read_request():
    """Checkpoint on notice: why the agent's SIGTERM came (reason, leaving,
    deadline), if the request is for this round."""
    return read_checkpoint_request(os.environ.get("FLEETD_CHECKPOINT_REQUEST", ""), os.environ.get("FLEETD_ROUND"))


def fail(rank, step, exc, code):
    emit("error", rank=rank, step=step, error="%s: %s" % (type(exc).__name__, exc), exit_code=code)
    write_error_file(exc)
    hard_exit(code)


def main(argv):
    stop = StopFlag()
    stop.install()
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        args = parse_args(argv)
        want = resume_step()
        standalone_env()
    except UsageError as e:
        fail(rank, 0, e, EXIT_USAGE)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    emit("start", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
         local_rank=int(os.environ.get("LOCAL_RANK", rank)), group_rank=int(os.environ.get("GROUP_RANK", 0)),
         restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
         run_id=os.environ.get("TORCHELASTIC_RUN_ID", ""), node_id=os.environ.get("FLEETD_NODE_ID", ""),
         master="%s:%s" % (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")),
         ckpt_dir=args.ckpt_dir, steps=args.steps, pid=os.getpid(), torch=torch.__version__,
         resume_step=want)
    try:
        # A lost peer must fail fast, not hang for torch's default 30 minutes.
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout))
    except (RuntimeError, ValueError) as e:
        if stop.set:
            emit("stop", rank=rank, signal=stop.signal, step=0, aborted=str(e), exit_code=EXIT_OK)
            hard_exit(EXIT_OK)
        fail(rank, 0, PeerLost("init_process_group: %s" % e), EXIT_PEER)
    run = Run(args, stop)
    try:
        try:
            done = run.resume()
        except RuntimeError as e:
            raise PeerLost("resume broadcast: %s" % e)
        if not done and stop.set:
            emit("stop", rank=run.rank, signal=stop.signal, step=run.step, exit_code=EXIT_OK, request=read_request())
            hard_exit(EXIT_OK)
        stopped = False if done else run.train()
    except PeerLost as e:
        run.save("peer-lost")  # every completed step is consistent on every rank
        if await_own_signal(stop, 0 if stop.set else args.peer_grace):
            emit("stop", rank=run.rank, signal=stop.signal, step=run.step, aborted=str(e), exit_code=EXIT_OK,
                 request=read_request())
            hard_exit(EXIT_OK)
        fail(run.rank, run.step, e, EXIT_PEER)
    except UsageError as e:
        fail(run.rank, run.step, e, EXIT_USAGE)
    except Exception as e:
        traceback.print_exc()
        fail(run.rank, run.step, e, EXIT_ERROR)
    if stopped:
        if await_own_signal(stop, args.peer_grace):
            emit("stop", rank=run.rank, signal=stop.signal, step=run.step, exit_code=EXIT_OK, request=read_request())
            hard_exit(EXIT_OK)
        fail(run.rank, run.step, PeerLost("a peer was stopped at step %d" % run.step), EXIT_PEER)
    emit("done", rank=run.rank, world_size=run.world_size, step=run.step, loss=run.loss,
         params_sha256=param_digest(run.model), already=done)
    try:
        # Rank 0 hosts the store: let nobody leave while a peer still needs it.
        dist.barrier()
        dist.destroy_process_group()
    except RuntimeError:
        hard_exit(EXIT_OK)  # the run is complete and checkpointed; skip a teardown that may block
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
