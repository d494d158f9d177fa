//go:build !race

package tests

const raceBuild = false
