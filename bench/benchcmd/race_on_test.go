//go:build race

package benchcmd

// raceEnabled says the tests run under the race detector.
const raceEnabled = true
