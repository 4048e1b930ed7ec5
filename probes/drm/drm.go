// Package drm measures the GPUs that NVIDIA's tools do not see (AMD and
// Intel) through the kernel's DRM interfaces alone: each card under
// /sys/class/drm (vendor, PCI address, render node, and the device memory
// its driver publishes) and each process's memory from /proc/PID/fdinfo of
// its open DRM file descriptors (the DRM client usage stats), with KFD's
// per-process count (/sys/class/kfd/kfd/proc) for ROCm's. No vendor tool
// or library is needed.
//
// It only reads files, under roots a test points at a recorded tree. It
// must not open a device: opening a render node creates a DRM client.
package drm

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/napd/napd/gpuvendor"
)

// Card is one DRM card with device memory of its own. Memory figures are
// bytes; Used is valid only when HaveUsed.
type Card struct {
	Name   string // "card1"
	PCI    string // PCI address, "0000:c1:00.0"
	Vendor string // a gpuvendor constant
	Driver string // "amdgpu", "xe", "i915"
	Model  string // amdgpu's product_name, else "AMD 1002:74a1"
	Render string // its render node, "renderD128" ("" when it has none)
	// ROCmIndex is the card's position among ROCm's GPU agents (the KFD
	// topology's GPU nodes, in node order: what ROCR_VISIBLE_DEVICES
	// counts), -1 when the topology does not list it.
	ROCmIndex int
	Total     int64
	Used      int64
	// HaveUsed: amdgpu publishes mem_info_vram_used. xe and i915 publish
	// no used figure, so Used is the sum of the DRM clients' device memory
	// (UsedFromClients): every process's when napd can read every
	// process's fdinfo, as root can.
	HaveUsed        bool
	UsedFromClients bool
}

// Client is one process's memory on one card: the device memory of its DRM
// clients there, each drm-client-id counted once, or, for ROCm's processes,
// what KFD counts when that is more.
type Client struct {
	PID  int
	PCI  string
	Used int64
}

// Reading is one reading of every card and every DRM client.
type Reading struct {
	Cards   []Card
	Clients []Client
}

// Probe reads the DRM cards and clients under Sys (normally "/sys") and
// Proc ("/proc").
type Probe struct {
	Sys  string
	Proc string
}

// Host is the probe of this host.
var Host = Probe{Sys: "/sys", Proc: "/proc"}

// Read reads the cards, then the clients. Cards without device memory (an
// integrated Intel GPU, a display-only card) and NVIDIA's cards (NVML and
// nvidia-smi measure those) are left out. A process that ends while it is
// read, or whose files napd may not read, is skipped.
func (p Probe) Read(ctx context.Context) (Reading, error) {
	cards, err := p.cards()
	if err != nil || len(cards) == 0 {
		return Reading{}, err
	}
	clients, err := p.clients(ctx, cards)
	if err != nil {
		return Reading{}, err
	}
	for i := range cards {
		c := &cards[i]
		if c.HaveUsed {
			continue
		}
		for _, cl := range clients {
			if cl.PCI == c.PCI {
				c.Used = addBytes(c.Used, cl.Used)
			}
		}
		c.HaveUsed, c.UsedFromClients = true, true
	}
	return Reading{Cards: cards, Clients: clients}, nil
}

