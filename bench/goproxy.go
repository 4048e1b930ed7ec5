package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
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

// Two Go proxies run beside nginx and napd, to show which part of napd's
// cost is Go's and which is napd's own:
//
//   - the stock Go proxy: net/http's server, httputil.ReverseProxy and
//     net/http's Transport, nothing else;
//   - the Go floor: the least a Go program can do to forward HTTP/1.1 on
//     Go's netpoller: one goroutine per client connection with a
//     keep-alive engine connection of its own, heads passed on unread,
//     bodies by Content-Length. No routing, limits, headers or errors: not
//     a proxy anyone should run, but what the Go runtime and the kernel
//     cost for the same two reads and two writes per request.

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

// runFloor serves the Go floor on listen, to the engine at target
// (host:port), until listening fails.
func runFloor(listen, target string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go floorConn(c, target)
	}
}

// floorConn forwards c's requests one at a time to an engine connection
// of its own until either side closes; an engine that closes its
// connection after an answer (llama-server does after 100) gets a new one.
func floorConn(c net.Conn, target string) {
	defer c.Close()
	var e net.Conn
	defer func() {
		if e != nil {
			e.Close()
		}
	}()
	cr := bufio.NewReader(c)
	var er *bufio.Reader
	var req, ans []byte
	var err error
	for {
		if req, _, err = floorMessage(cr, req); err != nil {
			return
		}
		if e == nil {
			if e, err = net.Dial("tcp", target); err != nil {
				return
			}
			er = bufio.NewReader(e)
		}
		if _, err = e.Write(req); err != nil {
			return
		}
		var closing bool
		if ans, closing, err = floorMessage(er, ans); err != nil {
			return
		}
		if _, err = c.Write(ans); err != nil {
			return
		}
		if closing {
			e.Close()
			e = nil
		}
	}
}

// floorMessage reads one HTTP/1.1 message with a Content-Length body (or
// none) from r into buf, head and body together; closing: its head says
// "Connection: close".
func floorMessage(r *bufio.Reader, buf []byte) (msg []byte, closing bool, err error) {
	buf = buf[:0]
	length := 0
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return nil, false, err
		}
		buf = append(buf, line...)
		if len(line) <= 2 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		switch value = bytes.TrimSpace(value); {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return nil, false, err
			}
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	head := len(buf)
	buf = append(buf, make([]byte, length)...)
	_, err = io.ReadFull(r, buf[head:])
	return buf, closing, err
}

// goProxy is one of the Go proxies running as this program.
type goProxy struct {
	addr string
	cmd  *exec.Cmd
}

// startGoProxy runs this program as the stock Go proxy to the engine on
// enginePort and waits until it answers.
func startGoProxy(enginePort int) (*goProxy, error) {
	return startProxy("-goproxy", fmt.Sprintf("http://127.0.0.1:%d", enginePort))
}

// startFloor runs this program as the Go floor to the engine on
// enginePort, its Go code on as many CPUs as napd's (Go's default, from
// the CPUs it may use), and waits until it answers.
func startFloor(enginePort int) (*goProxy, error) {
	return startProxy("-floor", fmt.Sprintf("127.0.0.1:%d", enginePort))
}

// startProxy runs this program with mode (-goproxy, -floor) to target
// and env, and waits until it answers.
func startProxy(mode, target string, env ...string) (*goProxy, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	p := &goProxy{addr: "127.0.0.1:" + strconv.Itoa(ports[0])}
	p.cmd = exec.Command(self, mode, p.addr, "-target", target)
	p.cmd.Env = append(os.Environ(), env...)
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
	return nil, fmt.Errorf("%s did not answer on %s: %s", mode, p.addr, log.String())
}

func (p *goProxy) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}
