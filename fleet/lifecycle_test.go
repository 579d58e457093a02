package fleet

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/cluster"
	"github.com/fleetd/fleetd/fleet/reconcile"
	"github.com/fleetd/fleetd/fleet/state"
	"github.com/fleetd/fleetd/fleet/state/etcdtest"
	"github.com/fleetd/fleetd/providers"
	awsprov "github.com/fleetd/fleetd/providers/aws"
	"github.com/fleetd/fleetd/providers/aws/fakeec2"
)

// The lifecycle model test: seeded random sequences of what operators and
// clouds do to fleets — apply, resize, destroy, re-create a name, restart a
// daemon, restore a daemon's state from an older backup, kill an instance,
// send a spot notice — run by two daemons sharing one fake EC2 account
// (which honours ClientToken) with fleets of the same names. After every
// step, once the daemons have settled, the invariants of fleet identity
// must hold (see lifecycle.check). A failure prints the seed and the steps
// so far; -lifecycle.seed=S -lifecycle.seqs=1 replays it.
var (
	lifecycleSeqs  = flag.Int("lifecycle.seqs", 0, "lifecycle model test: sequences (0: 3, or 12 with FLEETD_CHAOS_LONG=1)")
	lifecycleSteps = flag.Int("lifecycle.steps", 0, "lifecycle model test: steps per sequence (0: 20, or 40 with FLEETD_CHAOS_LONG=1)")
	lifecycleSeed  = flag.Uint64("lifecycle.seed", 0, "lifecycle model test: seed of the first sequence (0: from the clock, printed)")
)

func TestLifecycleModel(t *testing.T) {
	seqs, steps := 3, 20
	if os.Getenv("FLEETD_CHAOS_LONG") == "1" {
		seqs, steps = 12, 40
	}
	if *lifecycleSeqs > 0 {
		seqs = *lifecycleSeqs
	}
	if *lifecycleSteps > 0 {
		steps = *lifecycleSteps
	}
	seed := *lifecycleSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1e6)
	}
	var total lifecycleFigures
	for i := range seqs {
		s := seed + uint64(i)
		var f lifecycleFigures
		// Every other sequence adds a third daemon: two servers on etcd
		// whose leader fails over.
		ha := i%2 == 1 && !testing.Short()
		t.Run(fmt.Sprintf("seed=%d,ha=%v", s, ha), func(t *testing.T) { f = runLifecycle(t, s, steps, ha) })
		total.add(f)
		if t.Failed() {
			break
		}
	}
	t.Logf("lifecycle model: %d sequences from seed %d, %d steps (%s), %d invariant checks, %d instances launched, %d node ids, %d incarnations",
		seqs, seed, total.steps, total.opSummary(), total.checks, total.instances, total.nodeIDs, total.incarnations)
}

type lifecycleFigures struct {
	steps, checks, instances, nodeIDs, incarnations int
	ops                                             map[string]int
}

func (f *lifecycleFigures) add(g lifecycleFigures) {
	f.steps += g.steps
	f.checks += g.checks
	f.instances += g.instances
	f.nodeIDs += g.nodeIDs
	f.incarnations += g.incarnations
	if f.ops == nil {
		f.ops = map[string]int{}
	}
	for k, v := range g.ops {
		f.ops[k] += v
	}
}

func (f lifecycleFigures) opSummary() string {
	keys := make([]string, 0, len(f.ops))
	for k := range f.ops {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, f.ops[k]))
	}
	return strings.Join(parts, ", ")
}

// lcDaemon is one daemon of the model: its data dir outlives restarts.
// A clustered one is two servers on one etcd (one daemon id); td is its
// leader.
type lcDaemon struct {
	name   string
	dir    string
	backup string // a copy of state.db taken by a "backup" step
	td     *testDaemon
	id     string

	cluster *cluster.Config
	servers []*testDaemon
	dirs    []string
}

type lifecycle struct {
	t      *testing.T
	ec2    *fakeec2.Server
	url    string
	ds     []*lcDaemon
	r      *rand.Rand
	log    []string
	fig    lifecycleFigures
	params reconcile.Params

	// What the whole run has seen, for the invariants that span steps.
	nodeInc   map[string]string    // daemon/fleet/node → incarnation that minted it
	nodeBorn  map[string]time.Time // daemon/fleet/node → record CreatedAt
	incs      map[string]bool      // daemon/fleet/incarnation
	spend     map[string]float64   // daemon/fleet → last fleetd_spend_usd_total
	instances map[string]bool
}

