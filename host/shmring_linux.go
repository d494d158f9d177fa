package host

import "syscall"

// populated maps a ring shared and builds its page tables at once.
const populated = syscall.MAP_SHARED | syscall.MAP_POPULATE
