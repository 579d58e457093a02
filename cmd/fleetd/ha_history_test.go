package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/fleetd/fleetd/fleet/api"
)

// linSpec is a fleet that never launches (no local type has 8 GPUs): a
// register whose value is the generation apply bumps, for the
// linearizability check of the API across failovers.
const linSpec = `
fleet "lin" {
  min_nodes = 1
  max_nodes = 1
  node { gpus = 8 }
  provider "local" {
    zones = ["local-a"]
  }
  training {
    command = ["sleep", "600"]
    env     = { V = %q }
  }
}
`

// apiOp is one operation of the recorded history.
type apiOp struct {
	write bool
	value string
}

// apiResult: the generation seen, or unknown (the call failed: a write may
// or may not have happened).
type apiResult struct {
	gen     int64
	unknown bool
}

// apiHistory records API calls made by several clients against a cluster.
type apiHistory struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
}

func (h *apiHistory) add(client int, in apiOp, call time.Time, out apiResult, ret time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call.Sub(h.start).Nanoseconds(), Output: out, Return: ret.Sub(h.start).Nanoseconds()})
}

// generationModel: writes (applies with a new value) bump the generation by
// one and return it; reads return it. A failed write may or may not have
// applied; a failed read says nothing.
var generationModel = porcupine.NondeterministicModel{
	Init: func() []interface{} { return []interface{}{int64(0)} },
	Step: func(state, input, output interface{}) []interface{} {
		g, in, out := state.(int64), input.(apiOp), output.(apiResult)
		switch {
		case in.write && out.unknown:
			return []interface{}{g, g + 1}
		case in.write:
			if out.gen == g+1 {
				return []interface{}{out.gen}
			}
			return nil
		case out.unknown:
			return []interface{}{g}
		case out.gen == g:
			return []interface{}{g}
		}
		return nil
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(apiOp), output.(apiResult)
		if in.write {
			return fmt.Sprintf("apply(%s) → %v", in.value, out)
		}
		return fmt.Sprintf("get → %v", out)
	},
}

// runClients runs n clients, each against the whole cluster (the CLI's
// failover), alternating applies and reads of the "lin" fleet until stop
// is closed. A client never has two calls in flight.
func runClients(t *testing.T, addrs, token string, n int, h *apiHistory, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for c := range n {
		client, err := api.NewClient(addrs, api.ClientOptions{Token: token, Timeout: 4 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				call := time.Now()
				if rng.IntN(3) == 0 {
					v := fmt.Sprintf("c%d-%d", c, i)
					resp, err := client.Apply(ctx, api.ApplyRequest{Filename: "lin.hcl", Source: fmt.Sprintf(linSpec, v), SkipCheck: true})
					switch {
					case err == nil && len(resp.Fleets) == 1:
						h.add(c, apiOp{write: true, value: v}, call, apiResult{gen: resp.Fleets[0].Generation}, time.Now())
					case err != nil && notApplied(err):
						// Refused before anything was written: not an operation.
					default:
						h.add(c, apiOp{write: true, value: v}, call, apiResult{unknown: true}, time.Now())
					}
				} else {
					d, err := client.Fleet(ctx, "lin")
					var he *api.HTTPError
					switch {
					case err == nil:
						h.add(c, apiOp{}, call, apiResult{gen: d.Generation}, time.Now())
					case errors.As(err, &he) && he.StatusCode == 404:
						h.add(c, apiOp{}, call, apiResult{gen: 0}, time.Now())
					default:
						h.add(c, apiOp{}, call, apiResult{unknown: true}, time.Now())
					}
				}
				cancel()
				time.Sleep(time.Duration(100+rng.IntN(100)) * time.Millisecond)
			}
		}()
	}
	return &wg
}

// notApplied reports an apply that certainly wrote nothing: no server
// could be reached, a follower had no leader to forward to (503), or the
// store refused a deposed leader's write (fenced). Anything else — a
// timeout, a forwarding failure after the request left — may have applied.
func notApplied(err error) bool {
	var he *api.HTTPError
	if errors.As(err, &he) {
		return he.StatusCode == 503 || strings.Contains(he.Body.Error, "fenced")
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// check verifies the history is linearizable and returns how many
// operations it held and how many had a known outcome.
func (h *apiHistory) check(t *testing.T) (ops, known int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	// A write whose call failed may still take effect later (a timeout
	// after the leader got it): it stays open until the end of the history.
	var end int64
	for _, op := range h.ops {
		end = max(end, op.Return)
	}
	for i, op := range h.ops {
		if op.Output.(apiResult).unknown {
			if op.Input.(apiOp).write {
				h.ops[i].Return = end + 1
			}
			continue
		}
		known++
	}
	res, _ := porcupine.CheckOperationsVerbose(generationModel.ToModel(), h.ops, time.Minute)
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		t.Errorf("the API history of %d operations is not linearizable", len(h.ops))
	default:
		t.Errorf("linearizability check of %d operations timed out", len(h.ops))
	}
	return len(h.ops), known
}
