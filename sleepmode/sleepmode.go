// Package sleepmode names the sleep strategies a model may use (the `sleep`
// key of a model's config). These constants are their one spelling in
// napd: the config parser accepts them, the planner chooses among them and
// the supervisor implements them. It sits below all three and imports
// nothing; what a strategy does is the supervisor's business, not this
// package's.
package sleepmode

// Sleep strategies.
const (
	Stop   = "stop"    // stop the engine; a wake starts it again
	VLLML1 = "vllm-l1" // vLLM sleep mode level 1 (weights offloaded to host memory)
	VLLML2 = "vllm-l2" // vLLM sleep mode level 2 (weights discarded)
	SGLang = "sglang"  // SGLang release/resume memory occupation
	// LlamaCpp is llama.cpp's own idle sleep (llama-server
	// --sleep-idle-seconds): the engine frees its weights by itself and
	// reloads them on its next task; a sleep napd itself asks for stops it.
	LlamaCpp = "llamacpp"
	None     = "none" // never put to sleep
)
