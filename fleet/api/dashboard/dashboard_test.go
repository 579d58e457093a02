package dashboard

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestRoutes(t *testing.T) {
	mux := http.NewServeMux()
	Mount(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, c := range []struct {
		path, contentType, contains string
		code                        int
	}{
		{"/", "text/html; charset=utf-8", `<script src="/ui/app.js"`, 200},
		{"/ui/app.js", "text/javascript; charset=utf-8", "/v1/events/stream", 200},
		{"/ui/style.css", "text/css; charset=utf-8", "--st-running", 200},
		{"/ui/", "", "", 404},
		{"/ui/index.html", "", "", 404},
		{"/ui/../dashboard.go", "", "", 404},
		{"/ui/missing.js", "", "", 404},
		{"/other", "", "", 404},
	} {
		t.Run(c.path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.code {
				t.Fatalf("HTTP %d, want %d", resp.StatusCode, c.code)
			}
			if c.code != 200 {
				return
			}
			if got := resp.Header.Get("Content-Type"); got != c.contentType {
				t.Errorf("Content-Type %q, want %q", got, c.contentType)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
				t.Errorf("CSP %q", csp)
			}
			if !strings.Contains(string(b), c.contains) {
				t.Errorf("body lacks %q", c.contains)
			}
		})
	}
}

// The page must work offline and under the CSP: no external URL, no inline
// script or style, no inline event handler.
func TestAssetsAreSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//`)
	urlInCode := regexp.MustCompile(`(?i)["'\x60](https?:)?//[a-z0-9]`)
	inline := regexp.MustCompile(`(?i)<script>|<style|\son[a-z]+\s*=|style="`)
	err := fs.WalkDir(static, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(static, path)
		if err != nil {
			return err
		}
		s := string(b)
		if m := external.FindString(s); m != "" {
			t.Errorf("%s references an external resource: %q", path, m)
		}
		if strings.HasSuffix(path, ".html") {
			if m := inline.FindString(s); m != "" {
				t.Errorf("%s has inline code the CSP forbids: %q", path, m)
			}
		}
		if strings.HasSuffix(path, ".js") {
			// The SVG namespace name is an identifier, never fetched.
			s = strings.ReplaceAll(s, `"http://www.w3.org/2000/svg"`, "")
			for _, m := range urlInCode.FindAllString(s, -1) {
				t.Errorf("%s has an absolute URL: %q", path, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
