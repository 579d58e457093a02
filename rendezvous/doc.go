// Package rendezvous is fleetd's replacement for torchrun's c10d
// rendezvous, hosted in the control daemon so that losing any node never
// takes the job's coordination with it.
//
// Three layers:
//   - Machine: one fleet's round state machine. Pure and deterministic:
//     no goroutines, no I/O, the clock is passed in. The daemon and
//     `fleetd sim` drive the same code.
//   - Service: many fleets' machines behind a mutex each, real timers
//     armed from Machine.Next, long-poll watches woken by a channel closed
//     on every change, persistence through Store (a closed round is saved
//     before any agent sees it).
//   - Handler and Client: the agents' HTTP API under /v1/rendezvous/ and
//     its retrying client.
//
// The protocol is described in docs/rendezvous.md.
package rendezvous
