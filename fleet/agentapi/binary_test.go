package agentapi

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

func TestAcceptsGzip(t *testing.T) {
	tests := []struct {
		h    string
		want bool
	}{
		{"", false},
		{"gzip", true},
		{"deflate, gzip;q=0.5", true},
		{"GZIP", true},
		{"gzip;q=0", false},
		{"gzip; q=0.000", false},
		{"br, zstd", false},
		{"identity", false},
	}
	for _, tt := range tests {
		if got := acceptsGzip(tt.h); got != tt.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tt.h, got, tt.want)
		}
	}
}

// TestDownloadSlots: at most MaxBinaryStreams downloads hold a slot; the
// next waits, and gets one as soon as one is released.
func TestDownloadSlots(t *testing.T) {
	s := newBinaryServer(slog.Default())
	for i := range MaxBinaryStreams {
		if !s.acquire(t.Context()) {
			t.Fatalf("slot %d refused", i)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if s.acquire(ctx) {
		t.Fatal("a slot beyond MaxBinaryStreams")
	}
	got := make(chan bool)
	go func() { got <- s.acquire(t.Context()) }()
	time.Sleep(20 * time.Millisecond)
	s.release()
	if !<-got {
		t.Fatal("the waiting download got no slot after a release")
	}
}
