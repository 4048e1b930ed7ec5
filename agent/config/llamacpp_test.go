package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

const llama = `command = ["llama-server", "-m", "/srv/m.gguf", "--port", "${PORT}"`

// sleep = "llamacpp": napd adds llama-server's own idle sleep from
// idle_timeout (whole seconds, rounded up), honours the one the command
// has, and adds none with idle_timeout 0 or for an operator's unit.
func TestParse_LlamaCppSleep(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		cmdTail []string
		self    time.Duration
	}{
		{"added from idle_timeout", llama + "]\nsleep = \"llamacpp\"\nidle_timeout = \"90.5s\"\n",
			[]string{"${PORT}", SleepIdleFlag, "91"}, 91 * time.Second},
		{"added from [policy]'s", llama + "]\nsleep = \"llamacpp\"\n", []string{"${PORT}", SleepIdleFlag, "900"}, 15 * time.Minute},
		{"honoured", llama + `, "--sleep-idle-seconds", "30"]` + "\nsleep = \"llamacpp\"\nidle_timeout = \"1h\"\n",
			[]string{"${PORT}", SleepIdleFlag, "30"}, 30 * time.Second},
		{"honoured, one argument", llama + `, "--sleep-idle-seconds=45"]` + "\nsleep = \"llamacpp\"\n",
			[]string{"${PORT}", SleepIdleFlag + "=45"}, 45 * time.Second},
		{"turned off in the command", llama + `, "--sleep-idle-seconds", "-1"]` + "\nsleep = \"llamacpp\"\n",
			[]string{SleepIdleFlag, "-1"}, 0},
		{"idle_timeout 0: none", llama + "]\nsleep = \"llamacpp\"\nidle_timeout = \"0\"\n", []string{"--port", "${PORT}"}, 0},
		{"another strategy: untouched", llama + "]\nsleep = \"stop\"\n", []string{"--port", "${PORT}"}, 0},
		{"the flag off with another strategy", llama + `, "--sleep-idle-seconds", "-1"]` + "\n", []string{SleepIdleFlag, "-1"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mustParse(t, "[models.a]\n"+tt.body)
			m := cfg.Models[0]
			if !slices.Equal(m.Command[len(m.Command)-len(tt.cmdTail):], tt.cmdTail) || m.SelfSleep != tt.self {
				t.Errorf("command %q, self sleep %s; want it to end %q, %s", m.Command, m.SelfSleep, tt.cmdTail, tt.self)
			}
		})
	}
	unit := mustParse(t, "[models.a]\nunit = \"llama.service\"\nport = 8001\nsleep = \"llamacpp\"\n")
	if m := unit.Models[0]; len(m.Command) != 0 || m.SelfSleep != 0 {
		t.Errorf("a unit's model: command %q, self sleep %s; want napd to add nothing", m.Command, m.SelfSleep)
	}
	notes := strings.Join(unit.CheckNotes(), "\n")
	if !strings.Contains(notes, "needs --sleep-idle-seconds N in the unit") {
		t.Errorf("check notes %q; want what the unit needs", notes)
	}
	added := mustParse(t, "[models.a]\n"+llama+"]\nsleep = \"llamacpp\"\nidle_timeout = \"2m\"\n")
	if notes := strings.Join(added.CheckNotes(), "\n"); !strings.Contains(notes, "model a: llama-server sleeps by itself after 2m0s without a task (--sleep-idle-seconds 120)") {
		t.Errorf("check notes %q", notes)
	}
}

func TestParse_LlamaCppSleepErrors(t *testing.T) {
	tests := []struct {
		name, body, msg string
	}{
		{"the engine sleeps unknown to napd", llama + `, "--sleep-idle-seconds", "300"]` + "\n",
			`makes llama-server sleep by itself, unknown to napd with sleep = "stop": set sleep = "llamacpp"`},
		{"zero", llama + `, "--sleep-idle-seconds", "0"]` + "\nsleep = \"llamacpp\"\n", "llama-server takes whole seconds, or -1 for never"},
		{"not a number", llama + `, "--sleep-idle-seconds=5m"]` + "\nsleep = \"llamacpp\"\n", `"5m": llama-server takes whole seconds`},
		{"no value", llama + `, "--sleep-idle-seconds"]` + "\nsleep = \"llamacpp\"\n", "--sleep-idle-seconds has no value"},
		{"a ZMQ worker", "transport = \"zmq\"\naddress = \"ipc:///run/w.sock\"\ncommand = [\"w\"]\nsleep = \"llamacpp\"\n", "needs an HTTP engine"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := problems(t, "[models.a]\n"+tt.body)
			if len(errs) != 1 || !strings.Contains(errs[0].Message, tt.msg) || errs[0].Line < 2 {
				t.Errorf("problems %v; want one on its line saying %q", errs, tt.msg)
			}
		})
	}
}
