package main

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The stock Go proxy: net/http's server, httputil.ReverseProxy and
// net/http's Transport, nothing else. Run beside nginx and napd, it shows
// which part of napd's cost is Go's HTTP stack and which is napd's own.

// runGoProxy serves the stock Go proxy on listen, to target.
func runGoProxy(listen, target string) error {
	u, err := url.Parse(target)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024}
	return http.ListenAndServe(listen, rp)
}

// goProxy is the stock Go proxy running as this program with -goproxy.
type goProxy struct {
	addr string
	cmd  *exec.Cmd
}

// startGoProxy runs this program as the stock Go proxy to the engine on
// enginePort and waits until it answers.
func startGoProxy(enginePort int) (*goProxy, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	p := &goProxy{addr: "127.0.0.1:" + strconv.Itoa(ports[0])}
	p.cmd = exec.Command(self, "-goproxy", p.addr, "-target", fmt.Sprintf("http://127.0.0.1:%d", enginePort))
	var log strings.Builder
	p.cmd.Stdout, p.cmd.Stderr = &log, &log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + p.addr + "/health"); err == nil {
			resp.Body.Close()
			return p, nil
		}
	}
	p.stop()
	return nil, fmt.Errorf("the Go proxy did not answer on %s: %s", p.addr, log.String())
}

func (p *goProxy) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}
