// Package console serves PandaStack's web console: the single-page
// application built from web/console (Preact, htm, xterm.js, bundled by
// esbuild) into dist/ and embedded in the binary. It serves files only:
// the application talks to the public REST API with the API key its user
// signs in with, like any other client, so it shows exactly what that key
// may see. internal/controlplane/rest mounts Handler at / and /console/.
//
// The bundle is built by `make build`, not committed (only dist/README.md
// is): a binary built without it serves a page saying so at /.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// AssetPrefix is the path under which the bundle's files are served; the
// file names carry a hash of their content, so they are cached for good.
const AssetPrefix = "/console/"

// csp is the Content-Security-Policy of every answer: scripts and styles
// from this origin only (no inline script), requests to this origin only
// (the REST API and the terminal's WebSocket), no frames, no plugins, no
// workers (the console has none, so no service worker is registered from
// its pages either).
// Inline styles are allowed: xterm.js's renderer sets its colours in a
// <style> element it creates; no script can be injected through a style.
const csp = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; worker-src 'none'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// notBuilt is the page served at / by a binary built without the bundle.
const notBuilt = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PandaStack console not built</title></head>
<body><h1>The web console is not built</h1>
<p>This panda binary was built without the console's bundle. Run <code>make build</code>
in the repository (it installs the console's npm packages and bundles them), then start the server again.</p>
<p>The REST API under <code>/v1</code> works regardless.</p></body></html>
`

// Handler serves the console: GET / is the application's page, GET
// /console/NAME its hashed assets; any other path under /console/ that
// names no file leads back to the application (its routes are in the
// URL's fragment). Only GET and HEAD.
func Handler() http.Handler {
	files, _ := fs.Sub(dist, "dist")
	index, err := fs.ReadFile(files, "index.html")
	built := err == nil
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// A window of another origin that opened the console, or that the
		// console opened, gets no handle on it (and it none on them):
		// pages of sandboxes are such origins (internal/controlplane/rest/proxy.go).
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name, isAsset := strings.CutPrefix(r.URL.Path, AssetPrefix)
		switch {
		case r.URL.Path == "/":
			h.Set("Cache-Control", "no-cache")
			if !built {
				h.Set("Content-Type", "text/html; charset=utf-8")
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(notBuilt))
				return
			}
			h.Set("Content-Type", "text/html; charset=utf-8")
			w.Write(index)
		case isAsset && name != "" && name != "index.html" && name != "README.md" && !strings.Contains(name, "/") && built:
			b, err := fs.ReadFile(files, name)
			if err != nil {
				if path.Ext(name) == "" {
					redirect(w, "../")
					return
				}
				http.Error(w, "no such file in the console", http.StatusNotFound)
				return
			}
			h.Set("Content-Type", contentType(name))
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
			w.Write(b)
		default:
			// /console, /console/, /console/a/b: the application, by a
			// relative redirect (right under a public path prefix too).
			up := strings.Repeat("../", strings.Count(strings.TrimPrefix(r.URL.Path, "/"), "/"))
			if up == "" {
				up = "./"
			}
			redirect(w, up)
		}
	})
}

// redirect answers 302 to a relative location, as is: http.Redirect would
// make it absolute, which is wrong behind a proxy's path prefix.
func redirect(w http.ResponseWriter, loc string) {
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusFound)
}

func contentType(name string) string {
	switch path.Ext(name) {
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".woff2":
		return "font/woff2"
	case ".txt":
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}