const lcSpec = `
fleet %q {
  min_nodes = %d
  max_nodes = %d
  node {
    gpus      = 1
    gpu_types = ["V100"]
  }
  placement {
    colocate = "region"
    # Notices and deaths back spot zones off; on-demand keeps the model
    # at its size instead of waiting out the back-off.
    on_demand_fallback = "after 1s below min_nodes"
  }
  provider "aws" {
    regions        = ["us-east-1"]
    instance_types = ["p3.2xlarge"]
    image          = "ami-0123456789abcdef0"
    endpoint       = %q
    profile        = %q
  }
  training {
    command     = ["python3", "train.py"]
    drain_grace = "1s"
  }
}`

var lcFleets = []string{"demo", "exp"}

func runLifecycle(t *testing.T, seed uint64, steps int, withHA bool) lifecycleFigures {
	awsTestEnv(t)
	creds := filepath.Join(t.TempDir(), "credentials")
	if err := os.WriteFile(creds, []byte("[daemonA]\naws_access_key_id = AKIAFLEETDDAEMONA000\naws_secret_access_key = a\n"+
		"[daemonB]\naws_access_key_id = AKIAFLEETDDAEMONB000\naws_secret_access_key = b\n"+
		"[daemonC]\naws_access_key_id = AKIAFLEETDDAEMONC000\naws_secret_access_key = c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "")
	ec2 := fakeec2.New(fakeec2.Options{Regions: map[string][]string{"us-east-1": {"us-east-1a", "us-east-1b"}}})
	srv := httptest.NewServer(ec2)
	t.Cleanup(srv.Close)
	lc := &lifecycle{t: t, ec2: ec2, url: srv.URL, r: rand.New(rand.NewPCG(seed, 0x11fe)),
		// Instances a restored state does not know are deleted after
		// the orphan grace: short, so a step settles in seconds.
		// A restart can cancel a Delete in flight; the node then waits
		// terminate_retry (1 min by default) for the next: short here.
		// A restored node may hold an instance destroyed since the
		// backup; the fake lists launches at once, so the grace for one
		// missing from the list (a minute by default) can be short too.
		params: reconcile.Params{OrphanGrace: time.Second, TerminateRetry: 2 * time.Second,
			VisibilityGrace: time.Second},
		nodeInc: map[string]string{}, nodeBorn: map[string]time.Time{}, incs: map[string]bool{},
		spend: map[string]float64{}, instances: map[string]bool{},
		fig: lifecycleFigures{ops: map[string]int{}}}
	for _, n := range []string{"A", "B"} {
		d := &lcDaemon{name: n, dir: t.TempDir()}
		lc.start(d)
		lc.ds = append(lc.ds, d)
	}
	if withHA {
		// C: two servers on one etcd, with leader failovers.
		ec := etcdtest.StartCluster(t, 1)
		d := &lcDaemon{name: "C", cluster: &cluster.Config{Prefix: fmt.Sprintf("/lifecycle-%d/", seed), SessionTTL: "2s",
			Etcd: &cluster.EtcdConfig{Endpoints: ec.Endpoints()}}}
		d.servers, d.dirs = make([]*testDaemon, 2), []string{t.TempDir(), t.TempDir()}
		for i := range d.servers {
			lc.startServer(d, i)
		}
		lc.leader(d)
		lc.ds = append(lc.ds, d)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d, steps:\n  %s", seed, strings.Join(lc.log, "\n  "))
		}
	})
	for i := range steps {
		op := lc.step()
		lc.log = append(lc.log, fmt.Sprintf("%d: %s", i+1, op))
		lc.fig.steps++
		lc.settle()
		lc.check()
		if t.Failed() {
			break
		}
	}
	// Destroy everything: nothing may be left behind.
	for _, d := range lc.ds {
		for _, name := range lc.fleets(d) {
			lc.destroy(d, name)
		}
	}
	lc.settle()
	lc.check()
	if live := lc.ec2.Live(); len(live) != 0 {
		t.Errorf("%d instances live after every fleet was destroyed: %v", len(live), live)
	}
	for _, in := range lc.ec2.Instances() {
		lc.instances[in.ID] = true
	}
	lc.fig.instances = len(lc.instances)
	lc.fig.nodeIDs = len(lc.nodeInc)
	lc.fig.incarnations = len(lc.incs)
	return lc.fig
}

