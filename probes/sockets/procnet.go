//go:build linux

package sockets

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// ParseProcNet parses /proc/net/tcp (v6 false) or /proc/net/tcp6 (v6 true):
// a header line, then one socket a line,
//
//	sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode …
//
// (net/ipv4/tcp_ipv4.c get_tcp4_sock). An address is the raw network-order
// word(s) printed as host-order hex (x86: 0100007F is 127.0.0.1), the port
// host-order hex. Blank lines are skipped; any other malformed line is an
// error naming it.
func ParseProcNet(data []byte, v6 bool) ([]Socket, error) {
	var out []Socket
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 512), 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if n == 1 && strings.HasPrefix(line, "sl") || line == "" {
			continue
		}
		s, err := parseProcNetLine(line, v6)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseProcNetLine(line string, v6 bool) (Socket, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return Socket{}, fmt.Errorf("want at least 10 fields, got %d", len(f))
	}
	local, err := parseAddrPort(f[1], v6)
	if err != nil {
		return Socket{}, fmt.Errorf("local address: %w", err)
	}
	remote, err := parseAddrPort(f[2], v6)
	if err != nil {
		return Socket{}, fmt.Errorf("remote address: %w", err)
	}
	st, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return Socket{}, fmt.Errorf("state %q: %w", f[3], err)
	}
	uid, err := strconv.ParseUint(f[7], 10, 32)
	if err != nil {
		return Socket{}, fmt.Errorf("uid %q: %w", f[7], err)
	}
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return Socket{}, fmt.Errorf("inode %q: %w", f[9], err)
	}
	return Socket{Local: local, Remote: remote, State: uint8(st), UID: uint32(uid), Inode: inode}, nil
}

// parseAddrPort reads "0100007F:1F90". Each 32-bit word of the address was
// printed as a host-order number: its bytes are put back in host order.
func parseAddrPort(s string, v6 bool) (netip.AddrPort, error) {
	addrHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q: want ADDR:PORT", s)
	}
	size := 4
	if v6 {
		size = 16
	}
	if len(addrHex) != 2*size {
		return netip.AddrPort{}, fmt.Errorf("%q: want %d hex digits of address", s, 2*size)
	}
	raw := make([]byte, size)
	for i := 0; i < size; i += 4 {
		w, err := strconv.ParseUint(addrHex[2*i:2*i+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
		}
		binary.NativeEndian.PutUint32(raw[i:], uint32(w))
	}
	if len(portHex) != 4 {
		return netip.AddrPort{}, fmt.Errorf("%q: want 4 hex digits of port", s)
	}
	pb, err := hex.DecodeString(portHex)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), binary.BigEndian.Uint16(pb)), nil
}
