package gateway

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
)

// APIKeys is a parsed api_keys_file: named bearer keys. Only SHA-256
// digests of the keys are kept, so every comparison has the same length.
type APIKeys struct {
	names   []string
	digests [][sha256.Size]byte
}

// LoadAPIKeys reads an api_keys_file: one "name:key" per line, '#'
// comments and blank lines ignored. Errors name the file and the line and
// never contain a key.
func LoadAPIKeys(path string) (*APIKeys, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	return parseAPIKeys(path, data)
}

func parseAPIKeys(file string, data []byte) (*APIKeys, error) {
	k := &APIKeys{}
	names := map[string]int{}
	digests := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, key, ok := strings.Cut(line, ":")
		name, key = strings.TrimSpace(name), strings.TrimSpace(key)
		switch {
		case !ok:
			return nil, fmt.Errorf("%s:%d: want \"name:key\"", file, n)
		case name == "":
			return nil, fmt.Errorf("%s:%d: empty key name", file, n)
		case key == "":
			return nil, fmt.Errorf("%s:%d: key %q is empty", file, n, name)
		case strings.ContainsAny(name, " \t"):
			return nil, fmt.Errorf("%s:%d: key name %q contains a space", file, n, name)
		case strings.ContainsAny(key, " \t"):
			return nil, fmt.Errorf("%s:%d: key %q contains a space", file, n, name)
		}
		if prev, dup := names[name]; dup {
			return nil, fmt.Errorf("%s:%d: key name %q already used on line %d", file, n, name, prev)
		}
		d := sha256.Sum256([]byte(key))
		if prev, dup := digests[d]; dup {
			return nil, fmt.Errorf("%s:%d: key %q repeats the key of line %d", file, n, name, prev)
		}
		names[name], digests[d] = n, n
		k.names = append(k.names, name)
		k.digests = append(k.digests, d)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(k.names) == 0 {
		return nil, fmt.Errorf("%s: no keys (remove api_keys_file to turn keys off)", file)
	}
	return k, nil
}

// Len is the number of keys.
func (k *APIKeys) Len() int { return len(k.names) }

// credential is the key a request presents: `Authorization: Bearer <key>`
// (the scheme in any case, as RFC 9110 has it) or, for Anthropic-style
// clients, `x-api-key: <key>`. ok is false when neither is present.
func credential(h http.Header) (key string, ok bool) {
	if a := h.Get("Authorization"); a != "" {
		scheme, token, found := strings.Cut(a, " ")
		if !found || !strings.EqualFold(scheme, "Bearer") {
			return "", false
		}
		return strings.TrimLeft(token, " "), true
	}
	if k := h.Get("X-Api-Key"); k != "" {
		return k, true
	}
	return "", false
}

// check matches the request's credential against every key and returns
// the matching key's name. It compares against all keys, in constant time,
// so timing reveals neither whether nor which key matched.
func (k *APIKeys) check(h http.Header) (string, bool) {
	token, ok := credential(h)
	d := sha256.Sum256([]byte(token))
	match := -1
	for i := range k.digests {
		if subtle.ConstantTimeCompare(d[:], k.digests[i][:]) == 1 {
			match = i
		}
	}
	if !ok || match < 0 {
		return "", false
	}
	return k.names[match], true
}
