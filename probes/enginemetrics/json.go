package enginemetrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ParseSlots reads llama.cpp's GET /slots: an array of slots, each with
// is_processing (the busy flag since b4027) and next_token, whose n_decoded
// grows while the slot generates (an object, or an array of them in newer
// builds). Busy slots are Running; llama.cpp does not say here how many
// requests wait for a slot.
func ParseSlots(data []byte) (Evidence, error) {
	var slots []struct {
		IsProcessing *bool           `json:"is_processing"`
		NextToken    json.RawMessage `json:"next_token"`
	}
	if err := json.Unmarshal(data, &slots); err != nil {
		return Evidence{}, fmt.Errorf("parse slots: %w", err)
	}
	ev := Evidence{Engine: EngineLlamaCpp, Counts: true}
	for i, s := range slots {
		if s.IsProcessing == nil {
			return Evidence{}, fmt.Errorf("parse slots: slot %d has no is_processing", i)
		}
		if *s.IsProcessing {
			ev.Running++
		}
		for _, n := range decoded(s.NextToken) {
			ev.Progress += n
			ev.HaveProgress = true
		}
	}
	return ev, nil
}

// decoded reads n_decoded from a next_token object or array; it yields
// nothing when absent or malformed (progress is a bonus, not a proof).
func decoded(raw json.RawMessage) []float64 {
	type token struct {
		NDecoded *float64 `json:"n_decoded"`
	}
	var toks []token
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '{' {
		var t token
		if json.Unmarshal(raw, &t) != nil {
			return nil
		}
		toks = []token{t}
	} else if json.Unmarshal(raw, &toks) != nil {
		return nil
	}
	var out []float64
	for _, t := range toks {
		if t.NDecoded != nil {
			out = append(out, *t.NDecoded)
		}
	}
	return out
}

// ParseOllamaPS reads Ollama's GET /api/ps: {"models": [{name, model, size,
// digest, details, expires_at, size_vram, context_length}]}. Ollama
// publishes no request counts, so the Evidence has Counts false: it tells
// what Ollama holds and when it unloads it by itself, not whether it is
// idle.
func ParseOllamaPS(data []byte) (Evidence, error) {
	var ps struct {
		Models *[]struct {
			Name      string    `json:"name"`
			Model     string    `json:"model"`
			ExpiresAt time.Time `json:"expires_at"`
			SizeVRAM  int64     `json:"size_vram"`
		} `json:"models"`
	}
	if err := json.Unmarshal(data, &ps); err != nil {
		return Evidence{}, fmt.Errorf("parse ollama ps: %w", err)
	}
	if ps.Models == nil {
		return Evidence{}, errors.New("parse ollama ps: no models list")
	}
	ev := Evidence{Engine: EngineOllama, Held: []Held{}}
	for _, m := range *ps.Models {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		ev.Held = append(ev.Held, Held{Name: name, ExpiresAt: m.ExpiresAt.UTC(), SizeVRAM: m.SizeVRAM})
	}
	return ev, nil
}
