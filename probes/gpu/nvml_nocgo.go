//go:build !cgo

package gpu

import "errors"

// noNVML is what a build without cgo has: go-nvml needs cgo to dlopen the
// library, so such a build always falls back to nvidia-smi.
type noNVML struct{}

func systemNVML() NVML { return noNVML{} }

var errNoCgo = errors.New("napd was built without cgo")

func (noNVML) Init() error                    { return errNoCgo }
func (noNVML) Shutdown() error                { return errNoCgo }
func (noNVML) DeviceCount() (int, error)      { return 0, errNoCgo }
func (noNVML) Device(int) (NVMLDevice, error) { return nil, errNoCgo }
