package wire

import "fmt"

// The protocol versions this build speaks. Bump MaxVersion when a change
// needs both sides to agree; raise MinVersion when an old one is dropped.
const (
	MinVersion uint32 = 1
	MaxVersion uint32 = 1
)

// Range is the protocol versions one side speaks, inclusive.
type Range struct{ Min, Max uint32 }

// Local is the range this build speaks.
var Local = Range{Min: MinVersion, Max: MaxVersion}

func (r Range) String() string {
	if r.Min == r.Max {
		return fmt.Sprint(r.Min)
	}
	return fmt.Sprintf("%d–%d", r.Min, r.Max)
}

// VersionError is a handshake between sides with no protocol in common. Its
// message names both ranges and which side to upgrade.
type VersionError struct {
	Local, Remote         Range
	LocalName, RemoteName string // "napd", "worker"
}

func (e *VersionError) Error() string {
	older := e.RemoteName
	if e.Remote.Max > e.Local.Max {
		older = e.LocalName
	}
	return fmt.Sprintf("%s speaks protocol %s, %s speaks %s: upgrade %s",
		e.RemoteName, e.Remote, e.LocalName, e.Local, older)
}

// Negotiate returns the highest version both ranges hold, or a
// *VersionError naming localName and remoteName.
func Negotiate(local, remote Range, localName, remoteName string) (uint32, error) {
	lo, hi := max(local.Min, remote.Min), min(local.Max, remote.Max)
	if remote.Min > remote.Max || lo > hi {
		return 0, &VersionError{Local: local, Remote: remote, LocalName: localName, RemoteName: remoteName}
	}
	return hi, nil
}
