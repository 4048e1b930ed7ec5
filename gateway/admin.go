package gateway

import (
	"fmt"
	"net"
	"net/http"
	"strings"
)

// AdminPath is the root of what Options.Admin serves: the admin API
// (/napd/v1/…) and the status page (/napd/).
const AdminPath = "/napd/"

// isAdminPath reports a path Options.Admin serves.
func isAdminPath(path string) bool {
	return path == "/napd" || strings.HasPrefix(path, AdminPath)
}

// adminCredential lets a browser reach the status page when keys are on:
// HTTP Basic authentication whose password is the key (the user name is
// not checked). Bearer and x-api-key work as everywhere.
func adminCredential(r *http.Request) http.Header {
	if _, key, ok := r.BasicAuth(); ok {
		return http.Header{"Authorization": {"Bearer " + key}}
	}
	return r.Header
}

// admin serves /napd/…: to admin keys, or without keys to loopback
// clients only. The key check already happened.
func (c *call) admin(r *http.Request) {
	switch {
	case c.g.opts.Admin == nil:
		c.fail(http.StatusNotFound, "not_found", "no route for "+r.URL.Path)
		return
	case c.scope != nil && c.scope.Role != RoleAdmin:
		c.fail(http.StatusForbidden, "admin_only",
			fmt.Sprintf("API key %q has role %s: %s needs an API key with role=admin", c.client, c.scope.Role, AdminPath))
		return
	case c.g.opts.APIKeys == nil && !isLoopback(r.RemoteAddr):
		c.fail(http.StatusForbidden, "admin_loopback_only",
			AdminPath+" answers only clients on a loopback address while no api_keys_file is set")
		return
	}
	if r.URL.Path == "/napd" {
		http.Redirect(&c.w, r, AdminPath, http.StatusMovedPermanently)
		return
	}
	c.g.opts.Admin.ServeHTTP(&c.w, r)
}

// isLoopback reports whether a request's remote address is a loopback IP.
// Anything else, a Unix socket peer included, is not: a reverse proxy on
// the same host would otherwise make every client local.
func isLoopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
