package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/providers"
	"github.com/fleetd/fleetd/providers/providertest"
)

// outageProvider is the in-memory provider behind an API the test can
// break. Down: every call fails with a transient error before reaching the
// provider (MemProvider's hook). Lossy: Create reaches the provider and
// launches, but its answer is lost on the way back, and List and Get do not
// show instances launched since the outage began (cloud list APIs are
// eventually consistent): the case that turns a repeated, non-idempotent
// launch into a duplicate. It records every instance Create really made, by node id.
type outageProvider struct {
	*providertest.MemProvider
	lossy     atomic.Bool
	hideAfter atomic.Int64 // unix nanoseconds; 0: List and Get show everything

	mu       sync.Mutex
	launched map[string]map[string]bool // node id → instance ids
	creates  int
}

var errOutage = providers.Transient(errors.New("provider API unavailable (injected outage)"))

func newOutageProvider() *outageProvider {
	return &outageProvider{MemProvider: providertest.NewMemProvider(), launched: map[string]map[string]bool{}}
}

// setDown switches the plain outage on or off.
func (p *outageProvider) setDown(down bool) {
	if !down {
		p.MemProvider.SetHook(nil)
		return
	}
	p.MemProvider.SetHook(func(ctx context.Context, op providertest.Op, cfg providers.Config) error { return errOutage })
}

// setLossy starts or ends the lossy outage.
func (p *outageProvider) setLossy(lossy bool) {
	var from int64
	if lossy {
		from = time.Now().UnixNano()
	}
	p.hideAfter.Store(from)
	p.lossy.Store(lossy)
}

func (p *outageProvider) Create(ctx context.Context, cfg providers.Config, req providers.LaunchRequest) ([]providers.Instance, error) {
	out, err := p.MemProvider.Create(ctx, cfg, req)
	p.mu.Lock()
	p.creates++
	if err == nil {
		node := req.Tags[providers.TagNodeID]
		if p.launched[node] == nil {
			p.launched[node] = map[string]bool{}
		}
		for _, in := range out {
			p.launched[node][in.ID] = true
		}
	}
	p.mu.Unlock()
	if err == nil && p.lossy.Load() {
		return nil, errOutage
	}
	return out, err
}

func (p *outageProvider) hidden(in providers.Instance) bool {
	from := p.hideAfter.Load()
	return from != 0 && in.LaunchedAt.UnixNano() >= from
}

func (p *outageProvider) List(ctx context.Context, cfg providers.Config, tags map[string]string) ([]providers.Instance, error) {
	all, err := p.MemProvider.List(ctx, cfg, tags)
	var out []providers.Instance
	for _, in := range all {
		if !p.hidden(in) {
			out = append(out, in)
		}
	}
	return out, err
}

func (p *outageProvider) Get(ctx context.Context, cfg providers.Config, id string) (providers.Instance, error) {
	in, err := p.MemProvider.Get(ctx, cfg, id)
	if err == nil && p.hidden(in) {
		return providers.Instance{}, providers.NotFound(fmt.Errorf("no instance %q (yet)", id))
	}
	return in, err
}

// createCalls counts Create calls that got past the hook.
func (p *outageProvider) createCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creates
}

// duplicates returns the node ids that got more than one instance.
func (p *outageProvider) duplicates() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for node, ids := range p.launched {
		if len(ids) > 1 {
			out[node] = len(ids)
		}
	}
	return out
}

// startDaemonWith is startTestDaemon with a provider of the test's choice
// and reconcile parameters.
func startDaemonWith(t *testing.T, dataDir string, prov providers.Provider, mem *providertest.MemProvider, params reconcile.Params) *testDaemon {
	t.Helper()
	return launchTestDaemon(t, dataDir, staticProviders{providertest.MemName: prov}, mem, Options{Params: params})
}

// outageSpec is a 3-node fleet of the mem provider outside any project.
var outageSpec = projectSpec("train", "", 2, 3)

