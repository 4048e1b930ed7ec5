package enginemetrics

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

const fixtures = "../testdata/metrics/"

var textFormat = expfmt.NewFormat(expfmt.TypeTextPlain)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve answers /metrics with body and the given Content-Type.
func serve(t *testing.T, contentType string, body []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestScraper_Recorded(t *testing.T) {
	const promText = "text/plain; version=0.0.4; charset=utf-8"
	tests := []struct {
		file, contentType string
		want              Evidence
		idle              bool
	}{
		{"vllm.txt", promText, Evidence{Engine: "vllm", Running: 5, Waiting: 1, SleepState: "awake"}, false},
		{"vllm-sleeping.txt", promText, Evidence{Engine: "vllm", SleepState: "weights_offloaded"}, true},
		{"sglang.txt", promText, Evidence{Engine: "sglang"}, true},
		{"llamacpp.txt", promText, Evidence{}, false},
		{"vllm.openmetrics.txt", "application/openmetrics-text; version=1.0.0; charset=utf-8", Evidence{Engine: "vllm", Waiting: 4}, false},
		{"vllm.txt", "", Evidence{Engine: "vllm", Running: 5, Waiting: 1, SleepState: "awake"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			url := serve(t, tt.contentType, fixture(t, tt.file))
			got, err := Scraper{}.Scrape(context.Background(), url+"/")
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
			if got.Idle() != tt.idle {
				t.Errorf("Idle() = %v, want %v", got.Idle(), tt.idle)
			}
		})
	}
}

func TestScraper_FailureIsNoEvidence(t *testing.T) {
	broken := serve(t, "text/plain; version=0.0.4", []byte("vllm:num_requests_running{ 3\n"))
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for name, url := range map[string]string{"malformed": broken, "404": missing.URL, "refused": closed.URL} {
		got, err := Scraper{}.Scrape(context.Background(), url)
		if err == nil {
			t.Errorf("%s: want an error", name)
		}
		if got.Have() {
			t.Errorf("%s: evidence %+v, want none", name, got)
		}
	}
}

func TestScraper_HonoursDeadline(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := (Scraper{}).Scrape(ctx, srv.URL); err == nil {
		t.Error("want a deadline error")
	}
}

func TestParse_SumsAndClamps(t *testing.T) {
	text := "vllm:num_requests_running{engine=\"0\"} 0.5\nvllm:num_requests_running{engine=\"1\"} 1\nvllm:num_requests_waiting -3\n"
	got, err := Parse(bytes.NewReader([]byte(text)), textFormat)
	if err != nil {
		t.Fatal(err)
	}
	if got.Running != 2 || got.Waiting != 0 {
		t.Errorf("got %+v, want running 2 (rounded up), waiting 0 (clamped)", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"vllm.txt", "vllm-sleeping.txt", "sglang.txt", "llamacpp.txt"} {
		f.Add(fixture(f, name))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		ev, err := Parse(bytes.NewReader(text), textFormat)
		if err != nil {
			if ev != (Evidence{}) {
				t.Fatalf("error %v with evidence %+v", err, ev)
			}
			return
		}
		if ev.Running < 0 || ev.Waiting < 0 {
			t.Fatalf("negative counts %+v", ev)
		}
	})
}
