package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// A prompt, a completion or a key must never reach the log, whatever the
// outcome of the request.
func TestGateway_LogsNeverCarryBodiesOrKeys(t *testing.T) {
	const prompt, completion, key = "CANARY-PROMPT-7f3a", "CANARY-COMPLETION-9b1c", "sk-CANARY-KEY-42"
	keys, err := parseAPIKeys("keys", []byte("alice:"+key+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"choices":[{"text":"` + completion + `"}]}`))
	}, Options{APIKeys: keys, MaxBody: 200})
	auth := map[string]string{"Authorization": "Bearer " + key, HeaderIdempotencyKey: "idem"}
	bodies := []string{
		`{"model":"m1","prompt":"` + prompt + `"}`,                     // 200
		`{"model":"m1","prompt":"` + prompt + `"`,                      // 400
		`{"model":"` + prompt + `"}`,                                   // 404 names the model to the client only
		`{"model":"m1","prompt":"` + strings.Repeat(prompt, 20) + `"}`, // 413
	}
	for _, b := range bodies {
		resp, _ := e.do("POST", "/v1/completions", b, auth)
		if resp.StatusCode == 200 {
			e.models.outcome()
		}
	}
	e.do("POST", "/v1/completions", bodies[0], map[string]string{"Authorization": "Bearer " + key + "x"}) // 401
	e.engine.Close()
	e.do("POST", "/v1/completions", bodies[0], auth) // 502
	e.models.outcome()

	logs := e.logs.String()
	if n := strings.Count(logs, `"msg":"request"`); n != 6 {
		t.Errorf("%d request lines, want 6:\n%s", n, logs)
	}
	if strings.Contains(logs, "CANARY") {
		t.Errorf("log carries a canary:\n%s", logs)
	}
}