// cards lists /sys/class/drm/card<N>, sorted by PCI address.
func (p Probe) cards() ([]Card, error) {
	class := filepath.Join(p.Sys, "class", "drm")
	entries, err := os.ReadDir(class)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no DRM at all
	}
	if err != nil {
		return nil, err
	}
	rocm := make(map[string]int)
	for i, n := range p.kfdNodes() {
		rocm[n.render] = i
	}
	var cards []Card
	for _, e := range entries {
		n, ok := strings.CutPrefix(e.Name(), "card")
		if _, err := strconv.Atoi(n); !ok || err != nil {
			continue // connectors (card0-DP-1), render nodes, version
		}
		c, ok, err := readCard(filepath.Join(class, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		c.ROCmIndex = -1
		if i, found := rocm[c.Render]; found && c.Vendor == gpuvendor.AMD {
			c.ROCmIndex = i
		}
		cards = append(cards, c)
	}
	slices.SortFunc(cards, func(a, b Card) int { return cmp.Compare(a.PCI, b.PCI) })
	return cards, nil
}

// readCard reads one card; ok is false for a card napd leaves out.
func readCard(dir, name string) (Card, bool, error) {
	dev := filepath.Join(dir, "device")
	uevent, err := os.ReadFile(filepath.Join(dev, "uevent"))
	if err != nil {
		return Card{}, false, nil // not a device with a driver (virtual, unbound)
	}
	kv := ueventFields(uevent)
	vendorID, productID, _ := strings.Cut(kv["PCI_ID"], ":")
	c := Card{Name: name, PCI: kv["PCI_SLOT_NAME"], Driver: kv["DRIVER"], Vendor: gpuvendor.FromPCI(vendorID)}
	if c.PCI == "" || c.Vendor == "" || c.Vendor == gpuvendor.NVIDIA {
		return Card{}, false, nil
	}
	c.Model = gpuvendor.Name(c.Vendor) + " " + strings.ToLower(vendorID+":"+productID)
	if b, err := os.ReadFile(filepath.Join(dev, "product_name")); err == nil && len(bytes.TrimSpace(b)) > 0 {
		c.Model = string(bytes.TrimSpace(b))
	}
	c.Render = renderNode(dev)
	var have bool
	switch c.Driver {
	case "amdgpu":
		// The sysfs ABI documents both as bytes.
		if c.Total, have, err = readBytes(dev, "mem_info_vram_total"); err != nil || !have {
			return Card{}, false, err
		}
		if c.Used, c.HaveUsed, err = readBytes(dev, "mem_info_vram_used"); err != nil {
			return Card{}, false, err
		}
	case "xe":
		// xe publishes each tile's VRAM (tile<N>/physical_vram_size_bytes),
		// no used figure.
		tiles, _ := filepath.Glob(filepath.Join(dev, "tile[0-9]*", "physical_vram_size_bytes"))
		for _, t := range tiles {
			v, ok, err := readBytes(filepath.Dir(t), filepath.Base(t))
			if err != nil {
				return Card{}, false, err
			}
			if ok {
				c.Total, have = addBytes(c.Total, v), true
			}
		}
	case "i915":
		// Mainline i915 publishes no VRAM size; Intel's out-of-tree i915
		// (the DKMS backport Arc cards often run) has lmem_total_bytes on
		// the card.
		c.Total, have, err = readBytes(dir, "lmem_total_bytes")
		if err != nil {
			return Card{}, false, err
		}
	}
	if !have || c.Total <= 0 {
		return Card{}, false, nil
	}
	return c, true, nil
}

// ueventFields reads KEY=VALUE lines.
func ueventFields(b []byte) map[string]string {
	kv := make(map[string]string)
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			kv[k] = v
		}
	}
	return kv
}

// renderNode is the card's render node: device/drm holds its card and its
// renderD<N> entries.
func renderNode(dev string) string {
	entries, _ := os.ReadDir(filepath.Join(dev, "drm"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "renderD") {
			return e.Name()
		}
	}
	return ""
}

// readBytes reads a sysfs file holding one decimal byte count; ok is false
// when the file is absent.
func readBytes(dir, name string) (v int64, ok bool, err error) {
	path := filepath.Join(dir, name)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	v, err = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil || v < 0 {
		return 0, false, fmt.Errorf("%s: %q is not a byte count", path, bytes.TrimSpace(b))
	}
	return v, true, nil
}

// kfdNode is one GPU node of the KFD topology
// (/sys/class/kfd/kfd/topology/nodes/<N>; CPU nodes have gpu_id 0).
type kfdNode struct {
	gpuID  string // its gpu_id, which names it under /sys/class/kfd/kfd/proc
	render string // its card's render node, "renderD128"
}

