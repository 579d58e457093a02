package fleet

import (
	"context"
	"sync"
	"time"
)

// Leadership: what only the leader runs, started and stopped in one
// place for both a single server (one term for its whole life) and a
// cluster's elected leader (ha.go, one term per election won).

// term is one term's running leader duties.
type term struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// establishLeadership starts the leader's duties under a context that
// ends with the term: the controller's passes, the rendezvous event
// writer and the interruption intake. The runtimes are loaded afresh
// from the store: what an earlier leader decided is there, not here.
func (d *Daemon) establishLeadership(ctx context.Context) *term {
	d.ctrl.Reset()
	tctx, cancel := context.WithCancel(ctx)
	t := &term{cancel: cancel}
	for _, duty := range []func(context.Context){d.ctrl.Run, d.rdzv.rdzvEventWriter, d.intake.Run} {
		t.wg.Go(func() { duty(tctx) })
	}
	d.ctrl.Kick()
	return t
}

// revokeLeadership stops a term's duties and waits for them. With flush
// (a clean shutdown while the term still holds) it then saves the
// runtimes' pending accounting, so that a restart or the next leader
// loses none of it.
func (d *Daemon) revokeLeadership(t *term, flush bool) {
	t.cancel()
	t.wg.Wait()
	if flush {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.ctrl.Flush(ctx)
	}
}
