package supervisor

import (
	"context"
	"fmt"
	"net/http"

	"github.com/napd/napd/sleepmode"
)

// strategy is one sleep strategy. A nil field means the strategy has no such
// step: no sleep (none), no wake of a running engine (stop: wake is a start),
// no way to ask the engine whether it sleeps (stop, sglang).
type strategy struct {
	// sleep puts a running engine to sleep and verifies it sleeps.
	sleep func(ctx context.Context, t target) error
	// wake wakes an engine this strategy put to sleep and verifies it.
	wake func(ctx context.Context, t target) error
	// asleep asks the engine whether it sleeps.
	asleep func(ctx context.Context, t target) (bool, error)
	// self: the engine goes to sleep by itself (llama.cpp's idle sleep),
	// not only when napd asks; asleep tells when it has.
	self bool
}

// strategies is every sleep strategy by its name.
var strategies = map[string]strategy{
	sleepmode.Stop:     {sleep: stopSleep},
	sleepmode.VLLML1:   vllmStrategy(1),
	sleepmode.VLLML2:   vllmStrategy(2),
	sleepmode.SGLang:   {sleep: sglangRelease, wake: sglangResume},
	sleepmode.LlamaCpp: llamacppStrategy,
	sleepmode.None:     {},
}

// Sleeps reports whether the named strategy puts an engine to sleep
// (every one but none); an unknown name is an error.
func Sleeps(name string) (bool, error) {
	s, err := lookupStrategy(name)
	return s.sleep != nil, err
}

// KeepsEngine reports whether an engine asleep by the named strategy
// keeps its process (a wake wakes it rather than starting it): every one
// but stop (and none, which never sleeps).
func KeepsEngine(name string) bool {
	s, ok := strategies[name]
	return ok && s.wake != nil
}

// Performed is the strategy a sleep asked for by name leaves the engine
// in, as the model records it: a llama-server cannot be asked to sleep by
// itself, so napd's own sleep of one stops it.
func Performed(name string) string {
	if name == sleepmode.LlamaCpp {
		return sleepmode.Stop
	}
	return name
}

func lookupStrategy(name string) (strategy, error) {
	s, ok := strategies[name]
	if !ok {
		return strategy{}, fmt.Errorf("unknown sleep strategy %q", name)
	}
	return s, nil
}

// target is what a strategy acts on: the engine's process through the
// backend, and its HTTP control endpoints.
type target struct {
	spec    Spec
	backend Backend
	client  *http.Client
}

// stopSleep stops the engine and verifies no process is left.
func stopSleep(ctx context.Context, t target) error {
	if err := t.backend.Stop(ctx, t.spec); err != nil {
		return err
	}
	st, err := t.backend.Status(ctx, t.spec)
	if err != nil {
		return fmt.Errorf("status after stop: %w", err)
	}
	if st.State != ProcStopped && st.State != ProcFailed {
		return fmt.Errorf("engine still %s after stop", st.State)
	}
	return nil
}
