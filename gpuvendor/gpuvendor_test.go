package gpuvendor

import "testing"

func TestFromPCI(t *testing.T) {
	for id, want := range map[string]string{
		"0x1002\n": AMD, "1002": AMD, "0x8086": Intel, "0x10DE": NVIDIA, "0x1af4": "", "": "",
	} {
		if got := FromPCI(id); got != want {
			t.Errorf("FromPCI(%q) = %q, want %q", id, got, want)
		}
	}
}
