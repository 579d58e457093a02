#!/usr/bin/env python3
"""fleetd example: PyTorch DDP whose workers survive membership changes.

The same job as ddp_train.py, written against fleetd's elastic helper
(fleetd_elastic, docs/agent.md "In-process elastic mode"). Under
`training { elastic = "in-process" }` the workers stay alive when nodes leave
or join: they leave the old process group after a step all members agree on,
form the new one, and a joiner is handed the model, the optimizer state, the
step and the sampler position by a survivor instead of reading a checkpoint.
In restart mode (the default) and under torchrun it behaves like any torchrun
script: rank 0 loads the checkpoint and broadcasts it, and a SIGTERM stops
every rank after the same step with a checkpoint (checkpoint on notice).

The data position is an ElasticSampler: a stream of per-epoch permutations,
`--batch` samples per rank per step, so no sample is seen twice or skipped
within an epoch whatever the world sizes were.

Exit codes: 0 finished, or left the job (notice, SIGTERM); 1 unexpected
error; 2 bad arguments; 3 a peer was lost and no new round came.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import traceback

try:
    import fleetd_elastic as fe
except ImportError:  # a checkout: the helper lives in agent/ (the agent puts it on PYTHONPATH)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "agent"))
    import fleetd_elastic as fe

import torch
import torch.nn as nn

# The event lines the example trainers share (examples/fleetd_trainer.py).
sys.path.append(os.path.join(os.path.dirname(os.path.realpath(__file__)), ".."))
from fleetd_trainer import emit  # noqa: E402

CKPT_FILE = "checkpoint.pt"
DONE_FILE = "DONE"
CKPT_FORMAT = "fleetd-example-elastic/1"


def parse_args(argv):
    p = argparse.ArgumentParser(description="fleetd example: elastic PyTorch DDP with in-process membership changes")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds of simulated compute per step")
    p.add_argument("--ckpt", default=os.environ.get("FLEETD_CHECKPOINT_URI", ""), help="checkpoint directory")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--arch", choices=["mlp", "embedding"], default="mlp",
                   help="mlp: dense layers; embedding: an EmbeddingBag table (--vocab rows of --dim) and a small "
                        "head, like a recommendation model (the table holds the state, a step costs little compute)")
    p.add_argument("--vocab", type=int, default=1000, help="embedding rows (--arch embedding)")
    p.add_argument("--tokens", type=int, default=8, help="tokens per sample (--arch embedding)")
    p.add_argument("--sparse", action="store_true",
                   help="--arch embedding: sparse table gradients, SparseAdam for the table (dense moments: the "
                        "state is as large as with Adam) and --optimizer for the head")
    p.add_argument("--state-mib", type=float, default=0,
                   help="size the model so that parameters plus optimizer state are about this many MiB "
                        "(overrides --hidden, or --vocab with --arch embedding)")
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for group formation and collectives")
    p.add_argument("--log-samples", action="store_true", help="print each step's sample indices (tests)")
    p.add_argument("--dump", default="", help="rank 0 writes the final parameters here as JSON (tests)")
    p.add_argument("--backend", default="gloo")
    p.add_argument("--save-on-failure", action="store_true",
                   help="restart mode: rank 0 checkpoints when a collective fails (a lost peer then costs no step)")
    a = p.parse_args(argv)
    if a.steps < 0 or a.ckpt_every < 0 or a.batch < 1 or a.samples < 1:
        p.error("--steps and --ckpt-every must be >= 0, --batch and --samples >= 1")
    if a.ckpt.startswith("file://"):
        a.ckpt = a.ckpt[len("file://"):]
    elif "://" in a.ckpt:
        p.error("--ckpt: only local paths and file:// URLs")
    return a


class MLP(nn.Module):
    def __init__(self, dim, hidden, layers):
        super().__init__()
        mods = [nn.Linear(dim, hidden), nn.ReLU()]
        for _ in range(max(layers - 1, 0)):
            mods += [nn.Linear(hidden, hidden), nn.ReLU()]
        mods.append(nn.Linear(hidden, 1))
        self.net = nn.Sequential(*mods)

    def forward(self, x):
        return self.net(x)


class EmbedNet(nn.Module):
    def __init__(self, vocab, dim, hidden, sparse=False):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="mean", sparse=sparse)
        self.head = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, tokens):
        return self.head(self.emb(tokens))


def state_copies(optimizer):
    return 3 if optimizer == "adam" else 2  # parameters, momentum (SGD) or two moments (Adam, SparseAdam)


def vocab_for(state_mib, dim, optimizer):
    return max(16, int(state_mib * 2 ** 20 / 4 / state_copies(optimizer) / dim))


def hidden_for(state_mib, layers, optimizer):
    """The hidden width whose parameters plus optimizer state (SGD with
    momentum: 2 copies, Adam: 3) come to about state_mib."""
    params = state_mib * 2 ** 20 / 4 / state_copies(optimizer)
    return max(8, int((params / max(layers - 1, 1)) ** 0.5))


def token_dataset(samples, tokens, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (samples, tokens), generator=g)
    y = torch.sin((x % 97).float().mean(1) / 10.0) + 0.05 * torch.randn(samples, generator=g)
    return x, y.unsqueeze(1)


def dataset(samples, dim, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, dim, generator=g)
    a = torch.randn(dim, generator=g) / dim ** 0.5
    y = torch.sin(2.0 * (x @ a)) + 0.5 * (x[:, 0] * x[:, 1]) + 0.05 * torch.randn(samples, generator=g)
    return x, y.unsqueeze(1)


def digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


class Checkpoints:
    """Rank 0's checkpoint file (load and save are the helper's callbacks)."""

    def __init__(self, args):
        self.a = args
        self.bytes_read = 0

    def path(self):
        return os.path.join(self.a.ckpt, CKPT_FILE)

    def load(self, state):
        want = os.environ.get("FLEETD_RESUME_STEP", "")
        if not self.a.ckpt or not os.path.exists(self.path()):
            return False
        deadline = time.monotonic() + (10.0 if want else 0.0)
        while True:
            size = os.path.getsize(self.path())
            ck = torch.load(self.path(), map_location="cpu")
            if not want or ck["step"] >= int(want) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if ck.get("format") != CKPT_FORMAT:
            raise SystemExit("checkpoint %s is not a %s checkpoint" % (self.path(), CKPT_FORMAT))
        self.bytes_read += size
        state.model.load_state_dict(ck["model"])
        for opt, sd in zip(state.optimizers, ck["optimizer"]):
            opt.load_state_dict(sd)
        state.sampler.load_state_dict(ck["sampler"])
        state.step = int(ck["step"])
        state.extra = ck.get("extra", {})
        emit("resume", step=state.step, bytes=size, from_world_size=ck.get("world_size"),
             expected_step=int(want) if want else None)
        return True

    def save(self, state, world_size=None):
        if not self.a.ckpt:
            return
        os.makedirs(self.a.ckpt, exist_ok=True)
        tmp = os.path.join(self.a.ckpt, ".%s.tmp-%d" % (CKPT_FILE, os.getpid()))
        with open(tmp, "wb") as f:
            torch.save({"format": CKPT_FORMAT, "step": state.step, "model": state.model.state_dict(),
                        "optimizer": [o.state_dict() for o in state.optimizers], "sampler": state.sampler.state_dict(),
                        "extra": state.extra, "world_size": world_size, "time": time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path())
        emit("checkpoint", step=state.step, path=self.path())


def main(argv):
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    if "RANK" not in os.environ:  # standalone: a world of one
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
        s.close()
    el = fe.Elastic(backend=args.backend, timeout=args.timeout, save_on_failure=args.save_on_failure)
    emit("start", rank=el.rank, world_size=el.world_size, local_rank=el.local_rank, mode=el.mode, pid=os.getpid(),
         node_id=os.environ.get("FLEETD_NODE_ID", ""), round=el.round, torch=torch.__version__,
         resume_step=os.environ.get("FLEETD_RESUME_STEP"))
    torch.manual_seed(args.seed)
    if args.arch == "embedding":
        hidden = args.hidden
        vocab = vocab_for(args.state_mib, args.dim, "adam" if args.sparse else args.optimizer) if args.state_mib > 0 else args.vocab
        model = EmbedNet(vocab, args.dim, hidden, sparse=args.sparse)
        x, y = token_dataset(args.samples, args.tokens, vocab, args.seed)
    else:
        hidden = hidden_for(args.state_mib, args.layers, args.optimizer) if args.state_mib > 0 else args.hidden
        model = MLP(args.dim, hidden, args.layers)
        x, y = dataset(args.samples, args.dim, args.seed)
    def make_opt(params):
        if args.optimizer == "adam":
            return torch.optim.Adam(params, lr=args.lr)
        return torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    if args.arch == "embedding" and args.sparse:
        opts = [torch.optim.SparseAdam(list(model.emb.parameters()), lr=args.lr), make_opt(model.head.parameters())]
    else:
        opts = [make_opt(model.parameters())]
    sampler = fe.ElasticSampler(args.samples, args.batch, seed=args.seed)
    state = fe.State(model, opts, sampler)
    ck = Checkpoints(args)
    el.start(state, load=ck.load, save=lambda st: ck.save(st, el.world_size), ckpt_every=args.ckpt_every)
    nparams = sum(p.numel() for p in model.parameters())
    emit("ready", rank=el.rank, world_size=el.world_size, step=state.step, params=nparams, hidden=hidden,
         round=el.round, consumed=sampler.consumed, state_mib=round(nparams * 4 * state_copies(args.optimizer) / 2 ** 20, 1))
    loss_fn = nn.MSELoss()
    while state.step < args.steps:
        idx = sampler.indices(el.rank, el.world_size)
        consumed = sampler.consumed
        began = time.time()
        if args.step_time > 0:
            time.sleep(args.step_time)
        try:
            for opt in opts:
                opt.zero_grad()
            loss = loss_fn(el.model(x[idx]), y[idx])
            loss.backward()  # DDP averages the gradients over the world here
            for opt in opts:
                opt.step()
        except RuntimeError as e:
            el.failed(e)  # a peer died: rejoin at the last completed step
            continue
        rec = {"step": state.step + 1, "world_size": el.world_size, "rank": el.rank, "round": el.round,
               "loss": loss.item(), "consumed": consumed, "began": began}
        if args.log_samples:
            rec["samples"] = idx
        emit("step", **rec)
        el.step_done()
    if el.rank == 0 and args.ckpt:
        el.checkpoint("done")
        with open(os.path.join(args.ckpt, DONE_FILE), "w") as f:
            f.write(json.dumps({"step": state.step, "time": time.time()}) + "\n")
    if el.rank == 0 and args.dump:
        with open(args.dump, "w") as f:
            json.dump({"step": state.step, "consumed": sampler.consumed,
                       "params": [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]}, f)
    emit("done", rank=el.rank, world_size=el.world_size, step=state.step, params_sha256=digest(model),
         bytes_read=ck.bytes_read, rounds=el.rounds_joined)
    el.finish()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except Exception:
        traceback.print_exc()
        sys.exit(1)
