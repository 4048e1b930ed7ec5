package daemon

import (
	"context"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// No request or response body and no credential reaches napd's log, at
// debug level: canaries in prompts (plain, streamed, passed through
// /upstream, malformed), in valid and invalid API keys, and in the engine's
// answer never show up in anything napd writes.
func TestLogs_NoBodiesOrCredentials(t *testing.T) {
	const (
		promptCanary = "CANARYPROMPT7f3a"
		keyCanary    = "sk-CANARYKEY91b2"
		badKeyCanary = "sk-CANARYBADKEY55c0"
		answerCanary = "tok918273645" // the demo engine answers tokSEED…
	)
	keys := filepath.Join(t.TempDir(), "api-keys")
	if err := os.WriteFile(keys, []byte("alice:"+keyCanary+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := harness.Start(t, harness.Options{
		Models:   demo("m", ""),
		Gateway:  "api_keys_file = " + strconv.Quote(keys),
		LogLevel: "debug",
	})
	ctx := context.Background()
	auth := []string{"Authorization", "Bearer " + keyCanary}
	chat := `{"model":"m","seed":918273645,"max_tokens":3,"messages":[{"role":"user","content":"` + promptCanary + `"}]}`
	if r := post(ctx, n, "m", chat, auth...); r.status != http.StatusOK || !strings.Contains(r.body, answerCanary) {
		t.Fatalf("chat: %v", r)
	}
	streamed := strings.Replace(chat, `"seed"`, `"stream":true,"seed"`, 1)
	if r := post(ctx, n, "m", streamed, auth...); r.status != http.StatusOK || !strings.Contains(r.body, answerCanary) {
		t.Fatalf("streamed chat: %v", r)
	}
	req, _ := http.NewRequest(http.MethodPost, n.URL("/upstream/m/v1/completions"),
		strings.NewReader(`{"model":"m","seed":918273645,"max_tokens":3,"prompt":"`+promptCanary+`"}`))
	req.Header.Set("Authorization", "Bearer "+keyCanary)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("upstream: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if r := post(ctx, n, "m", chat, "Authorization", "Bearer "+badKeyCanary); r.status != http.StatusUnauthorized {
		t.Fatalf("bad key: %v", r)
	}
	if r := post(ctx, n, "m", `{"model":"m","messages":"`+promptCanary, auth...); r.status != http.StatusBadRequest {
		t.Fatalf("malformed: %v", r)
	}
	n.Signal(syscall.SIGTERM)
	if err := n.Wait(15 * time.Second); err != nil {
		t.Fatalf("napd exit: %v", err)
	}

	log := n.Log()
	if !strings.Contains(log, "level=DEBUG msg=request") {
		t.Fatalf("no debug request lines: the log level did not apply\n%s", log)
	}
	for _, c := range []string{promptCanary, keyCanary, badKeyCanary, answerCanary} {
		if strings.Contains(log, c) {
			t.Errorf("napd's log contains %q", c)
		}
	}
}

// The control socket is created with mode 0660, owned by group napd when
// that group exists.
func TestControlSocket_Mode(t *testing.T) {
	n := harness.Start(t, harness.Options{Models: demo("m", "")})
	fi, err := os.Stat(n.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("control socket mode %v, want a socket with 0660", fi.Mode())
	}
	g, err := user.LookupGroup("napd")
	if err != nil {
		t.Logf("no group napd here (%v): the group ownership is not checked", err)
		return
	}
	if gid := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Gid)); gid != g.Gid {
		t.Errorf("control socket group %s, want napd (%s)", gid, g.Gid)
	}
}
