package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
)

// Store persists fleets' snapshots. The daemon implements it on bbolt.
type Store interface {
	SaveFleet(ctx context.Context, fleet string, snap Snapshot) error
	DeleteFleet(ctx context.Context, fleet string) error
	LoadAll(ctx context.Context) (map[string]Snapshot, error)
}

// MemoryStore is a Store in memory. It keeps the JSON encoding, so what
// it returns has made the same round trip as a real store's data.
type MemoryStore struct {
	mu     sync.Mutex
	fleets map[string][]byte
	saves  int
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{fleets: make(map[string][]byte)} }

// SaveFleet implements Store.
func (s *MemoryStore) SaveFleet(ctx context.Context, fleet string, snap Snapshot) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode rendezvous snapshot %s: %w", fleet, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fleets[fleet] = b
	s.saves++
	return nil
}

// DeleteFleet implements Store.
func (s *MemoryStore) DeleteFleet(ctx context.Context, fleet string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.fleets, fleet)
	return nil
}

// LoadAll implements Store.
func (s *MemoryStore) LoadAll(ctx context.Context) (map[string]Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Snapshot, len(s.fleets))
	for name, b := range s.fleets {
		var snap Snapshot
		if err := json.Unmarshal(b, &snap); err != nil {
			return nil, fmt.Errorf("decode rendezvous snapshot %s: %w", name, err)
		}
		out[name] = snap
	}
	return out, nil
}

// Saves counts successful saves (for tests and debugging).
func (s *MemoryStore) Saves() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saves
}
