package main

// slotPair is the --slot and --to-slot flags of a command that reads one
// slot's state and puts it into another, the same slot unless told.
type slotPair struct {
	fs           *flagSet
	slot, toSlot *int
}

// addSlotPair registers --slot and --to-slot on fs, so that the commands that
// move a state between slots spell and check them alike.
func addSlotPair(fs *flagSet, toSlotUsage string) *slotPair {
	return &slotPair{fs: fs, slot: slotFlag(fs), toSlot: fs.Int("to-slot", -1, toSlotUsage)}
}

// parse parses args, runs check on the command's own flags, then resolves the
// source and destination slot keys, so usage errors come in one order.
func (p *slotPair) parse(args []string, check func() error) (srcKey, dstKey string, err error) {
	if _, err := p.fs.parse(args, 0, ""); err != nil {
		return "", "", err
	}
	if err := check(); err != nil {
		return "", "", err
	}
	if srcKey, err = requireSlot(p.fs, *p.slot); err != nil {
		return "", "", err
	}
	if !p.fs.isSet("to-slot") {
		*p.toSlot = *p.slot
	}
	if dstKey, err = slotKey(p.fs, "--to-slot", *p.toSlot); err != nil {
		return "", "", err
	}
	return srcKey, dstKey, nil
}
