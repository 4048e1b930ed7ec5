package config

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// Values of models.NAME.overflow_when.
const (
	// OverflowRefused: a request overflows only where napd would answer a
	// room or queue 503 (no room can appear in time, the queue is full).
	OverflowRefused = "refused"
	// OverflowLate: also when the wake it waits for is expected to end
	// after its deadline.
	OverflowLate = "late"
)

// Defaults of a remote model.
const (
	// DefaultRemoteHealth is a remote model's health path: the OpenAI
	// model list, which every OpenAI-compatible server answers (and
	// another napd answers with each model's state).
	DefaultRemoteHealth = "/v1/models"
	// DefaultAPIKeyHeader carries napd's credential as "Bearer KEY".
	DefaultAPIKeyHeader = "Authorization"
)

// remoteSchema decodes the keys of a remote model and of overflow.
func remoteSchema(m *Model) map[string]setter {
	return map[string]setter{
		"url":            setString(&m.URL, remoteURL),
		"api_key_file":   setString(&m.APIKeyFile, absPath),
		"api_key_header": setString(&m.APIKeyHeader, credentialHeader),
		"tls_ca_file":    setString(&m.TLSCAFile, absPath),
		"overflow":       setStrings(&m.Overflow, nil),
		"overflow_when":  setEnum(&m.OverflowWhen, OverflowRefused, OverflowLate),
	}
}

// remoteKeys are the keys a remote model may set: what reaching it and
// admitting requests to it take. The others shape an engine napd runs.
var remoteKeys = []string{
	"url", "api_key_file", "api_key_header", "tls_ca_file", "health", "health_interval", "health_failures",
	"served_name", "aliases", "max_concurrency", "queue", "listen", "listed", templateKey, varsKey,
}

// checkRemote checks the keys of a remote model (url set) against each
// other and refuses those of an engine napd would run; for a local model
// it refuses the remote-only keys.
func (d *decoder) checkRemote(m *Model, t *table, schema map[string]setter) {
	if !t.has("url") {
		for _, k := range []string{"api_key_file", "api_key_header", "tls_ca_file"} {
			if t.has(k) {
				d.addAt(t.at(k), "only used by a remote model (url)")
			}
		}
		if t.has("overflow_when") && !t.has("overflow") {
			d.addAt(t.at("overflow_when"), "only used with overflow")
		}
		return
	}
	for _, k := range slices.Sorted(maps.Keys(t.keys)) {
		if _, known := schema[k]; known && !slices.Contains(remoteKeys, k) {
			d.addAt(t.at(k), fmt.Sprintf("model %s is remote (url) and runs no engine here: %s is only used by models napd serves", m.Name, k))
		}
	}
	if !t.has("health") {
		m.Health = DefaultRemoteHealth
	}
	if t.has("api_key_header") && !t.has("api_key_file") {
		d.addAt(t.at("api_key_header"), "only used with api_key_file")
	}
	if t.has("tls_ca_file") && !strings.HasPrefix(m.URL, "https://") {
		d.addAt(t.at("tls_ca_file"), "only used with an https:// url")
	}
}

// checkOverflow checks each model's overflow list: remote models, by
// name, each once.
func (d *decoder) checkOverflow(decls []decl) {
	byName := make(map[string]*Model, len(decls))
	for _, dc := range decls {
		byName[dc.m.Name] = dc.m
	}
	for _, dc := range decls {
		at := dc.t.at("overflow")
		for i, name := range dc.m.Overflow {
			target := byName[name]
			switch {
			case slices.Index(dc.m.Overflow, name) < i:
				d.addAt(at, fmt.Sprintf("%q is listed twice", name))
			case target == nil:
				d.addAt(at, fmt.Sprintf("no model %q (overflow names remote models by name)", name))
			case !target.Remote():
				d.addAt(at, fmt.Sprintf("model %s is not a remote model (url): a request overflows only to a model served elsewhere", name))
			}
		}
	}
}

// remoteURL checks a remote model's url: http or https, a host, and no
// credentials, query or fragment (the credential is api_key_file's).
func remoteURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("bad url %q: %v", s, errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("url %q: want http:// or https://", s)
	case u.Hostname() == "":
		return fmt.Errorf("url %q has no host", s)
	case u.User != nil:
		return fmt.Errorf("url %q holds credentials: put the key in api_key_file", redactUser(u))
	case u.RawQuery != "" || u.Fragment != "" || strings.Contains(s, "?"):
		return fmt.Errorf("url %q: a remote's url has no query or fragment", s)
	}
	return nil
}

// redactUser is u without its password, for an error message.
func redactUser(u *url.URL) string {
	v := *u
	v.User = url.User("…")
	return v.String()
}

// credentialHeader checks api_key_header: a header name napd may set on
// the remote's requests (not one that frames the request or routes it).
func credentialHeader(s string) error {
	if s == "" || strings.IndexFunc(s, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
		return fmt.Errorf("%q is not a header name", s)
	}
	switch strings.ToLower(s) {
	case "host", "content-length", "content-type", "transfer-encoding", "connection", "te", "trailer",
		"upgrade", "keep-alive", "cookie", "expect":
		return fmt.Errorf("%q frames or routes the request: napd sets it itself", s)
	}
	if strings.HasPrefix(strings.ToLower(s), "proxy-") {
		return fmt.Errorf("%q is a header for a proxy, not for the remote", s)
	}
	return nil
}

// isTokenChar reports a character of an HTTP token (RFC 9110, 5.6.2).
func isTokenChar(r rune) bool {
	return r < 0x7f && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r))
}
