package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/coreos/go-systemd/v22/activation"
)

// Socket names napd.socket gives its listeners (FileDescriptorName=).
const (
	// SocketGateway names the shared gateway socket(s).
	SocketGateway = "gateway"
	// SocketModelPrefix starts the name of a model's dedicated socket:
	// "model-<name>".
	SocketModelPrefix = "model-"
)

// Listeners returns the gateway's listeners and one per model with a
// dedicated `listen` (modelListen maps model name to address).
//
// Under socket activation (LISTEN_FDS for this process) it serves the
// inherited sockets: those named "gateway", and "model-<name>" for each
// model in modelListen; a missing gateway socket, a socket for a model
// without `listen`, a model with `listen` but no socket, or any other name
// is an error, and activated is true. The variables are unset so engines
// started later do not inherit them. Otherwise it binds gatewayListen and
// each model's address itself (TCP "host:port").
//
// Inherited sockets belong to systemd: on reload keep serving them, and
// never unlink them.
func Listeners(gatewayListen []string, modelListen map[string]string) (gateway []net.Listener, models map[string]net.Listener, activated bool, err error) {
	if os.Getenv("LISTEN_FDS") != "" && os.Getenv("LISTEN_PID") == strconv.Itoa(os.Getpid()) {
		gateway, models, err = inherited(modelListen)
		return gateway, models, true, err
	}
	// Variables meant for another process (a parent's): not ours to use or pass on.
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		_ = os.Unsetenv(v)
	}
	gateway, models, err = bind(gatewayListen, modelListen)
	return gateway, models, false, err
}

func inherited(modelListen map[string]string) ([]net.Listener, map[string]net.Listener, error) {
	byName, err := activation.ListenersWithNames()
	if err != nil {
		return nil, nil, fmt.Errorf("socket activation: %w", err)
	}
	var all []net.Listener
	for _, ls := range byName {
		all = append(all, ls...)
		for _, l := range ls {
			// Inherited sockets outlive napd: closing must never unlink them.
			if ul, ok := l.(*net.UnixListener); ok {
				ul.SetUnlinkOnClose(false)
			}
		}
	}
	fail := func(format string, a ...any) ([]net.Listener, map[string]net.Listener, error) {
		closeAll(all)
		return nil, nil, fmt.Errorf("socket activation: "+format, a...)
	}
	gateway := byName[SocketGateway]
	if len(gateway) == 0 {
		return fail("no listening socket named %q among %s (FileDescriptorName= in napd.socket)", SocketGateway, names(byName))
	}
	models := map[string]net.Listener{}
	for name, ls := range byName {
		if name == SocketGateway {
			continue
		}
		model, ok := strings.CutPrefix(name, SocketModelPrefix)
		if !ok {
			return fail("unexpected socket %q: want %q or %q<model>", name, SocketGateway, SocketModelPrefix)
		}
		if _, ok := modelListen[model]; !ok {
			return fail("socket %q is for model %q, which has no `listen` in the config", name, model)
		}
		if len(ls) != 1 {
			return fail("%d sockets named %q, want one", len(ls), name)
		}
		models[model] = ls[0]
	}
	for model := range modelListen {
		if _, ok := models[model]; !ok {
			return fail("model %q has listen = %q but napd.socket passes no socket named %q", model, modelListen[model], SocketModelPrefix+model)
		}
	}
	return gateway, models, nil
}

func bind(gatewayListen []string, modelListen map[string]string) ([]net.Listener, map[string]net.Listener, error) {
	if len(gatewayListen) == 0 {
		return nil, nil, errors.New("gateway listen: no address")
	}
	var opened []net.Listener
	listen := func(addr string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll(opened)
			return nil, err
		}
		opened = append(opened, l)
		return l, nil
	}
	var gateway []net.Listener
	for _, addr := range gatewayListen {
		l, err := listen(addr)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway listen %q: %w", addr, err)
		}
		gateway = append(gateway, l)
	}
	models := map[string]net.Listener{}
	for model, addr := range modelListen {
		l, err := listen(addr)
		if err != nil {
			return nil, nil, fmt.Errorf("model %s listen %q: %w", model, addr, err)
		}
		models[model] = l
	}
	return gateway, models, nil
}

func closeAll(ls []net.Listener) {
	for _, l := range ls {
		_ = l.Close()
	}
}

func names(byName map[string][]net.Listener) string {
	var ns []string
	for n := range byName {
		ns = append(ns, strconv.Quote(n))
	}
	if len(ns) == 0 {
		return "no sockets"
	}
	sort.Strings(ns)
	return strings.Join(ns, ", ")
}
