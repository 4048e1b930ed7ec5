package agent

import "testing"

func TestProcs(t *testing.T) {
	for _, c := range []struct {
		name        string
		cpus, avail int
		envSet      bool
		want        int
	}{
		{"one CPU", 0, 1, false, 1},
		{"two CPUs: one thread", 0, 2, false, 1},
		{"three CPUs: rounded up", 0, 3, false, 2},
		{"64 CPUs: half", 0, 64, false, 32},
		{"GOMAXPROCS from the environment stands", 0, 2, true, 2},
		{"agent.cpus wins over everything", 6, 2, true, 6},
		{"agent.cpus past the CPUs is the operator's choice", 8, 4, false, 8},
	} {
		if got := Procs(c.cpus, c.envSet, c.avail); got != c.want {
			t.Errorf("%s: Procs(%d, %v, %d) = %d, want %d", c.name, c.cpus, c.envSet, c.avail, got, c.want)
		}
	}
}