// spec is a fleet of size nodes for daemon d, which calls EC2 with its own
// access key (its credentials profile) so EC2 can say who terminated what.
func (lc *lifecycle) spec(d *lcDaemon, name string, size int) string {
	return fmt.Sprintf(lcSpec, name, size, size, lc.url, "daemon"+d.name)
}

func (lc *lifecycle) start(d *lcDaemon) {
	if d.cluster != nil {
		for i, td := range d.servers {
			td.stop()
			lc.startServer(d, i)
		}
		lc.leader(d)
		return
	}
	prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2, RetryMaxBackoff: 10 * time.Millisecond})
	d.td = launchTestDaemon(lc.t, d.dir, staticProviders{awsprov.Name: prov}, nil, Options{Params: lc.params, StrayScan: 500 * time.Millisecond})
	d.id = d.td.DaemonID()
}

// startServer starts server i of a clustered daemon.
func (lc *lifecycle) startServer(d *lcDaemon, i int) {
	prov := awsprov.New(awsprov.Options{RetryMaxAttempts: 2, RetryMaxBackoff: 10 * time.Millisecond})
	cfg := *d.cluster
	cfg.Name = fmt.Sprintf("c%d", i+1)
	d.servers[i] = launchTestDaemon(lc.t, d.dirs[i], staticProviders{awsprov.Name: prov}, nil,
		Options{Params: lc.params, StrayScan: 500 * time.Millisecond, Config: Config{Cluster: &cfg}})
}

// leader waits for a clustered daemon's leader and makes it d.td.
func (lc *lifecycle) leader(d *lcDaemon) {
	waitFor(lc.t, "a leader of daemon "+d.name, 30*time.Second, func() bool {
		for _, td := range d.servers {
			if td.cl != nil && td.cl.isLeader() {
				d.td = td
				return true
			}
		}
		return false
	})
	d.id = d.td.DaemonID()
}

// failover stops a clustered daemon's leader and starts it again as a
// follower; the other server takes over.
func (lc *lifecycle) failover(d *lcDaemon) {
	for i, td := range d.servers {
		if td == d.td {
			td.stop()
			lc.startServer(d, i)
		}
	}
	lc.leader(d)
}

// step picks and performs one operation, returning its description.
func (lc *lifecycle) step() string {
	d := lc.ds[lc.r.IntN(len(lc.ds))]
	name := lcFleets[lc.r.IntN(len(lcFleets))]
	exists := slices.Contains(lc.fleets(d), name)
	var op, what string
	switch k := lc.r.IntN(100); {
	case k < 30 || !exists && k < 55:
		size := 1 + lc.r.IntN(3)
		op, what = "apply", fmt.Sprintf("daemon %s applies %s with %d nodes", d.name, name, size)
		if err := lc.apply(d, name, size); err != nil {
			lc.t.Fatalf("%s: %v", what, err)
		}
	case k < 45 && exists:
		op, what = "destroy", fmt.Sprintf("daemon %s destroys %s", d.name, name)
		lc.destroy(d, name)
	case k < 55 && exists:
		// Destroy and apply at once: the report that opened this work.
		op, what = "recreate", fmt.Sprintf("daemon %s destroys %s and applies it again", d.name, name)
		lc.destroy(d, name)
		waitFor(lc.t, what+": destroy", 30*time.Second, func() bool { return !slices.Contains(lc.fleets(d), name) })
		if err := lc.apply(d, name, 2); err != nil {
			lc.t.Fatalf("%s: %v", what, err)
		}
	case k < 70 && d.cluster != nil:
		op, what = "failover", fmt.Sprintf("daemon %s's leader stops and comes back as a follower", d.name)
		lc.failover(d)
	case k < 63:
		op, what = "restart", fmt.Sprintf("daemon %s restarts", d.name)
		d.td.stop()
		lc.start(d)
	case k < 70 && d.cluster == nil:
		op, what = "backup", fmt.Sprintf("daemon %s's state is backed up", d.name)
		d.td.stop()
		d.backup = filepath.Join(lc.t.TempDir(), "state.db")
		copyFile(lc.t, filepath.Join(d.dir, "state.db"), d.backup)
		lc.start(d)
	case k < 76 && d.backup != "" && d.cluster == nil:
		op, what = "restore", fmt.Sprintf("daemon %s's state is restored from its older backup", d.name)
		d.td.stop()
		copyFile(lc.t, d.backup, filepath.Join(d.dir, "state.db"))
		lc.start(d)
		lc.clearStrays(d)
		// Spend figures go back with the state: start counting again.
		for k := range lc.spend {
			if strings.HasPrefix(k, d.id+"/") {
				delete(lc.spend, k)
			}
		}
	default:
		live := lc.ec2.Live()
		if len(live) == 0 {
			op, what = "idle", "nothing runs"
			break
		}
		in := live[lc.r.IntN(len(live))]
		if lc.r.IntN(2) == 0 || in.Market != "spot" { // on-demand gets no notice
			op, what = "kill", fmt.Sprintf("instance %s (%s/%s) dies", in.ID, in.Tags[providers.TagDaemonID], in.Tags[providers.TagNodeID])
			if err := lc.ec2.Reclaim(in.ID); err != nil {
				lc.t.Fatal(err)
			}
		} else {
			op, what = "notice", fmt.Sprintf("instance %s (%s/%s) gets a spot interruption notice", in.ID, in.Tags[providers.TagDaemonID], in.Tags[providers.TagNodeID])
			if err := lc.ec2.InterruptSpot(in.ID, 300*time.Millisecond); err != nil {
				lc.t.Fatal(err)
			}
		}
	}
	lc.fig.ops[op]++
	return what
}

