package gateway

// glob matches name against pattern: '*' is any run of characters
// (including '/', which model names such as org/model and engine paths
// contain), '?' one character, everything else itself. Used by the API
// keys' model patterns and the engine path rules.
func glob(pattern, name string) bool {
	// Iterative matching with backtracking to the last star: linear in
	// practice, never exponential.
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == name[n]):
			p++
			n++
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case star >= 0:
			p = star + 1
			mark++
			n = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
