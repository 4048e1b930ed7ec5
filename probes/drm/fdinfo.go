package drm

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Fdinfo is what /proc/PID/fdinfo/FD of an open DRM device says of its
// client, in the kernel's DRM client usage stats format
// (Documentation/gpu/drm-usage-stats.rst): one "key: value" a line, every
// standard key prefixed "drm-", memory values bytes with an optional KiB or
// MiB unit.
type Fdinfo struct {
	Driver string // drm-driver: the only mandatory key
	PDev   string // drm-pdev: the PCI address, "0000:c1:00.0"
	// ClientID is drm-client-id: one per struct drm_file, so that a client
	// reached through several fds (dup, fork, SCM_RIGHTS) counts once.
	ClientID     uint64
	HaveClientID bool
	// Resident and Total are bytes per memory region ("vram", "gtt",
	// "cpu" for amdgpu; "vram0", "system", "stolen" for xe; "local0",
	// "system0" for i915): drm-resident-<region>, or the older
	// drm-memory-<region> that means the same, and drm-total-<region>.
	Resident map[string]int64
	Total    map[string]int64
}

// DeviceMemory is the client's memory in the device's own memory regions
// (VRAM), the figure that competes for room on the GPU: per region its
// resident bytes, or its total where the driver reports no resident figure.
// ok is false when the client reports no device-memory region at all.
func (f Fdinfo) DeviceMemory() (bytes int64, ok bool) {
	for region, v := range f.Total {
		if _, res := f.Resident[region]; !res && deviceRegion(region) {
			bytes, ok = addBytes(bytes, v), true
		}
	}
	for region, v := range f.Resident {
		if deviceRegion(region) {
			bytes, ok = addBytes(bytes, v), true
		}
	}
	return bytes, ok
}

// deviceRegion tells the regions of device-local memory: amdgpu's and xe's
// "vram"/"vramN", i915's "localN". Host memory the GPU maps (gtt, cpu,
// system, stolen) is not the GPU's to make room in.
func deviceRegion(name string) bool {
	return strings.HasPrefix(name, "vram") || strings.HasPrefix(name, "local")
}

// ParseFdinfo reads one fdinfo file. ok is false for a file without
// drm-driver: not a DRM client (or a driver that publishes no stats). Lines
// that are not drm- keys (pos, flags, a driver's own amd-* keys) are
// skipped; a drm- memory or client-id value that is not what the format
// says is an error naming its line.
func ParseFdinfo(b []byte) (f Fdinfo, ok bool, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	n := 0
	for sc.Scan() {
		n++
		key, value, found := strings.Cut(sc.Text(), ":")
		if !found || !strings.HasPrefix(key, "drm-") {
			continue
		}
		value = strings.TrimSpace(value)
		switch {
		case key == "drm-driver":
			f.Driver = value
		case key == "drm-pdev":
			f.PDev = value
		case key == "drm-client-id":
			if f.ClientID, err = strconv.ParseUint(value, 10, 64); err != nil {
				return Fdinfo{}, false, fmt.Errorf("line %d: drm-client-id %q", n, value)
			}
			f.HaveClientID = true
		default:
			kind, region, mem := memoryKey(key)
			if !mem {
				continue // engine times, cycles, frequencies, shared/purgeable/active
			}
			v, err := parseBytes(value)
			if err != nil {
				return Fdinfo{}, false, fmt.Errorf("line %d: %s: %w", n, key, err)
			}
			switch kind {
			case "total":
				f.Total = set(f.Total, region, v)
			case "resident":
				f.Resident = set(f.Resident, region, v)
			case "memory":
				// The older key is the resident figure; a driver that
				// prints both agrees with itself, the newer one wins.
				if _, dup := f.Resident[region]; !dup {
					f.Resident = set(f.Resident, region, v)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Fdinfo{}, false, fmt.Errorf("line %d: %w", n+1, err)
	}
	return f, f.Driver != "", nil
}

// memoryKey splits drm-resident-vram into ("resident", "vram"): the memory
// keys napd reads. drm-memory-<region> is the older spelling of resident.
func memoryKey(key string) (kind, region string, ok bool) {
	for _, k := range []string{"total", "resident", "memory"} {
		if r, found := strings.CutPrefix(key, "drm-"+k+"-"); found && r != "" {
			return k, r, true
		}
	}
	return "", "", false
}

// addBytes adds two byte counts, saturating: figures from the kernel are
// far below it, a corrupt file must not wrap to a negative one.
func addBytes(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func set(m map[string]int64, k string, v int64) map[string]int64 {
	if m == nil {
		m = make(map[string]int64)
	}
	m[k] = v
	return m
}

// parseBytes reads "<uint> [KiB|MiB]": bytes by default. GiB is accepted
// too, for a driver that prints it.
func parseBytes(s string) (int64, error) {
	num, unit, _ := strings.Cut(s, " ")
	mult := int64(1)
	switch strings.TrimSpace(unit) {
	case "":
	case "KiB":
		mult = 1 << 10
	case "MiB":
		mult = 1 << 20
	case "GiB":
		mult = 1 << 30
	default:
		return 0, fmt.Errorf("%q: unit %q is not KiB or MiB", s, unit)
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a byte count", s)
	}
	if v > (1<<63-1)/mult {
		return 0, fmt.Errorf("%q overflows", s)
	}
	return v * mult, nil
}
