package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// Scoped tokens (read, operate) live in the state store, so every server of
// a cluster accepts them and a restore brings them back. They are stored
// hashed: the secret is shown once, at creation.
//
// A token reads "fleetd_<role>_<id>_<secret>": the id finds its record
// without hashing against every record, and the hash covers the whole
// string, so changing the role part invalidates it.

// metaTokens is the meta key holding every scoped token record, as one JSON
// document. One key (not one per token) because Tx has no prefix scan and
// the list is small (maxTokens); writes are rare and transactions serialize
// concurrent creates and revokes.
const metaTokens = "api_tokens"

const (
	// maxTokens bounds the record (and the work of a list).
	maxTokens = 256
	// tokenCacheTTL is how long verified records are reused before the
	// store is read again. It is the longest a revocation made on another
	// server of a cluster takes to bite; a revocation on this server
	// clears the cache at once.
	tokenCacheTTL = 2 * time.Second
	maxTokenName  = 64
)

// tokenRecord is one scoped token as stored.
type tokenRecord struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	Role string `json:"role"`
	// Project limits the token to one project's fleets ("" = all). It is
	// not part of the token string: the record, found by id and checked
	// by hash, is what says it.
	Project   string    `json:"project,omitempty"`
	SHA256    string    `json:"sha256"` // hex sha256 of the whole token string
	CreatedAt time.Time `json:"created_at"`
}

type tokenDoc struct {
	Tokens []tokenRecord `json:"tokens"`
}

func (r tokenRecord) info() api.TokenInfo {
	return api.TokenInfo{ID: r.ID, Name: r.Name, Role: r.Role, Project: r.Project, CreatedAt: r.CreatedAt}
}

// scopedTokens owns the scoped tokens: their records in the store and a
// cache of the records read at most tokenCacheTTL ago, so authenticating a
// request is a map lookup and a hash, not a store read (with etcd that
// would be a network round trip per request).
type scopedTokens struct {
	store state.Store
	now   func() time.Time
	log   *slog.Logger
	// projectExists says whether a token may be limited to a project.
	projectExists func(name string) bool

	mu     sync.Mutex
	byID   map[string]tokenRecord
	loaded time.Time
}

func (c *scopedTokens) invalidate() {
	c.mu.Lock()
	c.byID = nil
	c.mu.Unlock()
}

func readTokens(tx state.Tx) (tokenDoc, error) {
	var doc tokenDoc
	_, err := state.ReadMetaJSON(tx, metaTokens, "token records are damaged", &doc)
	return doc, err
}

// loadTokens reads the token records in a transaction of their own.
func (d *scopedTokens) loadTokens(ctx context.Context) (tokenDoc, error) {
	return state.Read(ctx, d.store, readTokens)
}

func writeTokens(tx state.Tx, doc tokenDoc) error {
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return tx.SetMeta(metaTokens, b)
}

func hashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// parseScopedToken splits "fleetd_<role>_<id>_<secret>"; ok is false for
// anything else (the admin token, node tokens, garbage).
func parseScopedToken(tok string) (role api.Role, id string, ok bool) {
	rest, found := strings.CutPrefix(tok, "fleetd_")
	if !found {
		return api.RoleNone, "", false
	}
	parts := strings.SplitN(rest, "_", 3)
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return api.RoleNone, "", false
	}
	role, err := api.ParseRole(parts[0])
	if err != nil {
		return api.RoleNone, "", false
	}
	return role, parts[1], true
}

// verifyScopedToken implements api.TokenVerifier.
func (d *scopedTokens) verifyScopedToken(ctx context.Context, tok string) (api.Principal, error) {
	role, id, ok := parseScopedToken(tok)
	if !ok {
		return api.Principal{}, api.ErrInvalidToken
	}
	rec, found, err := d.tokenRecord(ctx, id)
	if err != nil {
		return api.Principal{}, err
	}
	// Hash even when the id is unknown, so timing does not tell which ids exist.
	sum := hashToken(tok)
	if !api.TokenEqual(sum, []byte(rec.SHA256)) || !found || rec.Role != role.String() {
		return api.Principal{}, api.ErrInvalidToken
	}
	return api.Principal{Role: role, Project: rec.Project}, nil
}

// tokenRecord looks id up in the cache, refreshing it from the store when
// it is older than tokenCacheTTL.
func (d *scopedTokens) tokenRecord(ctx context.Context, id string) (tokenRecord, bool, error) {
	c := d
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byID == nil || time.Since(c.loaded) > tokenCacheTTL {
		doc, err := d.loadTokens(ctx)
		if err != nil {
			return tokenRecord{}, false, err
		}
		c.byID = make(map[string]tokenRecord, len(doc.Tokens))
		for _, r := range doc.Tokens {
			c.byID[r.ID] = r
		}
		c.loaded = time.Now()
	}
	r, ok := c.byID[id]
	return r, ok, nil
}

