// Package ctxtime holds the context-aware sleep the retry and poll loops of the
// agent, the daemon, the providers and the watchers back off with: a leaf
// (standard library only) every package may import.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends; it returns ctx.Err() when ctx ended
// first, nil when d passed.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
