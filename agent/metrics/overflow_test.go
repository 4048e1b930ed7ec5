package metrics

import (
	"testing"

	"github.com/napd/napd/gateway"
	"github.com/napd/napd/request"
)

// An overflowed request counts under the model it asked for, and once per
// target in napd_overflow_requests_total; a removed model or target takes
// its series along.
func TestMetrics_OverflowPerTarget(t *testing.T) {
	m := New(func() Snapshot { return Snapshot{} })
	for _, o := range []gateway.Observation{
		{Model: "b", Kind: request.Chat, Status: 200, Admitted: true, ServedBy: "cloud"},
		{Model: "b", Kind: request.Chat, Status: 200, Admitted: true, ServedBy: "cloud"},
		{Model: "b", Kind: request.Chat, Status: 502, Admitted: true, ServedBy: "box2"},
		{Model: "b", Kind: request.Chat, Status: 200, Admitted: true},
	} {
		m.Request(o)
	}
	fams := scrape(t, m)
	for labels, want := range map[[3]string]float64{{"b", "cloud", "200"}: 2, {"b", "box2", "502"}: 1} {
		got, ok := value(fams["napd_overflow_requests_total"], map[string]string{"model": labels[0], "target": labels[1], "code": labels[2]})
		if !ok || got != want {
			t.Errorf("overflow %v = %v (%v), want %v", labels, got, ok, want)
		}
	}
	if got, _ := value(fams["napd_requests_total"], map[string]string{"model": "b", "code": "200"}); got != 3 {
		t.Errorf("b's 200s = %v, want 3 (overflowed ones too)", got)
	}
	m.Forget("box2")
	if got := len(scrape(t, m)["napd_overflow_requests_total"].GetMetric()); got != 1 {
		t.Errorf("after box2 was removed: %d series, want cloud's", got)
	}
}