// kfdNodes lists the KFD topology's GPU nodes in node order, the order ROCm
// enumerates its agents in. Empty without KFD.
func (p Probe) kfdNodes() []kfdNode {
	dir := filepath.Join(p.Sys, "class", "kfd", "kfd", "topology", "nodes")
	entries, _ := os.ReadDir(dir)
	var nums []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	var nodes []kfdNode
	for _, n := range nums {
		node := filepath.Join(dir, strconv.Itoa(n))
		id, err := os.ReadFile(filepath.Join(node, "gpu_id"))
		gpuID := strings.TrimSpace(string(id))
		if err != nil || gpuID == "0" {
			continue
		}
		props, err := os.ReadFile(filepath.Join(node, "properties"))
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(props)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "drm_render_minor "); ok {
				nodes = append(nodes, kfdNode{gpuID: gpuID, render: "renderD" + strings.TrimSpace(v)})
			}
		}
	}
	return nodes
}

// clients reads the DRM clients of every process: the fds that point at
// /dev/dri, their fdinfo. A client seen through several fds or processes
// (same card, same drm-client-id) counts once, for the lowest PID.
func (p Probe) clients(ctx context.Context, cards []Card) ([]Client, error) {
	known := make(map[string]bool, len(cards))
	for _, c := range cards {
		known[c.PCI] = true
	}
	entries, err := os.ReadDir(p.Proc)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	type key struct {
		pci string
		id  uint64
	}
	seen := make(map[key]bool)
	per := make(map[Client]int64) // PID and PCI (Used zero) -> bytes
	var order []Client
	for _, pid := range pids {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, f := range p.drmFds(pid) {
			if !known[f.PDev] {
				continue
			}
			if f.HaveClientID {
				k := key{f.PDev, f.ClientID}
				if seen[k] {
					continue
				}
				seen[k] = true
			}
			used, ok := f.DeviceMemory()
			if !ok {
				continue
			}
			c := Client{PID: pid, PCI: f.PDev}
			if _, found := per[c]; !found {
				order = append(order, c)
			}
			per[c] = addBytes(per[c], used)
		}
	}
	// ROCm's compute memory, as KFD counts it per process: where it is
	// more than the process's DRM clients show (a kernel that keeps KFD's
	// allocations out of fdinfo), it is the figure. The larger of the two
	// never counts memory twice.
	for c, used := range p.kfdUsage(cards) {
		if _, found := per[c]; !found {
			order = append(order, c)
		}
		per[c] = max(per[c], used)
	}
	slices.SortFunc(order, func(a, b Client) int { return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.PCI, b.PCI)) })
	for i := range order {
		order[i].Used = per[order[i]]
	}
	return order, nil
}

// kfdUsage reads /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id> (bytes), per
// process and card: the VRAM ROCm's processes allocated through /dev/kfd.
func (p Probe) kfdUsage(cards []Card) map[Client]int64 {
	byRender := make(map[string]string, len(cards))
	for _, c := range cards {
		byRender[c.Render] = c.PCI
	}
	pci := make(map[string]string) // gpu_id -> PCI address
	for _, n := range p.kfdNodes() {
		if a, ok := byRender[n.render]; ok {
			pci[n.gpuID] = a
		}
	}
	dir := filepath.Join(p.Sys, "class", "kfd", "kfd", "proc")
	procs, _ := os.ReadDir(dir)
	out := make(map[Client]int64)
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, e.Name(), "vram_*"))
		for _, f := range files {
			a, ok := pci[strings.TrimPrefix(filepath.Base(f), "vram_")]
			if !ok {
				continue
			}
			// KFD lists every GPU for each of its processes: 0 is none.
			if v, ok, err := readBytes(filepath.Dir(f), filepath.Base(f)); err == nil && ok && v > 0 {
				out[Client{PID: pid, PCI: a}] += v
			}
		}
	}
	return out
}

// drmFds parses the fdinfo of a process's fds open on /dev/dri, skipping
// what cannot be read: the process ended, or napd may not look.
func (p Probe) drmFds(pid int) []Fdinfo {
	dir := filepath.Join(p.Proc, strconv.Itoa(pid))
	fds, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		return nil
	}
	var out []Fdinfo
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
		if err != nil || !strings.HasPrefix(target, "/dev/dri/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "fdinfo", fd.Name()))
		if err != nil {
			continue
		}
		if f, ok, err := ParseFdinfo(b); err == nil && ok {
			out = append(out, f)
		}
	}
	return out
}
