package gateway

import (
	"net/http"
	"strings"
)

// exposedHeaders are the headers of napd's answers a browser script may
// read: what napd sets and what clients retry by.
const exposedHeaders = "X-Queue-Depth, X-Napd-Wake-Ms, X-Napd-Replayed, X-Napd-Priority, X-Napd-Served-By, Retry-After, Request-Id, X-Request-Id"

// cors applies Options.CORSOrigins. An allowed origin gets
// Access-Control-Allow-Origin on every answer and its preflights are
// answered 204 here, before the key check (browsers send none on a
// preflight); another origin's preflight is refused with 403. It reports
// whether the request was answered. Without CORSOrigins it does nothing.
func (c *call) cors(r *http.Request) bool {
	if len(c.g.origins) == 0 {
		return false
	}
	origin := headerValue(r.Header, "Origin")
	if origin == "" {
		return false
	}
	h := c.w.Header()
	h.Add("Vary", "Origin")
	preflight := r.Method == http.MethodOptions && headerValue(r.Header, "Access-Control-Request-Method") != ""
	if !c.g.origins[origin] && !c.g.origins["*"] {
		if preflight {
			c.fail(http.StatusForbidden, "origin_not_allowed", "origin "+origin+" is not in gateway.cors_origins")
			return true
		}
		// Served without CORS headers: the browser keeps the answer from
		// the page, as it would without napd's help.
		return false
	}
	c.corsAllowed = true
	h.Set("Access-Control-Allow-Origin", origin)
	if !preflight {
		h.Set("Access-Control-Expose-Headers", exposedHeaders)
		return false
	}
	h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
	// The route checks the method and the key of the real request; the
	// preflight only tells the browser it may send it.
	h.Set("Access-Control-Allow-Methods", r.Header.Get("Access-Control-Request-Method"))
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "600")
	c.w.WriteHeader(http.StatusNoContent)
	return true
}

// dropEngineCORS removes an engine's own CORS headers from an answer napd
// already set them on: two Access-Control-Allow-Origin values make a
// browser refuse the answer.
func dropEngineCORS(h http.Header) {
	// The transport hands response headers over in canonical form.
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-") {
			delete(h, k)
		}
	}
}
