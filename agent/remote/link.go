package remote

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/napd/napd/agent/config"
	"github.com/napd/napd/gateway"
	"github.com/napd/napd/internal/statefile"
)

// Link is what reaching one remote model takes, made from its config: its
// root URL, its health check's URL, its transport and napd's credential.
// It is made before a config generation is applied, so a credential or CA
// file that cannot be read refuses the reload and changes nothing.
type Link struct {
	cfg    *config.Model
	root   *url.URL
	health *url.URL
	tr     *http.Transport
	client *http.Client // the health checks'
	remote *gateway.Remote
}

// Bounds of the files a remote model names.
const (
	maxCredential = 16 << 10
	maxCAFile     = 1 << 20
)

// NewLink makes the link of remote model cfg, reading its api_key_file
// and tls_ca_file.
func NewLink(cfg *config.Model) (*Link, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("model %s: url: %w", cfg.Name, err)
	}
	root := Root(u)
	health, err := url.Parse(root.String() + cfg.Health)
	if err != nil {
		return nil, fmt.Errorf("model %s: health: %w", cfg.Name, err)
	}
	opts := gateway.RemoteTransportOptions{MaxIdle: cfg.MaxConcurrency}
	if cfg.TLSCAFile != "" {
		if opts.RootCAs, err = ReadCA(cfg.TLSCAFile); err != nil {
			return nil, fmt.Errorf("model %s: tls_ca_file: %w", cfg.Name, err)
		}
	}
	l := &Link{cfg: cfg, root: root, health: health, tr: gateway.NewRemoteTransport(opts),
		remote: &gateway.Remote{Name: cfg.Name, Where: u.Host}}
	l.client = &http.Client{Transport: l.tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse // an answer is an answer: napd's credential follows no redirect
	}}
	if cfg.APIKeyFile != "" {
		key, err := ReadCredential(cfg.APIKeyFile)
		if err != nil {
			return nil, fmt.Errorf("model %s: api_key_file: %w", cfg.Name, err)
		}
		l.remote.Credential = Credential(cfg.APIKeyHeader, key)
	}
	return l, nil
}

// Root is the root of a remote model's url, which every request path is
// appended to: the url itself, less a final "/v1" (an OpenAI base URL,
// "https://api.example.com/v1", stands for its host's /v1 routes), so
// napd's /v1/chat/completions is the remote's.
func Root(u *url.URL) *url.URL {
	r := *u
	r.Path = strings.TrimSuffix(strings.TrimSuffix(r.Path, "/"), "/v1")
	r.RawPath = ""
	return &r
}

// Credential is the header that carries key: "Authorization: Bearer KEY",
// or KEY alone in any other header (x-api-key for Anthropic's API).
func Credential(header, key string) http.Header {
	h := http.CanonicalHeaderKey(header)
	if h == "Authorization" {
		key = "Bearer " + key
	}
	return http.Header{h: {key}}
}

// ReadCredential reads an api_key_file: one key on one line (a final
// newline allowed), in a file others may not read. Errors never show the
// key.
func ReadCredential(path string) (string, error) {
	b, err := statefile.ReadPrivate(path, maxCredential)
	if err != nil {
		return "", err
	}
	key := string(bytes.TrimSpace(b))
	switch {
	case key == "":
		return "", fmt.Errorf("%s is empty", path)
	case strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "", fmt.Errorf("%s holds more than one key on one line (a space, a second line or a control character)", path)
	}
	return key, nil
}

// ReadCA reads a tls_ca_file: PEM certificates, the only ones a remote's
// certificate is checked against.
func ReadCA(path string) (*x509.CertPool, error) {
	b, err := statefile.ReadRegular(path, maxCAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New(path + " holds no PEM certificate")
	}
	return pool, nil
}

// Name is the remote model's name.
func (l *Link) Name() string { return l.cfg.Name }

// Close ends the link's idle connections; requests under way finish on
// their own.
func (l *Link) Close() { l.tr.CloseIdleConnections() }
