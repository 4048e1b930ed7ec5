package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// TestFloor_EngineClosesAfterAnswer: an engine that ends its connection
// after each answer (as llama-server does after 100) leaves the floor's
// client connection open; the floor dials again for the next request.
func TestFloor_EngineClosesAfterAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan int, 10)
	go func() {
		for i := 1; ; i++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- i
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				body, _ := io.ReadAll(req.Body)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			}()
		}
	}()
	client, floor := net.Pipe()
	go floorConn(floor, l.Addr().String())
	defer client.Close()
	r := bufio.NewReader(client)
	for i := range 3 {
		body := fmt.Sprintf("request %d", i)
		req, _ := http.NewRequest(http.MethodPost, "http://engine/v1/completions", strings.NewReader(body))
		go func() { _ = req.Write(client) }()
		resp, err := http.ReadResponse(r, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != body {
			t.Fatalf("request %d: answer %q, %v; want %q", i, got, err, body)
		}
	}
	if n := len(accepted); n != 3 {
		t.Errorf("the engine accepted %d connections, want 3 (one per answer)", n)
	}
}
