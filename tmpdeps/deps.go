package tmpdeps

import (
	_ "github.com/BurntSushi/toml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/coreos/go-systemd/v22/activation"
	_ "github.com/coreos/go-systemd/v22/daemon"
	_ "github.com/coreos/go-systemd/v22/dbus"
	_ "github.com/coreos/go-systemd/v22/journal"
	_ "github.com/go-zeromq/zmq4"
	_ "github.com/godbus/dbus/v5"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/shirou/gopsutil/v4/mem"
	_ "github.com/vmihailenco/msgpack/v5"
)
