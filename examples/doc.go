// Package examples holds the example training scripts fleetd runs in its
// demo, tests and benchmarks, and the tests that run them as real processes:
//
//   - trainer/train.py: a dependency-free (stdlib-only) data-parallel trainer
//     with its own TCP all-reduce, checkpoint/resume at any world size, drain
//     file and SIGTERM handling.
//   - pytorch/ddp_train.py: a plain torchrun-style PyTorch DDP script (gloo,
//     env://) that checkpoints and resumes the same way.
//
// There is no Go API here; docs/examples.md describes the scripts' contract.
package examples
