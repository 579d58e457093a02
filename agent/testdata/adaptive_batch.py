"""Checks fleetd_elastic.AdaptiveBatch with real PyTorch (agent/adaptive_test.go).

A linear regression trains through world sizes 1, 4, 2: each phase is a
real gloo group of that many processes (gradients averaged by all_reduce),
resuming the previous phase's model, optimizer, sampler and noise-scale
state from a file, as a restarted or reconfigured job would. Every rank
checks the global batch, its share, the accumulation and the learning rate
against the rule; rank 0 prints one JSON line per phase. Usage:
adaptive_batch.py HELPER_DIR STATE_DIR.
"""
import json
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, sys.argv[1])
import fleetd_elastic as fe  # noqa: E402

N, D, STEPS = 4096, 8, 40
BASE_LR, BASE_BATCH = 0.02, 32


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g)
    w = torch.randn(D, 1, generator=g)
    y = x @ w + 0.5 * torch.randn(N, 1, generator=g)
    return x, y


def phase(rank, world, state_dir, port):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    torch.manual_seed(0)
    x, y = data()
    model = torch.nn.Linear(D, 1)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    sampler = fe.ElasticSampler(N, batch_size=BASE_BATCH, seed=0)
    ab = fe.AdaptiveBatch(opt, base_batch=BASE_BATCH, per_gpu=64, max_per_gpu=16, min_batch=BASE_BATCH,
                          max_batch=192, rule="sqrt")
    path = os.path.join(state_dir, "state.pt")
    if os.path.exists(path):
        st = torch.load(path)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sampler.consumed = st["consumed"]
        ab.noise._g2, ab.noise._tr = st["noise"]
    ab.update(world)
    want = min(max(world * 64, BASE_BATCH), 192) // world * world
    assert ab.batch == want, (ab.batch, want)
    assert ab.local == want // world and ab.accum == math.ceil(ab.local / 16), (ab.local, ab.accum)
    lr = BASE_LR * math.sqrt(want / BASE_BATCH)
    assert abs(opt.param_groups[0]["lr"] - lr) < 1e-12, (opt.param_groups[0]["lr"], lr)
    sampler.batch_size = ab.local

    def allreduce(params):
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= world

    def loss_of(idx):
        return torch.nn.functional.mse_loss(model(x[idx]), y[idx])

    for _ in range(STEPS):
        ab.step(loss_of, sampler.indices(rank, world), reduce=allreduce)
        sampler.advance(world)
    with torch.no_grad():
        full = float(torch.nn.functional.mse_loss(model(x), y))
    # Every rank holds the same model: the all-reduce kept them in step.
    w = torch.cat([p.detach().flatten() for p in model.parameters()])
    ws = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    assert all(torch.allclose(ws[0], v) for v in ws), "replicas diverged"
    if rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "consumed": sampler.consumed,
                    "noise": (ab.noise._g2, ab.noise._tr)}, path)
        rep = ab.report()
        rep["loss"] = full
        # What a progress report forwards to fleetd's allocator.
        pf = ab.progress_fields()
        assert pf["batch"] == ab.batch and pf.get("noise_scale") == rep.get("noise_scale"), pf
        print(json.dumps(rep), flush=True)
    dist.destroy_process_group()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


if __name__ == "__main__":
    torch.set_num_threads(1)
    state_dir = sys.argv[2]
    x, y = data()
    with torch.no_grad():
        torch.manual_seed(0)
        print(json.dumps({"initial_loss": float(torch.nn.functional.mse_loss(torch.nn.Linear(D, 1)(x), y))}), flush=True)
    for world in (1, 4, 2):
        mp.spawn(phase, args=(world, state_dir, free_port()), nprocs=world, join=True)
