package gpu

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/napd/napd/gpuvendor"
)

// Arguments of the two nvidia-smi queries. noheader,nounits makes every
// memory figure a bare integer in MiB.
var (
	smiGPUArgs  = []string{"--query-gpu=index,uuid,name,memory.total,memory.used,memory.free", "--format=csv,noheader,nounits"}
	smiAppsArgs = []string{"--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"}
)

const mib = 1 << 20

// SMI is the Probe that runs nvidia-smi.
type SMI struct {
	// Path is the nvidia-smi binary.
	Path string
	// Timeout bounds each run; 0 means 10s. nvidia-smi hangs for a long
	// time when the driver is wedged, and a probe must not stall the agent.
	Timeout time.Duration
}

// Snapshot implements Probe.
func (s *SMI) Snapshot(ctx context.Context) (Snapshot, error) {
	out, err := s.run(ctx, smiGPUArgs)
	if err != nil {
		return Snapshot{}, err
	}
	devices, err := ParseSMIGPUs(out)
	if err != nil {
		return Snapshot{}, fmt.Errorf("nvidia-smi --query-gpu: %w", err)
	}
	out, err = s.run(ctx, smiAppsArgs)
	if err != nil {
		return Snapshot{}, err
	}
	procs, err := ParseSMIApps(out)
	if err != nil {
		return Snapshot{}, fmt.Errorf("nvidia-smi --query-compute-apps: %w", err)
	}
	index := make(map[string]int, len(devices))
	for _, d := range devices {
		index[d.UUID] = d.Index
	}
	known := procs[:0]
	for _, p := range procs {
		// A process on a GPU missing from the device list (it vanished
		// between the two queries) cannot be placed; drop it.
		if i, ok := index[p.GPUUUID]; ok {
			p.GPUIndex = i
			known = append(known, p)
		}
	}
	return Snapshot{Source: SourceSMI, Devices: devices, Processes: known}, nil
}

func (s *SMI) run(ctx context.Context, args []string) ([]byte, error) {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, s.Path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A killed nvidia-smi (a wrapper script's child) may leave its output
	// pipe open: the probe still returns at its timeout.
	cmd.WaitDelay = 100 * time.Millisecond
	if err := cmd.Run(); err != nil {
		// nvidia-smi prints its reason ("couldn't communicate with the
		// NVIDIA driver") on stdout, not stderr.
		msg := firstLine(stderr.Bytes())
		if msg == "" {
			msg = firstLine(stdout.Bytes())
		}
		return nil, fmt.Errorf("%s %s: %w: %s", s.Path, args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return string(line)
}

// ParseSMIGPUs parses the output of
// nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,memory.free --format=csv,noheader,nounits:
//
//	0, GPU-5d1f6a3e-8c2b-4f7e-9a1d-2b3c4d5e6f70, NVIDIA H100 80GB HBM3, 81559, 62071, 18934
//
// Memory is in MiB; a board that does not report memory prints "[N/A]",
// which gives a Device without HaveMemory.
func ParseSMIGPUs(out []byte) ([]Device, error) {
	var devices []Device
	for n, f := range csvLines(out) {
		if len(f) < 6 {
			return nil, fmt.Errorf("line %d: %d fields, want 6", n, len(f))
		}
		// A name containing ", " would split; it lies between uuid and the
		// three memory fields.
		name := strings.Join(f[2:len(f)-3], ", ")
		mem := f[len(f)-3:]
		index, err := strconv.Atoi(f[0])
		if err != nil || index < 0 {
			return nil, fmt.Errorf("line %d: index %q", n, f[0])
		}
		if f[1] == "" {
			return nil, fmt.Errorf("line %d: empty uuid", n)
		}
		id := strconv.Itoa(index)
		d := Device{Index: index, Vendor: gpuvendor.NVIDIA, UUID: f[1], Name: name, Visible: id, Node: id}
		var known [3]bool
		for i, dst := range []*int64{&d.Total, &d.Used, &d.Free} {
			*dst, known[i], err = parseMiB(mem[i])
			if err != nil {
				return nil, fmt.Errorf("line %d: memory: %w", n, err)
			}
		}
		d.HaveMemory = known[0] && known[1] && known[2]
		if !d.HaveMemory {
			d.Total, d.Used, d.Free = 0, 0, 0
		}
		devices = append(devices, d)
	}
	return devices, nil
}

// ParseSMIApps parses the output of
// nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits:
//
//	GPU-5d1f6a3e-8c2b-4f7e-9a1d-2b3c4d5e6f70, 31337, 61480
//
// No compute process prints nothing. A used_memory of "[N/A]" or
// "[Insufficient Permissions]" gives a Process without HaveUsed; a process
// whose pid is not shown cannot be attributed and is skipped. GPUIndex is
// left -1; the caller maps the uuid.
func ParseSMIApps(out []byte) ([]Process, error) {
	var procs []Process
	for n, f := range csvLines(out) {
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: %d fields, want 3", n, len(f))
		}
		if f[0] == "" {
			return nil, fmt.Errorf("line %d: empty gpu uuid", n)
		}
		if isNotAvailable(f[1]) {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("line %d: pid %q", n, f[1])
		}
		used, have, err := parseMiB(f[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: used_memory: %w", n, err)
		}
		procs = append(procs, Process{PID: pid, GPUIndex: -1, GPUUUID: f[0], Used: used, HaveUsed: have})
	}
	return procs, nil
}

// csvLines yields the fields of each non-empty line, numbered from 1.
// nvidia-smi's CSV never quotes, so a plain split is exact.
func csvLines(out []byte) func(yield func(int, []string) bool) {
	return func(yield func(int, []string) bool) {
		for n, line := range strings.Split(string(out), "\n") {
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			fields := strings.Split(line, ",")
			for i := range fields {
				fields[i] = strings.TrimSpace(fields[i])
			}
			if !yield(n+1, fields) {
				return
			}
		}
	}
}

// isNotAvailable reports nvidia-smi's bracketed placeholders: "[N/A]",
// "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]".
func isNotAvailable(s string) bool {
	return strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]")
}

func parseMiB(s string) (bytes int64, ok bool, err error) {
	if isNotAvailable(s) {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, false, fmt.Errorf("%q is not MiB", s)
	}
	if v > (1<<63-1)/mib {
		return 0, false, fmt.Errorf("%q MiB overflows", s)
	}
	return v * mib, true, nil
}
