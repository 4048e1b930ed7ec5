//go:build race

package chaos

// Under the race detector everything runs several times slower: the chaos
// run sends fewer requests.
func init() { raceEnabled = true }
