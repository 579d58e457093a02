// Package clientcache keeps a provider's cloud API clients, one per key
// (profile, endpoint, region, …), each built on first use. The AWS and GCP
// providers share it.
package clientcache

import "sync"

// Cache holds clients by key. The zero value is ready to use; it is safe
// for concurrent use.
type Cache[K comparable, C any] struct {
	mu sync.Mutex
	m  map[K]C
}

// Get returns the client of key, calling build on a miss. build runs
// without the lock, as it may read configuration files or credentials, so
// two first callers may both build: the client stored first wins and is
// what both get. A failed build is not kept; the next call tries again.
func (c *Cache[K, C]) Get(key K, build func() (C, error)) (C, error) {
	c.mu.Lock()
	cl, ok := c.m[key]
	c.mu.Unlock()
	if ok {
		return cl, nil
	}
	cl, err := build()
	if err != nil {
		return cl, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if first, ok := c.m[key]; ok {
		return first, nil
	}
	if c.m == nil {
		c.m = map[K]C{}
	}
	c.m[key] = cl
	return cl, nil
}