// clearStrays plays the operator after a restore: the restored state does
// not know the incarnations created after the backup, and the daemon never
// touches an incarnation it does not own. It must name each such instance:
// in an other-incarnation alert where the fleet name still exists, in an
// instance.stray event where it does not. The operator then deletes them
// by hand (as docs/security.md says). None is under a spot notice: the
// last step settled, so EC2 cannot take one away before the daemon looks.
func (lc *lifecycle) clearStrays(d *lcDaemon) {
	cur := map[string]string{}
	_ = d.td.Store().View(context.Background(), func(tx state.Tx) error {
		fs, err := tx.Fleets()
		for _, f := range fs {
			cur[f.Name] = f.Incarnation
		}
		return err
	})
	for _, in := range lc.ec2.Live() {
		name, inc := in.Tags[providers.TagFleet], in.Tags[providers.TagIncarnation]
		if in.Tags[providers.TagDaemonID] != d.id || cur[name] == inc {
			continue
		}
		if _, known := cur[name]; known {
			waitFor(lc.t, "an other-incarnation alert for "+in.ID, 15*time.Second, func() bool {
				f, err := d.td.client.Fleet(context.Background(), name)
				return err == nil && slices.ContainsFunc(f.Alerts, func(a api.AlertInfo) bool {
					return a.Kind == reconcile.AlertOtherIncarnation && a.Subject == in.ID
				})
			})
			lc.fig.ops["stray: other-incarnation alert"]++
		} else if len(cur) > 0 {
			// No fleet of that name: the stray scan reports it, through
			// the provider configuration of the fleets it has (with none,
			// it has no credentials or region to look with).
			waitFor(lc.t, "an instance.stray event for "+in.ID, 15*time.Second, func() bool {
				evs, err := d.td.client.Events(context.Background(), 0, 0, 0)
				return err == nil && slices.ContainsFunc(evs.Events, func(e state.Event) bool {
					return e.Type == "instance.stray" && e.Data["instance"] == in.ID
				})
			})
			lc.fig.ops["stray: instance.stray event"]++
		} else {
			lc.fig.ops["stray: unseen (no fleet to look with)"]++
		}
		if err := lc.ec2.Reclaim(in.ID); err != nil {
			lc.t.Fatal(err)
		}

	}
}

func (lc *lifecycle) apply(d *lcDaemon, name string, size int) error {
	return lc.retry(d, func(c *api.Client) error {
		_, err := c.Apply(context.Background(), api.ApplyRequest{Filename: name + ".hcl", Source: lc.spec(d, name, size)})
		return err
	})
}

// retry runs an API call on a daemon. A clustered daemon's leader can lose
// its term between lookup and call (its write is then fenced off): look
// the leader up again and repeat, as a client of a cluster does.
func (lc *lifecycle) retry(d *lcDaemon, call func(*api.Client) error) error {
	err := call(d.td.client)
	for deadline := time.Now().Add(20 * time.Second); err != nil && d.cluster != nil && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		lc.leader(d)
		err = call(d.td.client)
	}
	return err
}

