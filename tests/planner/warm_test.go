package planner

import (
	"context"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// warm_on_start wakes a as napd starts, with no request; with max_awake = 2,
// b's wake finds room and c's puts a, the least recently used idle model, to
// sleep first (decision reason max-awake).
func TestWarm_OnStartAndMaxAwake(t *testing.T) {
	n := harness.Start(t, harness.Options{
		Policy: "max_awake = 2\n",
		Models: demo("a", "warm_on_start = true\n") + demo("b", "") + demo("c", ""),
		Env:    fakeGPU(t, 80<<10, map[string]int{"a": 4 << 10, "b": 4 << 10, "c": 4 << 10}),
	})
	n.WaitLog(`msg="warm wake" model=a why=warm_on_start`, 10*time.Second)
	state := func(model, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for s := statusOf(t, n, model); s.State != want; s = statusOf(t, n, model) {
			if time.Now().After(deadline) {
				t.Fatalf("%s is %s, want %s", model, s.State, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	state("a", "awake")
	if n := engineStarts(n); n != 1 {
		t.Errorf("%d engines started, want a's only", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, model := range []string{"b", "c"} {
		if resp, body := post(t, n, ctx, model, 2); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, body)
		}
	}
	state("a", "sleeping")
	state("b", "awake")
	state("c", "awake")
	if !regexp.MustCompile(`msg="planner decision" model=a .*decision.reason=max-awake`).MatchString(n.Log()) {
		t.Errorf("the log lacks a's max-awake decision:\n%s", n.Log())
	}
}
