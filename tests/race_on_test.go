//go:build race

package tests

// raceBuild: this test binary runs under the race detector, so the engine,
// plugin and hydractl it starts are built with it too.
const raceBuild = true
