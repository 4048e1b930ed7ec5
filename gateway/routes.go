package gateway

import "net/http"

// route serves one of Options.Routes: a POST is routed by the JSON body's
// model like the /v1 routes, a GET by its `model` query parameter.
func (c *call) route(r *http.Request, rt Route) {
	if r.Method != rt.Method {
		c.w.Header().Set("Allow", rt.Method)
		c.fail(http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+rt.Path)
		return
	}
	if rt.Method == http.MethodPost {
		c.forward(r, r.URL.Path, r.URL.RawPath, true)
		return
	}
	name := r.URL.Query().Get("model")
	if name == "" {
		c.fail(http.StatusBadRequest, "missing_model", "GET "+rt.Path+" needs a ?model= query parameter")
		return
	}
	model, ok := c.resolve(name)
	if !ok {
		return
	}
	c.model, c.requested, c.byQuery = model, name, true
	c.forward(r, r.URL.Path, r.URL.RawPath, false)
}
