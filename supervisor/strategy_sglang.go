package supervisor

import "context"

// SGLang's memory saver. The endpoints take a JSON body (its tags field is
// optional; none means all memory), so an empty object is sent. SGLang has no
// endpoint that reports the state, so the 200 of a call that returns once
// the memory is released or resumed is the verification.
var (
	sglangReleaseCall = controlCall{path: "/release_memory_occupation", body: "{}"}
	sglangResumeCall  = controlCall{path: "/resume_memory_occupation", body: "{}"}
)

func sglangRelease(ctx context.Context, t target) error { return t.post(ctx, sglangReleaseCall) }

func sglangResume(ctx context.Context, t target) error { return t.post(ctx, sglangResumeCall) }
