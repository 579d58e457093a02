// Package dashboard is fleetd's live HTML dashboard: plain HTML, CSS and
// JavaScript embedded in the binary (no build step, no external resources).
// The files carry no data; the page asks the API for it with the admin
// token the user gives it.
package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var files embed.FS

// static is the asset tree served under /ui/.
var static, _ = fs.Sub(files, "static")

// csp allows nothing from anywhere but the daemon itself: no inline
// scripts, no CDN, no frames.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Mount adds the dashboard to mux: the page at GET / and its assets at
// GET /ui/{file}.
func Mount(mux *http.ServeMux) {
	mux.Handle("GET /{$}", Handler())
	mux.Handle("GET /ui/", Handler())
}

// Handler serves the page for "/" and the assets for "/ui/{file}".
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// Assets change with the binary; revalidating is cheap.
		h.Set("Cache-Control", "no-cache")
		switch {
		case r.URL.Path == "/":
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/index.html"
			serveFile(w, r2)
		case strings.HasPrefix(r.URL.Path, "/ui/") && !strings.HasSuffix(r.URL.Path, "/") && r.URL.Path != "/ui/index.html":
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/ui")
			serveFile(w, r2)
		default:
			http.NotFound(w, r)
		}
	})
}

// serveFile serves one embedded file (http.FileServer would redirect
// /index.html to / and list directories, neither of which is wanted).
func serveFile(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	b, err := fs.ReadFile(static, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasSuffix(name, ".html"):
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
	case strings.HasSuffix(name, ".js"):
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	case strings.HasSuffix(name, ".css"):
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
	case strings.HasSuffix(name, ".svg"):
		w.Header().Set("Content-Type", "image/svg+xml")
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	_, _ = w.Write(b)
}
