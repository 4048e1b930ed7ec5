package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napd/napd/tests/harness"
)

// upload posts a transcription form whose model field follows the file,
// as the OpenAI Node SDK writes it.
func upload(t *testing.T, n *harness.Napd, model string, file []byte, header ...string) (*http.Response, []byte) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.SetBoundary("napd-e2e-boundary")
	fw, _ := w.CreateFormFile("file", "speech.wav")
	fw.Write(file)
	w.WriteField("model", model)
	w.Close()
	req, err := http.NewRequestWithContext(ctxFor(t, 60*time.Second), "POST", n.URL("/v1/audio/transcriptions"), &b)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// A transcription upload is routed by its form field to the right engine,
// which it wakes; it is spooled past the model field's end, within
// max_body, and replayed for its Idempotency-Key like any other request.
// Aliases are listed, and Anthropic's route reaches the engine.
func TestBreadth_UploadsAliasesAndMessages(t *testing.T) {
	t.Parallel()
	chat, _ := demo(t, "chat", `aliases = ["default"]`)
	speech, speechEng := demo(t, "speech", "")
	n := harness.Start(t, harness.Options{Models: chat + speech, Gateway: `max_body = "1MiB"`})

	file := bytes.Repeat([]byte("RIFF"), 150<<10) // 600 KiB, beyond what napd keeps in memory
	key := []string{"Idempotency-Key", "tr-1"}
	resp, body := upload(t, n, "speech", file, key...)
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), `{"text":"speech.wav: 614400 bytes`) {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Napd-Wake-Ms") == "" {
		t.Errorf("the upload did not wait for a wake: %v", resp.Header)
	}
	resp, again := upload(t, n, "speech", file, key...)
	if resp.StatusCode != 200 || resp.Header.Get("X-Napd-Replayed") != "true" || !bytes.Equal(again, body) {
		t.Errorf("retry: %d replayed %q: %s", resp.StatusCode, resp.Header.Get("X-Napd-Replayed"), again)
	}
	resp, body = upload(t, n, "speech", bytes.Repeat([]byte("x"), 2<<20))
	wantError(t, resp, body, http.StatusRequestEntityTooLarge, "request_too_large")
	if s := speechEng.stats(t); s.Completions != 1 {
		t.Errorf("speech engine completions = %d, want 1 (one upload, one replay, one refused)", s.Completions)
	}
	if st := modelStatus(t, n, "chat"); st.State == "awake" {
		t.Errorf("an upload for speech woke chat: %+v", st)
	}

	get, err := http.Get(n.URL("/v1/models"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct {
			ID   string
			Napd struct {
				AliasOf string `json:"alias_of"`
			}
		}
	}
	json.NewDecoder(get.Body).Decode(&list)
	get.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID+"<"+m.Napd.AliasOf)
	}
	if strings.Join(ids, " ") != "chat< default<chat speech<" {
		t.Errorf("/v1/models: %v", ids)
	}

	resp, body, err = n.Post(ctxFor(t, 60*time.Second), "/v1/messages", `{"model":"chat","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), `"text":"tok1 tok2"`) {
		t.Errorf("/v1/messages: %v %d %s", err, resp.StatusCode, body)
	}
}

// llama.cpp's own routes reach the model they name: POST /completion by
// the body's model, GET /props by ?model=, each waking it like any route.
func TestBreadth_LlamaCppRoutes(t *testing.T) {
	t.Parallel()
	llama, llamaEng := demo(t, "llama", "", "--flavor", "llamacpp", "--max-num-seqs", "3")
	other, _ := demo(t, "other", "")
	n := harness.Start(t, harness.Options{Models: llama + other})
	ctx := ctxFor(t, 60*time.Second)

	resp, body, err := n.Post(ctx, "/completion", `{"model":"llama","prompt":"a b","n_predict":2}`)
	if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), `"content":"tok2 tok3"`) {
		t.Fatalf("POST /completion: %v %d %s", err, resp.StatusCode, body)
	}
	if resp.Header.Get("X-Napd-Wake-Ms") == "" {
		t.Errorf("POST /completion did not wake llama: %v", resp.Header)
	}
	if s := llamaEng.stats(t); s.Completions != 1 {
		t.Errorf("llama completions = %d", s.Completions)
	}
	get, err := http.Get(n.URL("/props?model=llama"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(get.Body)
	get.Body.Close()
	if get.StatusCode != 200 || !strings.Contains(string(body), `"total_slots":3`) {
		t.Errorf("GET /props?model=llama: %d %s", get.StatusCode, body)
	}
	if st := modelStatus(t, n, "other"); st.State == "awake" {
		t.Errorf("llama's routes woke other: %+v", st)
	}
	get, err = http.Get(n.URL("/props"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(get.Body)
	get.Body.Close()
	wantError(t, get, body, http.StatusBadRequest, "missing_model")
}