// CreateToken makes a scoped token and returns it with its secret, which is
// not stored anywhere. A project limits it to that project's fleets.
func (d *scopedTokens) CreateToken(ctx context.Context, role api.Role, name, project string) (api.TokenCreated, error) {
	if role != api.RoleRead && role != api.RoleOperate {
		return api.TokenCreated{}, fmt.Errorf("%w: role %s cannot be granted", state.ErrInvalid, role)
	}
	if len(name) > maxTokenName || strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return api.TokenCreated{}, fmt.Errorf("%w: name must be at most %d printable characters", state.ErrInvalid, maxTokenName)
	}
	if project != "" && (d.projectExists == nil || !d.projectExists(project)) {
		return api.TokenCreated{}, fmt.Errorf("%w: the daemon has no project %q (see fleetd projects)", state.ErrInvalid, project)
	}
	id := randHex(6)
	tok := fmt.Sprintf("fleetd_%s_%s_%s", role, id, randHex(32))
	rec := tokenRecord{ID: id, Name: name, Role: role.String(), Project: project, SHA256: hashToken(tok), CreatedAt: d.now().UTC()}
	err := d.store.Update(ctx, func(tx state.Tx) error {
		doc, err := readTokens(tx)
		if err != nil {
			return err
		}
		if len(doc.Tokens) >= maxTokens {
			return fmt.Errorf("%w: already %d tokens; revoke some first", state.ErrInvalid, maxTokens)
		}
		doc.Tokens = append(doc.Tokens, rec)
		if err := writeTokens(tx, doc); err != nil {
			return err
		}
		_, err = tx.AppendEvent(state.Event{Type: "token.created",
			Message: fmt.Sprintf("%s token %s (%q) created%s", rec.Role, id, name, projectSuffix(project)),
			Data:    map[string]string{"id": id, "role": rec.Role, "project": project}})
		return err
	})
	if err != nil {
		return api.TokenCreated{}, err
	}
	d.invalidate()
	return api.TokenCreated{TokenInfo: rec.info(), Token: tok}, nil
}

// Tokens lists the scoped tokens, oldest first, without secrets or hashes.
func (d *scopedTokens) Tokens(ctx context.Context) ([]api.TokenInfo, error) {
	doc, err := d.loadTokens(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.TokenInfo, 0, len(doc.Tokens))
	for _, r := range doc.Tokens {
		out = append(out, r.info())
	}
	return out, nil
}

// RevokeToken deletes a scoped token; state.ErrNotFound when there is none.
func (d *scopedTokens) RevokeToken(ctx context.Context, id string) (api.TokenInfo, error) {
	var gone tokenRecord
	err := d.store.Update(ctx, func(tx state.Tx) error {
		doc, err := readTokens(tx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(doc.Tokens, func(r tokenRecord) bool { return r.ID == id })
		if i < 0 {
			return fmt.Errorf("token %q: %w", id, state.ErrNotFound)
		}
		gone = doc.Tokens[i]
		doc.Tokens = slices.Delete(doc.Tokens, i, i+1)
		if err := writeTokens(tx, doc); err != nil {
			return err
		}
		_, err = tx.AppendEvent(state.Event{Type: "token.revoked",
			Message: fmt.Sprintf("%s token %s (%q) revoked", gone.Role, id, gone.Name),
			Data:    map[string]string{"id": id, "role": gone.Role}})
		return err
	})
	if err != nil {
		return api.TokenInfo{}, err
	}
	d.invalidate()
	return gone.info(), nil
}

// The token management routes: admin only.

func (d *scopedTokens) createTokenHandler(w http.ResponseWriter, r *http.Request) {
	var req api.TokenRequest
	if !api.DecodeBody(w, r, &req) {
		return
	}
	role, err := api.ParseRole(req.Role)
	if err != nil {
		api.WriteError(w, http.StatusBadRequest, err)
		return
	}
	created, err := d.CreateToken(r.Context(), role, req.Name, req.Project)
	if errors.Is(err, state.ErrInvalid) {
		api.WriteError(w, http.StatusBadRequest, err)
		return
	}
	if err != nil {
		api.WriteFailure(w, d.log, err)
		return
	}
	api.WriteJSON(w, http.StatusCreated, created)
}

func (d *scopedTokens) listTokensHandler(w http.ResponseWriter, r *http.Request) {
	ts, err := d.Tokens(r.Context())
	if err != nil {
		api.WriteFailure(w, d.log, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, ts)
}

func (d *scopedTokens) revokeTokenHandler(w http.ResponseWriter, r *http.Request) {
	info, err := d.RevokeToken(r.Context(), r.PathValue("id"))
	if err != nil {
		api.WriteFailure(w, d.log, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, info)
}

func projectSuffix(project string) string {
	if project == "" {
		return ""
	}
	return ", limited to project " + project
}
