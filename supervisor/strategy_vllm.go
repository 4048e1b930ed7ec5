package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// vllmWakeLevel2 wakes an engine slept at level 2, whose weights were
// discarded: restore the weight buffers, reload the weights, restore the KV
// cache, and drop prefix-cache entries that point into the old cache.
var vllmWakeLevel2 = []controlCall{
	{path: "/wake_up?tags=weights"},
	{path: "/collective_rpc", body: `{"method":"reload_weights"}`},
	{path: "/wake_up?tags=kv_cache"},
	{path: "/reset_prefix_cache"},
}

// vllmWakeLevel1 wakes an engine whose weights wait in host RAM.
var vllmWakeLevel1 = []controlCall{{path: "/wake_up"}}

// vllmStrategy is vLLM's sleep mode at level 1 or 2. The level is a query
// parameter: vLLM ignores a JSON body and would sleep at level 1.
func vllmStrategy(level int) strategy {
	wakeCalls := vllmWakeLevel1
	if level == 2 {
		wakeCalls = vllmWakeLevel2
	}
	sleepPath := "/sleep?level=" + strconv.Itoa(level)
	return strategy{
		sleep: func(ctx context.Context, t target) error {
			if err := t.post(ctx, controlCall{path: sleepPath}); err != nil {
				return err
			}
			return vllmExpect(ctx, t, true, "POST "+sleepPath)
		},
		wake: func(ctx context.Context, t target) error {
			for _, c := range wakeCalls {
				if err := t.post(ctx, c); err != nil {
					return err
				}
			}
			return vllmExpect(ctx, t, false, "wake")
		},
		asleep: vllmIsSleeping,
	}
}

// vllmExpect verifies, after step, that the engine's /is_sleeping says want.
func vllmExpect(ctx context.Context, t target, want bool, step string) error {
	got, err := vllmIsSleeping(ctx, t)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("after %s the engine reports is_sleeping=%t", step, got)
	}
	return nil
}

func vllmIsSleeping(ctx context.Context, t target) (bool, error) {
	return isSleeping(ctx, t, "/is_sleeping", maxControlAnswer)
}

// isSleeping reads the is_sleeping of the JSON object at path (an answer
// of at most limit bytes).
func isSleeping(ctx context.Context, t target, path string, limit int64) (bool, error) {
	body, err := t.getBounded(ctx, path, limit)
	if err != nil {
		return false, err
	}
	sleeping, err := parseIsSleeping(body)
	if err != nil {
		return false, fmt.Errorf("GET %s: %w", path, err)
	}
	return sleeping, nil
}

// parseIsSleeping reads vLLM's {"is_sleeping": true|false}; the key must be
// there, since a missing one would read as "awake".
func parseIsSleeping(b []byte) (bool, error) {
	var v struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return false, fmt.Errorf("bad answer: %w", err)
	}
	if v.IsSleeping == nil {
		return false, errors.New("answer lacks is_sleeping")
	}
	return *v.IsSleeping, nil
}