// TestProviderOutageNoDuplicateLaunches breaks the daemon↔provider API
// while a replacement is due: first every call fails, then launches go
// through but their answers are lost (and the daemon, blind, repeats
// them), and the daemon restarts in the middle of it. When the API comes
// back, the fleet converges to its 3 nodes with exactly one instance per
// node: every repeated launch reused its idempotency token.
func TestProviderOutageNoDuplicateLaunches(t *testing.T) {
	prov := newOutageProvider()
	dataDir := t.TempDir()
	params := reconcile.Params{RelaunchAfter: 300 * time.Millisecond, TerminateRetry: time.Second}
	td := startDaemonWith(t, dataDir, prov, prov.MemProvider, params)
	ctx := context.Background()
	td.apply(ctx, t, "train.hcl", outageSpec)
	waitFor(t, "3 booting nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 3 })
	joined := map[string]bool{}
	td.joinAll(t, "train", joined)
	waitFor(t, "3 running nodes", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeRunning) == 3 })
	defer func() {
		if t.Failed() {
			dumpEvents(t, td)
		}
	}()

	// Outage 1: the provider API is down. A spot notice arrives: the
	// replacement cannot launch, nothing can be listed or deleted.
	prov.setDown(true)
	victim := td.nodes(t, "train")[0]
	if code := td.agentCall(t, "train", victim.ID, "notice", api.NoticeRequest{Kind: "spot-interruption", Deadline: time.Now().Add(3 * time.Second), Source: "imds"}); code != http.StatusAccepted {
		t.Fatalf("notice: HTTP %d", code)
	}
	downFrom := prov.Calls(providertest.OpCreate)
	waitFor(t, "a replacement node record", 5*time.Second, func() bool { return len(td.nodes(t, "train")) == 4 })
	time.Sleep(1500 * time.Millisecond) // ~15 reconcile passes against a dead API
	if live := prov.Live(); live != 3 {
		t.Fatalf("%d live instances during the outage, want 3", live)
	}
	// A transient outage burns no node: nothing is failed or replaced twice.
	nodes := td.nodes(t, "train")
	if len(nodes) != 4 || countState(nodes, state.NodeFailed) != 0 {
		for _, n := range nodes {
			t.Logf("node %s %s: %s", n.ID, n.State, n.Reason)
		}
		t.Fatalf("after the outage: %d node records, %d failed; want 4 and 0", len(nodes), countState(nodes, state.NodeFailed))
	}
	downCreates := prov.Calls(providertest.OpCreate) - downFrom

	// Outage 2: launches reach the provider but their answers are lost,
	// and the new instance stays invisible to List for a while: the daemon
	// sees no instance and repeats the launch, with the same token.
	prov.setDown(false)
	prov.setLossy(true)
	lossyFrom := prov.createCalls()
	waitFor(t, "repeated launches with lost answers", 10*time.Second, func() bool { return prov.createCalls() >= lossyFrom+3 })

	// The daemon restarts in the middle of it.
	td.stop()
	td = startDaemonWith(t, dataDir, prov, prov.MemProvider, params)
	restartFrom := prov.createCalls()
	waitFor(t, "launches repeated by the restarted daemon", 10*time.Second, func() bool { return prov.createCalls() >= restartFrom+2 })
	if d := prov.duplicates(); len(d) > 0 {
		t.Fatalf("duplicate instances during the outage: %v", d)
	}
	lossyCreates := prov.createCalls() - lossyFrom

	// The API is back: the fleet converges without a second instance.
	backFrom := prov.createCalls()
	prov.setLossy(false)
	waitFor(t, "the replacement booting", 10*time.Second, func() bool { return countState(td.nodes(t, "train"), state.NodeBooting) == 1 })
	// The agents of the restarted daemon's nodes join again, like real ones.
	td.joinAll(t, "train", map[string]bool{})
	waitFor(t, "3 running nodes and the victim gone", 15*time.Second, func() bool {
		nodes := td.nodes(t, "train")
		return countState(nodes, state.NodeRunning) == 3 && prov.Live() == 3
	})
	// Settle: a few more passes launch nothing.
	settled := prov.createCalls()
	time.Sleep(time.Second)
	if n := prov.createCalls(); n != settled {
		t.Fatalf("%d launches after converging", n-settled)
	}
	if d := prov.duplicates(); len(d) > 0 {
		t.Fatalf("duplicate instances: %v", d)
	}
	// Every live instance belongs to exactly one live node record.
	insts, err := prov.MemProvider.List(ctx, providers.Config{Fleet: "train"}, map[string]string{providers.TagFleet: "train"})
	if err != nil {
		t.Fatal(err)
	}
	byInstance := map[string]string{}
	for _, n := range td.nodes(t, "train") {
		if n.InstanceID != "" && reconcile.Live(n.State) {
			byInstance[n.InstanceID] = n.ID
		}
	}
	for _, in := range insts {
		if byInstance[in.ID] != in.Tags[providers.TagNodeID] {
			t.Errorf("instance %s (node tag %s) is not the instance of a live node record", in.ID, in.Tags[providers.TagNodeID])
		}
	}
	t.Logf("provider outage: %d Create calls while the API was down, %d with lost answers (daemon restarted meanwhile), %d after it came back; %d instances launched in all, none twice",
		downCreates, lossyCreates, prov.createCalls()-backFrom, launchedCount(prov))
}

func launchedCount(p *outageProvider) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, ids := range p.launched {
		n += len(ids)
	}
	return n
}
