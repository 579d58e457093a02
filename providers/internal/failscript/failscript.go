// Package failscript keeps what a test told an in-process fake to fail:
// the next calls answer scripted errors, in order, until Recover. The
// fakes of single-operation APIs (the AWS Price List, the Cloud Billing
// Catalog) share it.
package failscript

import "sync"

// Queue is a fake's scripted failures and its count of calls. The zero
// value is ready to use; it is safe for concurrent use.
type Queue[E any] struct {
	mu    sync.Mutex
	errs  []E
	calls int
}

// Fail makes the next n calls answer e (after any failures already
// scripted).
func (q *Queue[E]) Fail(n int, e E) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for range n {
		q.errs = append(q.errs, e)
	}
}

// Recover drops the failures Fail scripted and not yet served.
func (q *Queue[E]) Recover() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.errs = nil
}

// Calls is how many calls Serve counted, failed ones included.
func (q *Queue[E]) Calls() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.calls
}

// Serve counts one call and returns the failure it must answer, if one is
// scripted.
func (q *Queue[E]) Serve() (E, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls++
	var e E
	if len(q.errs) == 0 {
		return e, false
	}
	e, q.errs = q.errs[0], q.errs[1:]
	return e, true
}
