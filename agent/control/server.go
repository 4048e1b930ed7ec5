package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/napd/napd/agent/lifecycle"
	"github.com/napd/napd/internal/statefile"
)

// ErrNotFound is wrapped by Controller errors about a model that does not exist.
var ErrNotFound = errors.New("no such model")

// Listen creates the control socket at path with mode 0660, owned by group
// "napd" when that group exists, so members of the group can run napctl.
// Its directory is created if absent and must be napd's alone (see
// statefile.Dir). Only a stale socket, one nothing answers on, left by a
// crashed napd, is replaced: a socket a running napd answers on, or
// anything that is not a socket, is an error and stays where it is.
func Listen(path string) (net.Listener, error) {
	if err := statefile.Dir(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket %s: directory: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	// Listen creates the file with the umask's mode: set ours explicitly.
	// The directory is napd's alone, so the path cannot be swapped.
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if g, err := user.LookupGroup("napd"); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil {
			if err := os.Lchown(path, -1, gid); err != nil {
				l.Close()
				return nil, fmt.Errorf("control socket %s: chown to group napd: %w", path, err)
			}
		}
	}
	return l, nil
}

// removeStale removes a socket at path that nothing answers on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("the path exists and is not a socket (mode %s); napd does not delete it", fi.Mode())
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		c.Close()
		return errors.New("a running napd answers on it; stop that one first (or set another control_socket)")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether it is stale: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale: %w", err)
	}
	return nil
}

// Handler serves the control API for c.
func Handler(c Controller, log *slog.Logger) http.Handler {
	s := newServer(c, log)
	mux := http.NewServeMux()
	s.register(mux, "")
	mux.HandleFunc("GET /v1/models/{model}/logs", s.logs)
	mux.HandleFunc("POST /v1/reload", s.reload)
	return mux
}

// AdminPrefix is where the gateway serves the admin API.
const AdminPrefix = "/napd"

// AdminHandler serves the part of the control API the gateway offers
// admins over HTTP, under AdminPrefix: status, wake, sleep, reset, usage
// and events, the latter as Server-Sent Events. Engine logs (which may hold
// prompts) and reload stay on the Unix socket. The caller authorises.
func AdminHandler(c Controller, log *slog.Logger) http.Handler {
	s := newServer(c, log)
	s.sse = true
	mux := http.NewServeMux()
	s.register(mux, AdminPrefix)
	return mux
}

func newServer(c Controller, log *slog.Logger) *server {
	if log == nil {
		log = slog.Default()
	}
	return &server{c: c, log: log}
}

// register adds the routes both handlers serve, under prefix.
func (s *server) register(mux *http.ServeMux, prefix string) {
	mux.HandleFunc("GET "+prefix+"/v1/status", s.status)
	mux.HandleFunc("POST "+prefix+"/v1/models/{model}/wake", s.wake)
	mux.HandleFunc("POST "+prefix+"/v1/models/{model}/sleep", s.sleep)
	mux.HandleFunc("POST "+prefix+"/v1/models/{model}/reset", s.reset)
	mux.HandleFunc("GET "+prefix+"/v1/events", s.events)
	mux.HandleFunc("GET "+prefix+"/v1/usage", s.usage)
}

type server struct {
	c   Controller
	log *slog.Logger
	sse bool // events as Server-Sent Events rather than NDJSON
}

func (s *server) status(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.c.Status())
}

func (s *server) wake(w http.ResponseWriter, r *http.Request) {
	model := r.PathValue("model")
	start := time.Now()
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	// Progress arrives from the agent's goroutines; the writer is ours alone.
	phases := make(chan Progress, 16)
	done := make(chan error, 1)
	go func() {
		done <- s.c.Wake(r.Context(), model, func(p Progress) {
			select {
			case phases <- p:
			default: // a slow reader loses intermediate phases, never the result
			}
		})
	}()
	emit := func(p Progress) {
		p.ElapsedMs = time.Since(start).Milliseconds()
		_ = enc.Encode(p)
		_ = rc.Flush()
	}
	for {
		select {
		case p := <-phases:
			emit(p)
		case err := <-done:
			// Phases sent before Wake returned are still queued: keep their order.
			for len(phases) > 0 {
				emit(<-phases)
			}
			final := Progress{Phase: lifecycle.Awake.String(), ElapsedMs: time.Since(start).Milliseconds(), Done: true}
			if errors.Is(err, ErrNotFound) {
				writeJSON(w, http.StatusNotFound, Error{err.Error()})
				return
			}
			if err != nil {
				final.Phase, final.Error = lifecycle.Failed.String(), err.Error()
			}
			_ = enc.Encode(final)
			return
		}
	}
}

func (s *server) sleep(w http.ResponseWriter, r *http.Request) {
	s.reply(w, s.c.Sleep(r.Context(), r.PathValue("model"), r.URL.Query().Get("strategy")))
}

func (s *server) reset(w http.ResponseWriter, r *http.Request) {
	s.reply(w, s.c.Reset(r.PathValue("model")))
}

func (s *server) logs(w http.ResponseWriter, r *http.Request) {
	n := 50
	if v := r.URL.Query().Get("lines"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 100000 {
			writeJSON(w, http.StatusBadRequest, Error{"lines: want a number from 1 to 100000"})
			return
		}
	}
	lines, err := s.c.Logs(r.PathValue("model"), n)
	if err != nil {
		s.reply(w, err)
		return
	}
	writeJSON(w, http.StatusOK, Logs{Lines: lines})
}

// usage serves ?since=DURATION (default 24h, at most MaxUsageSince).
func (s *server) usage(w http.ResponseWriter, r *http.Request) {
	since := 24 * time.Hour
	if v := r.URL.Query().Get("since"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > MaxUsageSince {
			writeJSON(w, http.StatusBadRequest, Error{fmt.Sprintf("since=%s: want a duration from 1s to %s, e.g. 24h", v, MaxUsageSince)})
			return
		}
		since = d
	}
	writeJSON(w, http.StatusOK, s.c.Usage(since))
}

func (s *server) reload(w http.ResponseWriter, _ *http.Request) {
	s.reply(w, s.c.Reload())
}

func (s *server) reply(w http.ResponseWriter, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, struct {
			OK bool `json:"ok"`
		}{true})
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, Error{err.Error()})
	default:
		writeJSON(w, http.StatusConflict, Error{err.Error()})
	}
}

// sseHeartbeat is how often an idle SSE stream gets a comment line, so
// proxies and browsers keep it open.
const sseHeartbeat = 30 * time.Second

func (s *server) events(w http.ResponseWriter, r *http.Request) {
	ch, cancel := s.c.Subscribe()
	defer cancel()
	if s.sse {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	enc := json.NewEncoder(w)
	var beat <-chan time.Time
	if s.sse {
		t := time.NewTicker(sseHeartbeat)
		defer t.Stop()
		beat = t.C
	}
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case <-beat:
			_, err = io.WriteString(w, ": heartbeat\n\n")
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if s.sse {
				// One event per message; JSON has no raw newlines, so one
				// data line carries it.
				_, err = io.WriteString(w, "event: "+string(ev.Kind)+"\ndata: ")
			}
			if err == nil {
				err = enc.Encode(ev) // ends with the newline the data line needs
			}
			if err == nil && s.sse {
				_, err = io.WriteString(w, "\n")
			}
		}
		if err != nil || rc.Flush() != nil {
			return
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
