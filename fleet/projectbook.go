package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetd/fleetd/fleet/projects"
	"github.com/fleetd/fleetd/fleet/state"
)

// Projects an admin sets or deletes through the API live in the state
// store, so they survive restarts and every server of a cluster (the
// leader after a failover) sees them. They override daemon.hcl's project
// blocks name by name (docs/projects.md, "Changing projects").

// metaProjects is the meta key holding the admin's project changes as one
// versioned JSON document: one key because Tx has no prefix scan and the
// list is small (maxProjectChanges).
const metaProjects = "projects"

const (
	// projectsDocVersion is the document's schema version; a newer one
	// (written by a newer daemon) is refused rather than misread.
	projectsDocVersion = 1
	maxProjectChanges  = 256
	// projectsCacheTTL bounds how stale a server's view of changes made
	// on another server is; a change on this server applies at once.
	projectsCacheTTL = 2 * time.Second
)

type projectsDoc struct {
	Version int               `json:"version"`
	Changes []projects.Change `json:"changes"`
}

func readProjectChanges(tx state.Tx) (projectsDoc, error) {
	doc := projectsDoc{Version: projectsDocVersion}
	if _, err := state.ReadMetaJSON(tx, metaProjects, "stored project changes are damaged", &doc); err != nil {
		return doc, err
	}
	if doc.Version > projectsDocVersion {
		return doc, fmt.Errorf("stored project changes have schema version %d; this fleetd reads up to %d (upgrade it)", doc.Version, projectsDocVersion)
	}
	return doc, nil
}

func writeProjectChanges(tx state.Tx, doc projectsDoc) error {
	doc.Version = projectsDocVersion
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return tx.SetMeta(metaProjects, b)
}

// errProjectBusy refuses deleting a project whose fleets still run.
var errProjectBusy = errors.New("project has fleets")

// projectBook is the daemon's effective projects: daemon.hcl's with the
// stored changes applied, cached for projectsCacheTTL. Every reader (spec
// parser, controller, API) gets an immutable snapshot.
type projectBook struct {
	store Store
	base  *projects.Config
	log   *slog.Logger

	mu      sync.Mutex
	cur     *projects.Config
	changes []projects.Change
	loaded  time.Time
}

// Config returns the effective projects. A store that cannot be read
// keeps the last view (daemon.hcl's at first), logged.
func (b *projectBook) Config() *projects.Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cur != nil && time.Since(b.loaded) < projectsCacheTTL {
		return b.cur
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	doc, err := state.Read(ctx, b.store, readProjectChanges)
	if err != nil {
		b.log.Warn("read project changes; using the last known projects", "err", err)
		if b.cur == nil {
			b.cur = b.base.With(nil)
		}
		b.loaded = time.Now()
		return b.cur
	}
	b.changes = doc.Changes
	b.cur = b.base.With(doc.Changes)
	b.loaded = time.Now()
	return b.cur
}

// Source says where a project's settings come from: "api" for an admin's
// change, "config" for daemon.hcl.
func (b *projectBook) Source(name string) string {
	b.Config()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.changes {
		if c.Project.Name == name && !c.Deleted {
			return "api"
		}
	}
	return "config"
}

func (b *projectBook) invalidate() {
	b.mu.Lock()
	b.loaded = time.Time{}
	b.mu.Unlock()
}

// Set creates or replaces a project. created says it did not exist.
func (b *projectBook) Set(ctx context.Context, p projects.Project) (created bool, err error) {
	if p.MaxGPUs == 0 {
		p.MaxGPUs = p.QuotaGPUs
	}
	if p.Budget != nil {
		lim := p.Budget.WithDefaults()
		p.Budget = &lim
	}
	if err := projects.Validate(p); err != nil {
		return false, fmt.Errorf("%w: %w", state.ErrInvalid, err)
	}
	err = b.store.Update(ctx, func(tx state.Tx) error {
		doc, err := readProjectChanges(tx)
		if err != nil {
			return err
		}
		created = !b.declared(doc.Changes, p.Name)
		doc.Changes = slices.DeleteFunc(doc.Changes, func(c projects.Change) bool { return c.Project.Name == p.Name })
		if len(doc.Changes) >= maxProjectChanges {
			return fmt.Errorf("%w: already %d project changes stored; delete some projects first", state.ErrInvalid, maxProjectChanges)
		}
		doc.Changes = append(doc.Changes, projects.Change{Project: p})
		if err := writeProjectChanges(tx, doc); err != nil {
			return err
		}
		verb := "updated"
		if created {
			verb = "created"
		}
		_, err = tx.AppendEvent(state.Event{Type: "project." + verb,
			Message: fmt.Sprintf("project %s %s: quota %d, max %d GPUs, priority %d%s", p.Name, verb, p.QuotaGPUs, p.MaxGPUs, p.Priority, budgetText(p)),
			Data:    map[string]string{"project": p.Name}})
		return err
	})
	b.invalidate()
	return created, err
}

// declared reports whether the effective projects declare name (the
// implicit default project does not count).
func (b *projectBook) declared(changes []projects.Change, name string) bool {
	for _, p := range b.base.With(changes).Projects {
		if p.Name == name {
			return true
		}
	}
	return false
}

func budgetText(p projects.Project) string {
	if p.Budget == nil {
		return ""
	}
	var parts []string
	if p.Budget.PerHour > 0 {
		parts = append(parts, fmt.Sprintf("$%g/h", p.Budget.PerHour))
	}
	if p.Budget.Total > 0 {
		parts = append(parts, fmt.Sprintf("$%g total", p.Budget.Total))
	}
	parts = append(parts, "on_exhausted "+string(p.Budget.OnExhausted))
	return ", budget " + strings.Join(parts, ", ")
}

// Delete removes a project (daemon.hcl's or an admin's). It refuses,
// changing nothing, while fleets of the project exist that are neither
// destroyed nor completed: fleetsOf names them, read in the same
// transaction.
func (b *projectBook) Delete(ctx context.Context, name string, fleetsOf func(tx state.Tx, project string) ([]string, error)) error {
	err := b.store.Update(ctx, func(tx state.Tx) error {
		doc, err := readProjectChanges(tx)
		if err != nil {
			return err
		}
		if !b.declared(doc.Changes, name) {
			return fmt.Errorf("project %q: %w", name, state.ErrNotFound)
		}
		busy, err := fleetsOf(tx, name)
		if err != nil {
			return err
		}
		if len(busy) > 0 {
			return fmt.Errorf("%w: project %s still has fleet(s) %s; destroy them (or let them complete) first, nothing was changed",
				errProjectBusy, name, strings.Join(busy, ", "))
		}
		doc.Changes = slices.DeleteFunc(doc.Changes, func(c projects.Change) bool { return c.Project.Name == name })
		if b.baseDeclares(name) {
			// A daemon.hcl project stays deleted across restarts: the
			// deletion itself is stored.
			doc.Changes = append(doc.Changes, projects.Change{Project: projects.Project{Name: name}, Deleted: true})
		}
		if err := writeProjectChanges(tx, doc); err != nil {
			return err
		}
		_, err = tx.AppendEvent(state.Event{Type: "project.deleted", Message: fmt.Sprintf("project %s deleted", name),
			Data: map[string]string{"project": name}})
		return err
	})
	b.invalidate()
	return err
}

func (b *projectBook) baseDeclares(name string) bool {
	return slices.ContainsFunc(b.base.Projects, func(p projects.Project) bool { return p.Name == name })
}
