package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
)

// isAnthropicPath reports whether path is one of Anthropic's Messages
// routes, whose clients read errors in Anthropic's shape.
func isAnthropicPath(path string) bool {
	return path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/")
}

// anthropicError is Anthropic's error body:
// {"type":"error","error":{"type":…,"message":…},"request_id":"req_…"}.
type anthropicError struct {
	Type      string          `json:"type"`
	Error     anthropicDetail `json:"error"`
	RequestID string          `json:"request_id"`
}

type anthropicDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicType names the error type Anthropic's SDKs expect for status.
func anthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// failAnthropic writes an error in Anthropic's shape, with its request id
// also in the request-id header, where the SDKs look for it.
func (c *call) failAnthropic(status int, msg string) {
	var b [12]byte
	_, _ = rand.Read(b[:])
	id := "req_napd_" + hex.EncodeToString(b[:])
	c.w.Header().Set("Request-Id", id)
	c.writeValue(status, anthropicError{Type: "error", Error: anthropicDetail{Type: anthropicType(status), Message: msg}, RequestID: id})
}
