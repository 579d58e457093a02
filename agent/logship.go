package agent

import (
	"context"
	"sync"
	"time"
)

// Log shipping limits: logs are best effort (the node keeps every line in
// its files), so the buffer is bounded and the oldest lines go first when
// the daemon is away.
const (
	shipInterval = time.Second
	shipBatch    = 100  // lines that trigger a flush before the interval
	shipBuffer   = 2000 // lines kept while the daemon does not answer
)

type logLine struct {
	round, rank int
	text        string
}

// logShipper batches worker output lines to the daemon.
type logShipper struct {
	post    func(ctx context.Context, r logsRequest) error
	onError func(err error, dropped int)

	mu      sync.Mutex
	buf     []logLine
	dropped int // lines dropped since the last successful post
	kick    chan struct{}
}

func newLogShipper(post func(context.Context, logsRequest) error) *logShipper {
	return &logShipper{post: post, kick: make(chan struct{}, 1)}
}

// add queues a line; it never blocks.
func (s *logShipper) add(round, rank int, text string) {
	s.mu.Lock()
	if len(s.buf) >= shipBuffer {
		// Drop the oldest tenth at once: a chatty worker with the daemon
		// away must not cost a buffer copy per line.
		n := len(s.buf) - shipBuffer + shipBuffer/10
		s.buf = append(s.buf[:0], s.buf[n:]...)
		s.dropped += n
	}
	s.buf = append(s.buf, logLine{round, rank, text})
	full := len(s.buf) >= shipBatch
	s.mu.Unlock()
	if full {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// run flushes every shipInterval (or at shipBatch lines) until ctx ends,
// then makes a last, short attempt.
func (s *logShipper) run(ctx context.Context) {
	t := time.NewTicker(shipInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			s.flush(fctx)
			cancel()
			return
		case <-t.C:
		case <-s.kick:
		}
		s.flush(ctx)
	}
}

// flush posts the buffered lines, one request per (round, rank) run of
// lines. Lines whose post fails go back to the front of the buffer.
func (s *logShipper) flush(ctx context.Context) {
	s.mu.Lock()
	lines := s.buf
	s.buf = nil
	s.mu.Unlock()
	for i := 0; i < len(lines); {
		j := i
		req := logsRequest{Round: int64(lines[i].round), Rank: lines[i].rank}
		for j < len(lines) && lines[j].round == lines[i].round && lines[j].rank == lines[i].rank && j-i < 4*shipBatch {
			req.Lines = append(req.Lines, lines[j].text)
			j++
		}
		if err := s.post(ctx, req); err != nil {
			s.requeue(lines[i:], err)
			return
		}
		i = j
	}
	s.mu.Lock()
	s.dropped = 0
	s.mu.Unlock()
}

func (s *logShipper) requeue(rest []logLine, err error) {
	s.mu.Lock()
	merged := append(rest, s.buf...)
	if over := len(merged) - shipBuffer; over > 0 {
		merged = merged[over:]
		s.dropped += over
	}
	s.buf = merged
	dropped := s.dropped
	s.mu.Unlock()
	if s.onError != nil {
		s.onError(err, dropped)
	}
}
