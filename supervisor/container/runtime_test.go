package container

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A runtime command is bounded: in time (callTimeout unless the caller's
// context has a deadline) and in what napd keeps of its output.
func TestClient_Bounds(t *testing.T) {
	sh := client{kind: "sh", program: "/bin/sh"}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	began := time.Now()
	_, err := sh.run(ctx, nil, "-c", "echo starting >&2; exec sleep 30")
	var re *Error
	if !errors.As(err, &re) || !strings.Contains(re.Message, "starting") || !strings.Contains(re.Message, "deadline exceeded") || time.Since(began) > 10*time.Second {
		t.Errorf("a command past its deadline: %v after %s", err, time.Since(began))
	}
	out, err := sh.run(context.Background(), nil, "-c", "head -c 10000000 /dev/zero")
	if err != nil || len(out) != maxOutput {
		t.Errorf("a runaway answer: %d bytes kept (%v), want %d", len(out), err, maxOutput)
	}
	bctx, bcancel := bounded(context.Background())
	defer bcancel()
	if d, ok := bctx.Deadline(); !ok || time.Until(d) > callTimeout {
		t.Errorf("no bound without a deadline: %v %v", d, ok)
	}
	// The container's variables reach the runtime's environment, not its
	// command line.
	out, err = sh.run(context.Background(), map[string]string{"HF_TOKEN": "hf_x"}, "-c", `printf %s "$HF_TOKEN"`)
	if err != nil || string(out) != "hf_x" {
		t.Errorf("extra environment: %q %v", out, err)
	}
}
