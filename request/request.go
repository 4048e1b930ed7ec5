// Package request is the vocabulary the gateway and the agent's core share
// about a client request: what kind of request it is. It sits below both
// (it imports nothing of napd), so the gateway, which classifies requests,
// and the lease tracker and metrics, which count them, depend on it
// downward instead of the gateway importing a package of the agent.
package request

// Kind classifies a request by its API route.
type Kind string

// Request kinds.
const (
	Chat       Kind = "chat"       // /v1/chat/completions, /v1/messages
	Completion Kind = "completion" // /v1/completions
	Embedding  Kind = "embedding"  // /v1/embeddings
	Other      Kind = "other"      // any other route
)
