package daemon

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/agent/control"
	"github.com/napd/napd/agent/loadprogress"
	"github.com/napd/napd/tests/harness"
)

// A demo engine that reads its 48 MiB weights file at 8 MiB/s at start,
// as a real engine reads its weights: while it wakes, napd measures the
// bytes it read against the file's size. A streaming request waiting for
// it gets the load in its comments, napctl wake prints it at each tenth,
// napctl's status and /v1/models show it, and the figures grow.
func TestLoadProgress_DemoEngineReadingItsWeights(t *testing.T) {
	weights := filepath.Join(t.TempDir(), "weights.gguf")
	if err := os.WriteFile(weights, make([]byte, 48<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	n := harness.Start(t, harness.Options{
		Models: harness.DemoModel("big", "wake_progress = true", "--load-file", weights, "--load-rate", "8MiB"),
	})
	comment := make(chan string, 1)
	go func() {
		resp, err := http.Post(n.URL("/v1/chat/completions"), "application/json", strings.NewReader(harness.Chat("big", true, 1)))
		if err != nil {
			comment <- err.Error()
			return
		}
		defer resp.Body.Close()
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		comment <- line
	}()
	n.WaitLeases("big", 1, 10*time.Second)
	woke := make(chan string, 1)
	go func() {
		out, _ := n.Napctl("wake", "big")
		woke <- out
	}()
	st := n.WaitModel("big", 20*time.Second, func(m control.ModelStatus) bool {
		return m.Load != nil && m.Load.Progress != nil && *m.Load.Progress > 0.1
	})
	if st.Load.WeightBytes != 48<<20 || st.State != "waking" {
		t.Errorf("status while loading: %s, load %+v; want waking against 48 MiB", st.State, st.Load)
	}
	resp, err := http.Get(n.URL("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			Napd struct {
				Load *loadprogress.Wire `json:"load"`
			} `json:"napd"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || len(list.Data) != 1 || list.Data[0].Napd.Load == nil || list.Data[0].Napd.Load.ReadBytes == 0 {
		t.Errorf("/v1/models while loading: %+v, %v; want napd.load", list, err)
	}
	var out string
	select {
	case out = <-woke:
	case <-time.After(30 * time.Second):
		t.Fatal("napctl wake did not end")
	}
	percents := regexp.MustCompile(`(?m)^big: waking \[[#-]{20}\] (\d+) % \(\d+\.\d of 48\.0 MiB\)`).FindAllStringSubmatch(out, -1)
	if len(percents) < 3 || !strings.Contains(out, "big: awake after") {
		t.Fatalf("napctl wake printed %d load lines, want one a tenth:\n%s", len(percents), out)
	}
	last := -1
	for _, p := range percents {
		v, _ := strconv.Atoi(p[1])
		if v < last {
			t.Errorf("progress went back from %d to %d %%:\n%s", last, v, out)
		}
		last = v
	}
	// wake_progress's first comment comes after 3 s of the 6 s load.
	if c := <-comment; !regexp.MustCompile(`^: big loading \d+ % \(\d+\.\d of 48\.0 MiB\), about \d+ s left\n$`).MatchString(c) {
		t.Errorf("the waiting stream's first line %q, want the load's progress", c)
	}
	if m := n.ModelStatus("big"); m.State != "awake" || m.Load != nil {
		t.Errorf("after the wake: %s, load %+v", m.State, m.Load)
	}
}
