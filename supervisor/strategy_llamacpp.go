package supervisor

import (
	"context"
	"fmt"
)

// llama.cpp's own idle sleep (llama-server --sleep-idle-seconds N): after N
// seconds without a task the engine frees its weights and KV cache by
// itself, keeping its process, and GET /props says "is_sleeping": true;
// the next task reloads them and waits for that. /health, /props and
// /metrics are not tasks (they neither wake it nor hold its sleep off);
// /slots and /tokenize are (seen on llama-server built from source
// 3f545becc: the README of testdata/llamacpp). The engine has no endpoint
// to be put to sleep, so a sleep napd asks for stops it.
var llamacppStrategy = strategy{
	sleep:  stopSleep,
	wake:   llamacppWake,
	asleep: llamacppAsleep,
	self:   true,
}

// maxProps bounds llama.cpp's /props answer, which carries the model's
// chat template (tens of KiB for some models).
const maxProps = 4 << 20

// llamacppTokenize is napd's wake of a llama-server asleep by itself: an
// empty tokenize is a task that does nothing but reload the model, and its
// answer comes once the model is loaded.
var llamacppTokenize = controlCall{path: "/tokenize", body: `{"content":""}`}

func llamacppWake(ctx context.Context, t target) error {
	if err := t.post(ctx, llamacppTokenize); err != nil {
		return err
	}
	asleep, err := llamacppAsleep(ctx, t)
	switch {
	case err != nil:
		return err
	case asleep:
		return fmt.Errorf("after POST %s the engine reports is_sleeping=true", llamacppTokenize.path)
	}
	return nil
}

func llamacppAsleep(ctx context.Context, t target) (bool, error) {
	return isSleeping(ctx, t, "/props", maxProps)
}
