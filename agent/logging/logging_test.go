package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"
)

type entry struct {
	msg  string
	prio journal.Priority
	vars map[string]string
}

func capture() (*[]entry, SendFunc) {
	var got []entry
	return &got, func(m string, p journal.Priority, v map[string]string) error {
		got = append(got, entry{m, p, v})
		return nil
	}
}

func TestJournalHandler_Fields(t *testing.T) {
	got, send := capture()
	log := slog.New(NewJournalHandler(send, slog.LevelInfo)).With("model", "qwen3-8b")
	log.Info("model woke", "state", "awake", "wake-ms", 412, slog.Group("gpu", "free_bytes", 1024))
	log.Debug("dropped")
	log.Error("sleep failed", "reason", "is_sleeping says false", "unit", "napd-engine-qwen3-8b.service")

	if len(*got) != 2 {
		t.Fatalf("got %d entries, want 2 (debug is below the level)", len(*got))
	}
	e := (*got)[0]
	want := map[string]string{
		"MODEL": "qwen3-8b", "STATE": "awake", "WAKE_MS": "412", "GPU_FREE_BYTES": "1024",
		"SYSLOG_IDENTIFIER": "napd",
	}
	for k, v := range want {
		if e.vars[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, e.vars[k], v, e.vars)
		}
	}
	if e.msg != "model woke" || e.prio != journal.PriInfo {
		t.Errorf("entry = %q prio %d", e.msg, e.prio)
	}
	e = (*got)[1]
	if e.prio != journal.PriErr || e.vars["UNIT"] != "napd-engine-qwen3-8b.service" || e.vars["REASON"] == "" {
		t.Errorf("error entry = %+v", e)
	}
}

func TestJournalHandler_GroupPrefix(t *testing.T) {
	got, send := capture()
	slog.New(NewJournalHandler(send, slog.LevelInfo)).WithGroup("planner").With("rule", "idle").Info("x", "model", "m")
	v := (*got)[0].vars
	if v["PLANNER_RULE"] != "idle" || v["PLANNER_MODEL"] != "m" {
		t.Errorf("vars = %v", v)
	}
}

func TestFieldName(t *testing.T) {
	for in, want := range map[string]string{
		"model": "MODEL", "wake-ms": "WAKE_MS", "_x": "X", "9lives": "F_9LIVES", "": "F_", "a.b": "A_B",
	} {
		if got := fieldName(in); got != want {
			t.Errorf("fieldName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNew_TextOutsideJournal(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	var buf bytes.Buffer
	log, lv := New(&buf, slog.LevelWarn)
	log.Info("hidden")
	lv.Set(slog.LevelInfo)
	log.Info("shown", "model", "m")
	if strings.Contains(buf.String(), "hidden") || !strings.Contains(buf.String(), "model=m") {
		t.Errorf("output = %q", buf.String())
	}
}

func TestParseLevel(t *testing.T) {
	if l, err := ParseLevel("debug"); err != nil || l != slog.LevelDebug {
		t.Errorf("debug: %v %v", l, err)
	}
	if _, err := ParseLevel("loud"); err == nil {
		t.Error("loud: want error")
	}
}
