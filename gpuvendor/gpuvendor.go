// Package gpuvendor names the GPU vendors napd tells apart. These constants
// are their one spelling in napd: the probes set them on each device, the
// supervisor picks the engine's visibility variables and container device
// flags by them, status and metrics show them. It imports nothing.
package gpuvendor

import "strings"

// Vendors.
const (
	NVIDIA = "nvidia"
	AMD    = "amd"
	Intel  = "intel"
)

// FromPCI is the vendor of a PCI vendor ID as sysfs and uevent write it
// ("0x1002", "1002"): "" for a vendor napd does not know.
func FromPCI(id string) string {
	switch strings.ToLower(strings.TrimPrefix(strings.TrimSpace(id), "0x")) {
	case "10de":
		return NVIDIA
	case "1002":
		return AMD
	case "8086":
		return Intel
	}
	return ""
}

// Name is how status writes a vendor: "NVIDIA", "AMD", "Intel".
func Name(vendor string) string {
	switch vendor {
	case NVIDIA:
		return "NVIDIA"
	case AMD:
		return "AMD"
	case Intel:
		return "Intel"
	}
	return vendor
}
