// Package logging builds napd's slog logger: under systemd (stderr is the
// journal stream) records go to journald natively, each attribute as its own
// field (MODEL=, STATE=, REASON=, UNIT=…), so `journalctl -u napd
// MODEL=qwen3-8b` works; elsewhere readable text goes to stderr.
//
// It owns the log format only. It must not decide what is logged, and
// nothing it formats may carry a prompt, a completion or a credential
// (callers pass none).
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/journal"
)

// ParseLevel maps a config log level to slog's.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (want debug, info, warn or error)", s)
}

// New returns the logger for the process: journald when stderr is connected
// to the journal (JOURNAL_STREAM matches), else text on stderr. level may be
// changed later (on reload) through the returned LevelVar.
func New(stderr io.Writer, level slog.Level) (*slog.Logger, *slog.LevelVar) {
	lv := new(slog.LevelVar)
	lv.Set(level)
	if ok, _ := journal.StderrIsJournalStream(); ok && journal.Enabled() {
		return slog.New(NewJournalHandler(journal.Send, lv)), lv
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv})), lv
}

// SendFunc delivers one journal entry; journal.Send in production.
type SendFunc func(message string, priority journal.Priority, vars map[string]string) error

// JournalHandler is a slog.Handler writing native journal entries.
type JournalHandler struct {
	send   SendFunc
	level  slog.Leveler
	attrs  []slog.Attr
	prefix string // group path, upper-cased with trailing '_'
	mu     *sync.Mutex
}

// NewJournalHandler returns a handler that sends each record with send.
func NewJournalHandler(send SendFunc, level slog.Leveler) *JournalHandler {
	return &JournalHandler{send: send, level: level, mu: new(sync.Mutex)}
}

// Enabled reports whether records at l are logged.
func (h *JournalHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

// Handle sends r as one journal entry.
func (h *JournalHandler) Handle(_ context.Context, r slog.Record) error {
	vars := make(map[string]string, len(h.attrs)+r.NumAttrs()+1)
	for _, a := range h.attrs {
		addField(vars, "", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		addField(vars, h.prefix, a)
		return true
	})
	if _, ok := vars["SYSLOG_IDENTIFIER"]; !ok {
		vars["SYSLOG_IDENTIFIER"] = "napd"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.send(r.Message, priority(r.Level), vars)
}

// WithAttrs returns a handler that adds attrs to every record.
func (h *JournalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), prefixed(h.prefix, attrs)...)
	return &c
}

// WithGroup returns a handler whose later attributes are named GROUP_KEY.
func (h *JournalHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.prefix = h.prefix + fieldName(name) + "_"
	return &c
}

func prefixed(prefix string, attrs []slog.Attr) []slog.Attr {
	if prefix == "" {
		return attrs
	}
	out := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		out[i] = slog.Attr{Key: prefix + a.Key, Value: a.Value}
	}
	return out
}

func addField(vars map[string]string, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += fieldName(a.Key) + "_"
		}
		for _, g := range v.Group() {
			addField(vars, p, g)
		}
		return
	}
	if a.Key == "" {
		return
	}
	vars[prefix+fieldName(a.Key)] = v.String()
}

// fieldName makes a journal field name: upper-case letters, digits and
// underscores, not starting with an underscore or a digit (journald drops
// fields that break these rules).
func fieldName(key string) string {
	var b strings.Builder
	for _, r := range key {
		switch {
		case r >= 'a' && r <= 'z':
			b.WriteRune(r - 'a' + 'A')
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), "_")
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		s = "F_" + s
	}
	return s
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	}
	return journal.PriDebug
}
