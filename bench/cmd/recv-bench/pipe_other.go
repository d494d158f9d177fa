//go:build !linux

package main

import "errors"

func parsePipeVariant(v variant) (variant, error) {
	return v, errors.New("pipe variants need Linux's splice(2)")
}

func (v variant) pipeReceiver() (receiver, error) {
	return nil, errors.New("pipe variants need Linux's splice(2)")
}
