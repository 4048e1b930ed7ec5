package demoengine

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func TestEmbeddings(t *testing.T) {
	h := newEngine(Options{Models: []string{"emb"}}).Handler()
	rec := do(h, "POST", "/v1/embeddings", `{"model":"emb","input":["a b","c"]}`)
	wantCode(t, rec, http.StatusOK)
	type resp struct {
		Object string
		Model  string
		Data   []struct {
			Object    string
			Index     int
			Embedding any
		}
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	floats := decode[resp](t, rec)
	if floats.Object != "list" || floats.Model != "emb" || len(floats.Data) != 2 || floats.Usage.PromptTokens != 3 ||
		floats.Data[1].Index != 1 || len(floats.Data[0].Embedding.([]any)) != embeddingDims {
		t.Fatalf("floats %+v", floats)
	}
	// base64, as the OpenAI SDKs ask by default: the same vector.
	rec = do(h, "POST", "/v1/embeddings", `{"model":"emb","input":"a b","encoding_format":"base64"}`)
	wantCode(t, rec, http.StatusOK)
	b, err := base64.StdEncoding.DecodeString(decode[resp](t, rec).Data[0].Embedding.(string))
	if err != nil || len(b) != 4*embeddingDims {
		t.Fatalf("base64 embedding: %v, %d bytes", err, len(b))
	}
	var got, want []float32
	for i := 0; i < len(b); i += 4 {
		got = append(got, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
	}
	for _, f := range floats.Data[0].Embedding.([]any) {
		want = append(want, float32(f.(float64)))
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("base64 %v != floats %v", got, floats.Data[0].Embedding)
	}
	wantCode(t, do(h, "POST", "/v1/embeddings", `{"model":"other","input":"x"}`), http.StatusNotFound)
	wantCode(t, do(h, "POST", "/v1/embeddings", `{"model":"emb","input":{}}`), http.StatusBadRequest)
	wantCode(t, do(h, "POST", "/v1/embeddings", `{"model":"emb","input":"x","encoding_format":"f16"}`), http.StatusBadRequest)
}

func TestTranscription(t *testing.T) {
	h := newEngine(Options{Models: []string{"whisper"}}).Handler()
	post := func(fields map[string]string, file []byte) *httptest.ResponseRecorder {
		var b bytes.Buffer
		w := multipart.NewWriter(&b)
		for k, v := range fields {
			w.WriteField(k, v)
		}
		if file != nil {
			fw, _ := w.CreateFormFile("file", "a.wav")
			fw.Write(file)
		}
		w.Close()
		req := httptest.NewRequest("POST", "/v1/audio/transcriptions", &b)
		req.Header.Set("Content-Type", w.FormDataContentType())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := post(map[string]string{"model": "whisper"}, []byte("RIFF"))
	wantCode(t, rec, http.StatusOK)
	if got := decode[map[string]string](t, rec)["text"]; !strings.HasPrefix(got, "a.wav: 4 bytes, sha256 ") {
		t.Errorf("text %q", got)
	}
	rec = post(map[string]string{"model": "whisper", "response_format": "text"}, []byte("RIFF"))
	wantCode(t, rec, http.StatusOK)
	if !strings.HasPrefix(rec.Body.String(), "a.wav: 4 bytes") || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Errorf("text answer %q (%s)", rec.Body, rec.Header().Get("Content-Type"))
	}
	wantCode(t, post(map[string]string{"model": "nope"}, []byte("x")), http.StatusNotFound)
	wantCode(t, post(map[string]string{"model": "whisper"}, nil), http.StatusBadRequest)
	wantCode(t, post(map[string]string{"model": "whisper", "response_format": "srt"}, []byte("x")), http.StatusBadRequest)
}

func TestMessages(t *testing.T) {
	h := newEngine(Options{Models: []string{"claude"}}).Handler()
	rec := do(h, "POST", "/v1/messages", `{"model":"claude","max_tokens":3,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}]}`)
	wantCode(t, rec, http.StatusOK)
	type msg struct {
		Type, Role, Model string
		Content           []struct{ Type, Text string }
		StopReason        string `json:"stop_reason"`
		Usage             struct {
			Input  int `json:"input_tokens"`
			Output int `json:"output_tokens"`
		}
	}
	m := decode[msg](t, rec)
	if m.Type != "message" || m.Role != "assistant" || m.Model != "claude" || len(m.Content) != 1 ||
		m.Content[0].Text != "tok4 tok5 tok6" || m.StopReason != "max_tokens" || m.Usage.Input != 4 || m.Usage.Output != 3 {
		t.Errorf("message %+v", m)
	}

	rec = do(h, "POST", "/v1/messages", `{"model":"claude","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	wantCode(t, rec, http.StatusOK)
	var events []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if ev, ok := strings.CutPrefix(line, "event: "); ok {
			events = append(events, ev)
		}
	}
	want := []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
	if !reflect.DeepEqual(events, want) || !strings.Contains(rec.Body.String(), `"text":" tok2"`) {
		t.Errorf("events %v\n%s", events, rec.Body)
	}

	rec = do(h, "POST", "/v1/messages/count_tokens", `{"model":"claude","messages":[{"role":"user","content":"one two three"}]}`)
	wantCode(t, rec, http.StatusOK)
	if n := decode[map[string]int](t, rec)["input_tokens"]; n != 3 {
		t.Errorf("input_tokens %d", n)
	}
	wantCode(t, do(h, "POST", "/v1/messages", `{"model":"claude","messages":[{"role":"user","content":"x"}]}`), http.StatusBadRequest)
	wantCode(t, do(h, "POST", "/v1/messages", `{"model":"claude","max_tokens":1,"messages":[]}`), http.StatusBadRequest)
	wantCode(t, do(h, "POST", "/v1/messages", `{"model":"gpt","max_tokens":1,"messages":[{"role":"user","content":"x"}]}`), http.StatusNotFound)
}

func TestLlamaCppCompletionAndProps(t *testing.T) {
	h := newEngine(Options{Models: []string{"llama"}, Flavor: FlavorLlamaCpp, MaxNumSeqs: 4}).Handler()
	rec := do(h, "POST", "/completion", `{"model":"whatever","prompt":"a b","n_predict":2}`)
	wantCode(t, rec, http.StatusOK)
	c := decode[map[string]any](t, rec)
	if c["content"] != "tok2 tok3" || c["tokens_predicted"] != 2.0 || c["stop"] != true {
		t.Errorf("completion %v", c)
	}
	wantCode(t, do(h, "POST", "/completion", `{"prompt":"a","stream":true}`), http.StatusBadRequest)
	rec = do(h, "GET", "/props", "")
	wantCode(t, rec, http.StatusOK)
	if p := decode[map[string]any](t, rec); p["total_slots"] != 4.0 || p["is_sleeping"] != false {
		t.Errorf("props %v", p)
	}
	// Only the llamacpp flavor serves them.
	vllm := newEngine(Options{Models: []string{"m"}}).Handler()
	wantCode(t, do(vllm, "GET", "/props", ""), http.StatusNotFound)
}