func (lc *lifecycle) destroy(d *lcDaemon, name string) {
	err := lc.retry(d, func(c *api.Client) error {
		_, err := c.Destroy(context.Background(), name)
		if api.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		lc.t.Fatalf("daemon %s destroy %s: %v", d.name, name, err)
	}
}

func (lc *lifecycle) fleets(d *lcDaemon) []string {
	var names []string
	_ = d.td.Store().View(context.Background(), func(tx state.Tx) error {
		fs, err := tx.Fleets()
		for _, f := range fs {
			names = append(names, f.Name)
		}
		return err
	})
	return names
}

// settled reports whether every daemon has reached what it was asked
// for: each fleet at its size with launched instances and nothing in
// flight, destroyed fleets gone, and every live instance accounted for
// by a node record of its own daemon and incarnation. Nothing may be
// left for a daemon to react to: no instance under a spot notice (EC2
// reclaims it at the notice's deadline) and no node holding an instance
// EC2 has ended, so no replacement launch can follow.
func (lc *lifecycle) settled() (bool, string) {
	// EC2 first: a node recorded after this read may hold an instance
	// launched after it, which only delays settling by a poll.
	live := map[string]fakeec2.Instance{}
	for _, in := range lc.ec2.Live() {
		if in.SpotRequestStatus == "marked-for-termination" {
			return false, fmt.Sprintf("instance %s is under a spot notice", in.ID)
		}
		live[in.ID] = in
	}
	recorded := map[string]bool{}
	for _, d := range lc.ds {
		var fleets []state.Fleet
		var nodes = map[string][]state.Node{}
		err := d.td.Store().View(context.Background(), func(tx state.Tx) error {
			var err error
			if fleets, err = tx.Fleets(); err != nil {
				return err
			}
			for _, f := range fleets {
				if nodes[f.Name], err = tx.Nodes(f.Name); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return false, err.Error()
		}
		for _, f := range fleets {
			if f.Destroying {
				return false, fmt.Sprintf("daemon %s: %s still destroying", d.name, f.Name)
			}
			fl, err := d.td.fleetSpec(f)
			if err != nil {
				return false, err.Error()
			}
			up := 0
			for _, n := range nodes[f.Name] {
				switch n.State {
				case state.NodeBooting:
					if n.InstanceID == "" {
						break
					}
					if _, ok := live[n.InstanceID]; !ok {
						return false, fmt.Sprintf("daemon %s: node %s holds instance %s, which is not live", d.name, n.ID, n.InstanceID)
					}
					up++
					recorded[n.InstanceID] = true
				case state.NodeRequested, state.NodeProvisioning, state.NodeDraining, state.NodeTerminating:
					return false, fmt.Sprintf("daemon %s: node %s %s", d.name, n.ID, n.State)
				}
			}
			// More is fine: shrinking is rate-limited (scale-down cooldown),
			// and sizes are not what this model checks.
			if up < fl.TargetNodes() {
				return false, fmt.Sprintf("daemon %s: %s has %d of %d nodes", d.name, f.Name, up, fl.TargetNodes())
			}
		}
	}
	for id, in := range live {
		if !recorded[id] {
			return false, fmt.Sprintf("instance %s (%v) is live but no booting node holds it", id, in.Tags)
		}
	}
	return true, ""
}

func (lc *lifecycle) settle() {
	lc.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		ok, why := lc.settled()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			lc.t.Fatalf("not settled after 45s: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check asserts the identity invariants.
func (lc *lifecycle) check() {
	t := lc.t
	t.Helper()
	// The daemons' records first, EC2 after: an instance a daemon has
	// recorded is then in EC2's list even if a launch slips in between
	// the two reads (settle leaves no notice or death to launch for, but
	// this check should not depend on that).
	type snapshot struct {
		fleets []state.Fleet
		nodes  map[string][]state.Node
	}
	snaps := make([]snapshot, len(lc.ds))
	for i, d := range lc.ds {
		snap := snapshot{nodes: map[string][]state.Node{}}
		_ = d.td.Store().View(context.Background(), func(tx state.Tx) error {
			snap.fleets, _ = tx.Fleets()
			for _, f := range snap.fleets {
				snap.nodes[f.Name], _ = tx.Nodes(f.Name)
			}
			return nil
		})
		snaps[i] = snap
	}
	ec2 := map[string]fakeec2.Instance{}
	keyOf := map[string]string{} // daemon id → its access key id
	for _, d := range lc.ds {
		keyOf[d.id] = "AKIAFLEETDDAEMON" + d.name + "000"
	}
	for _, in := range lc.ec2.Instances() {
		ec2[in.ID] = in
		// Only its own daemon ever terminates an instance.
		if in.TerminatedBy != "" && in.TerminatedBy != keyOf[in.Tags[providers.TagDaemonID]] {
			t.Errorf("instance %s of daemon %s was terminated with key %s", in.ID, in.Tags[providers.TagDaemonID], in.TerminatedBy)
		}
		// A launch token belongs to exactly one node of one daemon: the
		// instance it was answered with is tagged for that node.
		want := awsprov.ClientToken(in.Tags[providers.TagDaemonID] + "." + in.Tags[providers.TagNodeID])
		if in.ClientToken != want {
			t.Errorf("instance %s has token %q; its tags %v say %q", in.ID, in.ClientToken, in.Tags, want)
		}
	}
	lc.fig.checks++
	for i, d := range lc.ds {
		fleets, nodes := snaps[i].fleets, snaps[i].nodes
		for _, f := range fleets {
			lc.incs[d.id+"/"+f.Name+"/"+f.Incarnation] = true
			for _, n := range nodes[f.Name] {
				key := d.id + "/" + f.Name + "/" + n.ID
				// No node id minted twice, nor carried into another incarnation.
				if inc, seen := lc.nodeInc[key]; seen && inc != f.Incarnation {
					t.Errorf("daemon %s: node id %s of incarnation %s reappears in incarnation %s", d.name, n.ID, inc, f.Incarnation)
				}
				if born, seen := lc.nodeBorn[key]; seen && !born.Equal(n.CreatedAt) {
					t.Errorf("daemon %s: node id %s minted twice (%v and %v)", d.name, n.ID, born, n.CreatedAt)
				}
				lc.nodeInc[key], lc.nodeBorn[key] = f.Incarnation, n.CreatedAt
				if !strings.HasPrefix(n.ID, f.Name+"-"+f.Incarnation+"-") {
					t.Errorf("daemon %s: node id %s does not carry incarnation %s", d.name, n.ID, f.Incarnation)
				}
				// No instance adopted across daemons or incarnations.
				if n.InstanceID == "" {
					continue
				}
				in, ok := ec2[n.InstanceID]
				if !ok {
					t.Errorf("daemon %s: node %s records instance %s that EC2 never launched", d.name, n.ID, n.InstanceID)
					continue
				}
				if in.Tags[providers.TagDaemonID] != d.id || in.Tags[providers.TagIncarnation] != f.Incarnation || in.Tags[providers.TagNodeID] != n.ID {
					t.Errorf("daemon %s incarnation %s: node %s holds instance %s tagged %v", d.name, f.Incarnation, n.ID, n.InstanceID, in.Tags)
				}
			}
		}
		// Events: a node's events name the incarnation that minted it.
		evs, err := d.td.client.Events(context.Background(), 0, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Events {
			if e.Fleet == "" || e.Node == "" {
				continue
			}
			if !strings.HasPrefix(e.Node, e.Fleet+"-"+e.Incarnation+"-") {
				t.Errorf("daemon %s: event %d (%s, node %s) attributed to incarnation %q", d.name, e.Seq, e.Type, e.Node, e.Incarnation)
			}
		}
		// Spend per fleet name never goes down (a restore resets the baseline).
		for name, v := range spendTotals(t, d.td) {
			key := d.id + "/" + name
			if prev, ok := lc.spend[key]; ok && v+1e-9 < prev {
				t.Errorf("daemon %s: fleetd_spend_usd_total{fleet=%q} went down from %.9f to %.9f", d.name, name, prev, v)
			}
			lc.spend[key] = v
		}
	}
}

// spendTotals reads fleetd_spend_usd_total per fleet from a daemon's registry.
func spendTotals(t *testing.T, td *testDaemon) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for fleet, m := range byLabel(t, td.Daemon, "fleetd_spend_usd_total", "fleet") {
		out[fleet] = m.GetCounter().GetValue()
	}
	return out
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
